"""Stable-ref following: a call through a stable ref whose actor went away (a supervised child
restarted elsewhere) is sent on to the next incarnation, which its supervisor locates; an
idempotent call whose path broke is sent once more; and what the membership view says of a peer."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from lattica._identity import PeerId
from lattica._runtime.client import Pending, call_finished
from lattica._runtime.limits import FOLLOW_FOR
from lattica._runtime.refs import ActorRef
from lattica.errors import (
    ActorNotFound,
    ActorRestarted,
    LatticaError,
    PeerUnreachable,
)
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._future import Future
    from lattica._host import Host
    from lattica._runtime.local import LocalActor
    from lattica._runtime.ports import MembershipView, Names

log = get_logger("lattica.runtime")

_LOCATE_TIMEOUT = 2.0  # one question to a stable ref's supervisor (asked again until FOLLOW_FOR)


class Following:
    """The part of the :class:`~lattica._runtime.registry.Runtime` that follows stable refs (a base
    class: it works on the runtime's own channels, actors and calls)."""

    if TYPE_CHECKING:  # what the runtime provides
        host: Host
        loop: asyncio.AbstractEventLoop
        peer_id: PeerId
        actors: dict[str, LocalActor]
        names: Names | None
        membership: MembershipView | None

        def submit(self, p: Pending, block: bool) -> None: ...

        def fail_call(self, p: Pending, error: BaseException, cancel_local: bool = False) -> None: ...

        def call(self, ref: ActorRef, method: str, args: tuple, kwargs: dict, *, timeout: float | None) -> Future: ...

    def follow(self, p: Pending, error: BaseException, delivered: bool) -> bool:
        """A call through a stable ref found its actor gone. Start following the actor (resolve
        its name again); re-send the call if it never reached the actor, or if the caller said it
        is idempotent (for up to ``FOLLOW_FOR`` s), else fail it with ActorRestarted. False: not
        a stable ref's call."""
        ref = p.ref
        if not ref.stable or self.host.closing or call_finished(p):
            return False
        self._start_following(ref)
        now = time.monotonic()
        if p.follow_until is None:
            p.follow_until = now + FOLLOW_FOR
        if (not delivered or p.idempotent) and p.stream is None and now < p.follow_until:
            if p.timer is not None:
                p.timer.cancel()
                p.timer = None
            p.channel = None
            self.submit(p, True)  # held until the name resolves again
            return True
        if delivered:
            error = ActorRestarted(
                f"{ref.name}.{p.msg.method} was in flight when the actor went away ({error}); the ref follows its next incarnation"
            )
        p.channel = None
        self.fail_call(p, error)
        return True

    def resend(self, p: Pending, error: BaseException) -> bool:
        """An idempotent call whose path to the actor's node broke (its relay died, say) is sent
        once more, over a new channel: the next path (another relay, a direct connection). False:
        not such a call, or already re-sent once."""
        if (
            not p.idempotent
            or p.stream is not None
            or p.follow_until is not None
            or not isinstance(error, PeerUnreachable)
        ):
            return False
        if self.host.closing or call_finished(p) or self.node_down(p.ref.peer_id):
            return False
        p.follow_until = time.monotonic()  # marks it re-sent
        if p.timer is not None:
            p.timer.cancel()
            p.timer = None
        p.channel = None
        p.delivered = False
        self.submit(p, True)
        return True

    def _start_following(self, ref: ActorRef) -> None:
        spawn = ref._spawn
        if spawn is not None and not spawn.done():
            return  # already following
        fut = self.loop.create_future()
        ref._spawn = fut
        self.host.spawn(self._find_again(ref, fut))

    async def _find_again(self, ref: ActorRef, fut: asyncio.Future) -> None:
        """Resolve ``ref``'s name until it names an actor on a node not known to be down."""
        deadline = self.loop.time() + FOLLOW_FOR
        delay = 0.05
        while True:
            await asyncio.sleep(delay)  # (its supervisor needs a moment; so does a refused dial)
            found: ActorRef | None = None
            local = self.actors.get(ref.name)
            if local is not None and local.state in ("starting", "running"):
                found = local.ref
            else:
                try:
                    async with asyncio.timeout(max(0.1, deadline - self.loop.time())):
                        found = await self._locate(ref)
                except (LatticaError, TimeoutError):
                    found = None
            if found is not None and found.name == ref.name and not self.node_down(found.peer_id):
                ref.peer_id = found.peer_id
                fut.set_result(ref)
                return
            if self.loop.time() >= deadline:
                fut.set_exception(ActorNotFound(f"{ref.name!r} did not come back within {FOLLOW_FOR:.0f} s"))
                fut.exception()
                return
            delay = min(delay * 2, 0.5)

    async def _locate(self, ref: ActorRef) -> ActorRef | None:
        """Where ``ref``'s actor runs now: its supervisor says (a call that itself follows the
        supervisor, if that is supervised too); a stable ref with no supervisor resolves its name
        in the DHT (members' registrations only)."""
        if ref.supervisor is None:
            return await self.names.resolve_name(ref.name) if self.names is not None else None
        found = await self.call(ref.supervisor, "locate", (ref.name,), {}, timeout=_LOCATE_TIMEOUT)
        return found if isinstance(found, ActorRef) else None

    def node_down(self, peer: PeerId) -> bool:
        """Membership holds ``peer`` suspect or dead."""
        state = self._node_state(peer)
        return state is not None and state != "alive"

    def node_alive(self, peer: PeerId) -> bool:
        """Membership holds ``peer`` alive (a member of our mesh: it admits members' statements only)."""
        return self._node_state(peer) == "alive"

    def node_gone(self, peer: PeerId) -> bool:
        """Membership holds ``peer`` dead or departed (a suspect may still answer)."""
        return self._node_state(peer) in ("dead", "left")

    def _node_state(self, peer: PeerId) -> str | None:
        if self.membership is None or peer == self.peer_id:
            return None
        return self.membership.state_of(peer)
