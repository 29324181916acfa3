"""What the runtime uses of the system services above it, as narrow typed protocols: the services
implement them and are handed to the runtime when they are built (``lattica/services.py``), so the
core never imports a service and never looks one up by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from lattica._identity import PeerId
    from lattica._runtime.refs import ActorRef
    from lattica.content._cid import Cid

__all__ = ["Names", "MembershipView", "Blocks"]


class Names(Protocol):
    """Named actors, mesh-wide (the DHT service)."""

    def register_name(self, name: str, ref: ActorRef) -> None:
        """Publish ``name`` -> ``ref`` and keep it fresh until unregistered."""

    def unregister_name(self, name: str) -> None:
        """Stop keeping ``name`` published."""

    async def resolve_name(self, name: str, within: float = 0.0) -> ActorRef:
        """The live actor registered as ``name`` (ActorNotFound if none)."""


class MembershipView(Protocol):
    """Who is up, as the membership service sees the mesh."""

    def state_of(self, peer: PeerId) -> str | None:
        """``peer``'s state in the view ("alive", "suspect", "dead", "left"), None if not in it."""

    def nodes(self) -> list[dict[str, Any]]:
        """The view placement chooses from: one row per member, ourselves first."""


class Blocks(Protocol):
    """Where call arguments and answers over the message cap go (the content service)."""

    def keep(self, data: bytes | memoryview) -> Cid:
        """Store ``data`` (any thread) for a peer to fetch by CID, until dropped."""

    def drop(self, root: Cid) -> None:
        """Release one ``keep`` of ``root`` (any thread)."""

    async def take(self, root: Cid, source: PeerId, max_size: int) -> bytearray:
        """Exactly ``max_size`` bytes of ``root``, fetched from ``source``."""

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on a worker thread of the service."""
