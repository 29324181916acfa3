"""What a system service may use of the runtime: :class:`Calls`, the narrow typed view services are
written against (the :class:`~lattica._runtime.registry.Runtime` implements it), beside
:class:`lattica._hostview.HostView` for the host. A service knows from these two modules everything
the node offers it; the runtime can change inside without touching them."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

if TYPE_CHECKING:
    from lattica._future import Future
    from lattica._hostview import HostView
    from lattica._identity import PeerId
    from lattica._metrics import Histogram
    from lattica._monitors import Monitors
    from lattica._runtime.local import EndedActor, LocalActor
    from lattica._runtime.partials import PartialMessages
    from lattica._runtime.ports import MembershipView
    from lattica._runtime.refs import ActorRef

__all__ = ["Calls"]


class Calls(Protocol):
    """The runtime as a service sees it: this node's actors, calls to any actor, and what the
    membership view says of peers. Everything here runs on the node loop."""

    peer_id: PeerId
    loop: asyncio.AbstractEventLoop
    actors: dict[str, LocalActor]  # this node's actors, by name
    monitors: Monitors  # watchers of actors, here and on other nodes
    membership: MembershipView | None  # who is up (None: the node runs without membership)
    ended: collections.deque[EndedActor]  # user actors that ended lately (the dashboard's)
    call_latency: Histogram  # seconds from a call's creation to its answer
    stop_listeners: list[Callable[[str, str], None]]  # told (actor name, reason) when one of ours ends
    partials: PartialMessages  # the node's budget for partly received messages (actor calls, Bitswap)

    @property
    def host(self) -> HostView:
        """The node's host, as services see it."""

    @overload
    def call(
        self,
        ref: ActorRef,
        method: str,
        args: tuple,
        kwargs: dict,
        *,
        timeout: float | None,
        tell: Literal[False] = False,
        stream: None = None,
        block: bool = True,
        idempotent: bool = False,
    ) -> Future: ...

    @overload
    def call(
        self,
        ref: ActorRef,
        method: str,
        args: tuple,
        kwargs: dict,
        *,
        timeout: float | None,
        tell: bool = False,
        stream: Any = None,
        block: bool = True,
        idempotent: bool = False,
    ) -> Future | None: ...

    def create(
        self,
        cls: type,
        args: list,
        kwargs: dict | None,
        name: str | None,
        *,
        max_concurrency: int = ...,
        window: int = ...,
        instance: Any = None,
        publish: bool = False,
        state: Any = ...,
        public: Iterable[str] | bool | None = None,
    ) -> LocalActor:
        """Make an actor on this node."""

    def allows(self, path: str) -> bool:
        """Whether peers may spawn the installed class at ``path`` here."""

    def resolve_class(self, path: str) -> type:
        """The installed class at ``path`` (SpawnError if it is not allowed)."""

    def unsent_to(self, peer: PeerId) -> int:
        """Bytes of calls queued to ``peer`` and not yet written."""

    def node_down(self, peer: PeerId) -> bool:
        """Membership holds ``peer`` suspect or dead."""

    def node_alive(self, peer: PeerId) -> bool:
        """Membership holds ``peer`` alive."""

    def node_gone(self, peer: PeerId) -> bool:
        """Membership holds ``peer`` dead or departed."""
