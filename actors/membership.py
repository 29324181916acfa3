"""The ``membership`` system actor: runs ``lattica._membership`` on the node loop.

Peers become members when identified; heartbeats and gossip are ``gossip`` tells to their
``membership`` actors, sent only over connections that exist (membership never dials: it would
turn the mesh into a full mesh, and AutoNAT would stop trusting dial-backs from everyone we
dialed). When a peer's connection is lost (not closed on purpose), it is redialed over TCP at
once (a few quick tries): refused at every address, the process is gone and the member is dead
now; failing otherwise, the member is suspected right away instead of after the detector's
silence. A node that stops says goodbye first.

What each member says about itself: ``cpu`` (cores), ``memory`` (bytes), ``gpus`` (from
``CUDA_VISIBLE_DEVICES``, or ``nvidia-smi -L`` when present), user ``labels``, and ``load``
(user actors; refreshed every few seconds).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lattica._identity import PeerId
from lattica._membership import (
    ALIVE,
    MAX_ADDRS,
    MAX_ALLOW,
    Member,
    MemberChanged,
    MemberDown,
    Membership,
    MembershipConfig,
    MemberUp,
    SelfDowned,
)
from lattica._multiaddr import Multiaddr
from lattica._runtime import ASYNC, ActorRef, current_caller
from lattica.errors import LatticaError, PeerGone, PeerUnreachable
from lattica.logging import get_logger
from lattica.trust import MemberNotary

if TYPE_CHECKING:
    from lattica._hostview import HostView
    from lattica._identify import PeerInfo
    from lattica._runtime.calls import Calls
    from lattica.transports.base import Connection

log = get_logger("lattica.membership")

__all__ = ["MembershipActor", "MembershipService", "membership_ref", "detect_resources"]

_LOAD_EVERY = 5.0  # seconds between refreshes of our load in the gossip
_REDIAL_TIMEOUT = 1.0
_REDIAL_TRIES = 3
_REDIAL_PAUSE = 0.05


def membership_ref(peer: PeerId) -> ActorRef:
    return ActorRef(peer, "membership", {"gossip": ASYNC, "view": ASYNC})


def detect_resources() -> dict[str, Any]:
    """What this machine offers: cpu cores, memory bytes, gpus (0 when none are detectable)."""
    cpu = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 0
    gpus = 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    else:
        try:  # no nvidia-smi on the PATH: OSError at once
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=5).stdout
            gpus = sum(1 for line in out.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            gpus = 0
    return {"cpu": cpu, "memory": memory, "gpus": gpus}


class MembershipService:
    """The node's membership view, kept up on the loop."""

    def __init__(
        self,
        runtime: Calls,
        config: MembershipConfig | None = None,
        labels: dict[str, str] | None = None,
        resources: dict[str, float] | None = None,
        accept_code: str = "admins",
        allow: list[str] | None = None,
        reserved: Callable[[], dict[str, float]] = dict,
    ) -> None:
        self.rt = runtime
        self._reserved = reserved  # what the spawner holds for its placed actors, gossiped as load
        self.host: HostView = runtime.host
        self.resources = {**detect_resources(), **(resources or {})}
        self.labels = dict(labels or {})
        # what this node runs, for placement to skip it when it cannot: whose code, which installed classes
        self.code = {"accept": accept_code, "allow": list(allow or ())[:MAX_ALLOW]}
        self._notary = MemberNotary(self.host.keypair, self.host.trust)
        self.core = Membership(str(self.host.peer_id), self._info(), config, notary=self._notary)
        self.core.reachable = self._connected
        self.on_down: list[Callable[[Member, str], None]] = []  # told of every MemberDown
        self.on_self_downed: list[Callable[[], None]] = []  # told when the mesh declared us dead
        self.host.events.identified.subscribe(self._on_identify)
        self.host.events.disconnected.subscribe(self._on_disconnect)
        self.host.events.addresses_changed.subscribe(lambda addrs: self.load_changed())
        self._next_load = 0.0  # when our load (and addresses) are next re-read and, if changed, gossiped
        self._task = self.host.spawn(self._run())

    def _connected(self, member_id: str) -> bool:
        try:
            conn = self.host.conns.get(PeerId.from_string(member_id))
        except LatticaError:
            return False
        return conn is not None and not conn.is_closed

    def _info(self) -> dict:
        actors = sum(1 for a in self.rt.actors.values() if not a.system)
        load: dict[str, Any] = {"actors": actors}
        reserved = self._reserved()
        if reserved:
            load["reserved"] = reserved
        # where we can be dialed: members that met only through a node that is gone still reach
        # each other (membership never dials, but calls between members do)
        addrs = [str(a) for a in self.host.advertised_addrs()][:MAX_ADDRS]
        return {**self.resources, "labels": self.labels, "load": load, "addrs": addrs, "code": self.code}

    def load_changed(self) -> None:
        """Our load changed (a reservation came or went): gossip it at the next round."""
        self._next_load = 0.0

    def _now(self) -> float:
        return self.host.loop.time()

    async def _run(self) -> None:
        interval = self.core.cfg.interval
        while True:
            await asyncio.sleep(interval)
            now = self._now()
            if now >= self._next_load:
                self._next_load = now + _LOAD_EVERY
                info = self._info()
                if info != self.core.me.info:
                    self.core.update_info(info)
            self._feed_traffic()
            out, events = self.core.tick(now)
            self._send(out)
            self._emit(events)

    def _feed_traffic(self) -> None:
        """Any bytes a watched member sent count as a sign of life: a heartbeat can wait behind
        a large transfer on the same connection, and the member is plainly not dead."""
        for mid in self.core.watched():
            try:
                conns = self.host.conns_of.get(PeerId.from_string(mid), ())
            except LatticaError:
                continue
            last = max((c.last_received or float("-inf") for c in conns if not c.is_closed), default=None)
            if last is not None and last > float("-inf"):
                self.core.heard(last, mid)

    def _send(self, out: list[tuple[str, dict]]) -> None:
        for to, msg in out:
            if not self._connected(to):
                continue  # never dial for membership (see the module docstring)
            try:
                self.rt.call(membership_ref(PeerId.from_string(to)), "gossip", (msg,), {}, timeout=None, tell=True)
            except LatticaError as e:
                log.debug("gossip not sent", peer=to, reason=str(e))

    def receive(self, sender: PeerId, msg: Any) -> None:
        self._emit(self.core.receive(self._now(), str(sender), msg))

    def _emit(self, events: list) -> None:
        for ev in events:
            if isinstance(ev, (MemberUp, MemberChanged)):
                self._learn_addrs(ev.member)
            self.host.events.membership_changed.emit(ev)
            if isinstance(ev, SelfDowned):
                log.warning("the mesh declared this node dead; rejoining", incarnation=ev.incarnation)
                for cb in list(self.on_self_downed):
                    try:
                        cb()
                    except Exception:
                        log.exception("self-downed listener failed")
                continue
            if isinstance(ev, MemberDown):
                log.info("member down", peer=ev.member.id, reason=ev.reason)
                for down_cb in list(self.on_down):
                    try:
                        down_cb(ev.member, ev.reason)
                    except Exception:
                        log.exception("member-down listener failed", peer=ev.member.id)

    def _learn_addrs(self, member: Member) -> None:
        """Put the addresses a member gave in the address book (a dial still checks its key)."""
        addrs = member.info.get("addrs") if type(member.info) is dict else None
        if not addrs or member.id == self.core.me.id:
            return
        try:
            peer = PeerId.from_string(member.id)
            parsed = [Multiaddr(a) for a in addrs[:MAX_ADDRS]]
        except (LatticaError, ValueError):
            return
        self.host.remember_addrs(peer, [a for a in parsed if a.peer_id in (None, peer)])

    def _on_identify(self, info: PeerInfo) -> None:
        if info.circle == "stranger":
            return  # only members of our mesh share the membership view
        m = self.core.get(str(info.peer_id))
        if m is None:
            self._emit(self.core.add(self._now(), str(info.peer_id)))

    def _on_disconnect(self, peer: PeerId, conn: Connection) -> None:
        # a connection closed on purpose (Node.disconnect, idle close, the peer stopping) is left
        # closed; only a lost one is worth a redial, whose failure is evidence the peer is gone
        if conn.ended_cleanly:  # (the event comes when a peer's last connection closed)
            self._emit(self.core.link_closed(str(peer)))
            return
        m = self.core.get(str(peer))
        if m is not None and m.state == ALIVE and not self.host.closing:
            self.host.spawn(self._redial(peer))

    async def _redial(self, peer: PeerId) -> None:
        # TCP only, from an ephemeral port: a QUIC dial would leave from our listening socket and
        # AutoNAT would then stop trusting dial-backs from that peer's address
        tcp = [a for a in self.host.peer_addrs.get(peer, ()) if not a.is_circuit and a.protocols()[1:] == ["tcp"]]
        if not tcp:
            return  # nothing cheap to try: the detector decides
        try:
            async with asyncio.timeout(_REDIAL_TIMEOUT):
                for attempt in range(_REDIAL_TRIES):
                    try:
                        await self.host.dial_addrs(peer, tcp)
                        return
                    except PeerGone:
                        raise
                    except PeerUnreachable:
                        # a process being killed can still accept one connection, then reset it
                        # during the handshake: the next try is refused outright
                        if attempt == _REDIAL_TRIES - 1:
                            raise
                        await asyncio.sleep(_REDIAL_PAUSE)
        except PeerGone as e:  # lost, and nothing listens where it did: the process is gone
            log.debug("lost member refused the redial", peer=str(peer), reason=str(e))
            self._emit(self.core.declare_dead(self._now(), str(peer), "connection lost and redial refused"))
        except (TimeoutError, LatticaError) as e:
            log.debug("lost member not redialed", peer=str(peer), reason=str(e) or "timeout")
            self._emit(self.core.suspect(self._now(), str(peer)))

    def leave(self) -> None:
        """Say goodbye to every member we are connected to (before those connections close)."""
        bye = self.core.leave()
        self._send([(m.id, bye) for m in self.core.alive() if self._connected(m.id)])

    def state_of(self, peer: PeerId) -> str | None:
        """``peer``'s state in our view ("alive", "suspect", "dead", "left"), None if not in it."""
        member = self.core.get(str(peer))
        return member.state if member is not None else None

    def nodes(self) -> list[dict]:
        """Our view, ourselves first: one dict per member (``admin``: its certificates make it
        an administrator of our mesh, as checked here, whatever its info says)."""
        rows = []
        for m in [self.core.me, *self.core.members.values()]:
            rows.append(
                {
                    "peer_id": m.id,
                    "state": m.state,
                    "incarnation": m.incarnation,
                    **m.info,
                    "admin": self._notary.administers(m.id, m.proof),
                }
            )
        return rows

    def close(self) -> None:
        self._task.cancel()


class MembershipActor:
    """What peers call: ``gossip`` (heartbeats and rumors, as tells) and ``view``."""

    NAME = "membership"

    def __init__(self, service: MembershipService) -> None:
        self._svc = service

    async def gossip(self, msg: Any) -> None:
        caller = current_caller()
        if caller is not None:
            self._svc.receive(caller, msg)

    async def view(self) -> list:
        return self._svc.nodes()
