"""The node's side of code that travels: whose packages it runs, and the packages it has loaded.

A spawn of a class this node cannot import brings a ticket (a package's CID signed by the driver).
``CodeLibrary.actor_class`` checks the ticket against the node's ``accept_code`` setting, fetches
the package through the content plane (verified block by block against its CID, capped), loads it
in a namespace of its own and returns the class. Loaded packages are kept by CID while an actor
uses one; the spawner says when an actor ends, and a package no actor uses is unloaded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from lattica._code.tickets import MAX_BYTES, Ticket
from lattica._identity import PeerId
from lattica.errors import CodeError, PermissionDenied
from lattica.logging import get_logger
from lattica.trust import Trust

if TYPE_CHECKING:
    from lattica._code.loader import Namespace

__all__ = ["ACCEPT", "CodeLibrary", "refusal"]

log = get_logger("lattica.code")

ACCEPT = ("admins", "members", "nobody")  # whose code a node runs (``Node(accept_code=...)``)
MAX_LOADING = 8  # distinct packages a node fetches at once


def refusal(accept: str, circle: str, admin: bool) -> str | None:
    """Why a node with setting ``accept`` does not run code from a sender it judges so (None: it does)."""
    if circle == "self":
        return None
    if accept == "nobody":
        return "it runs no code that travels (accept_code='nobody'; `lattica node --accept-code`)"
    if circle == "stranger":
        return "it never runs a stranger's code"
    if accept == "admins" and not admin:
        return "it runs code only from administrators of its mesh (accept_code='admins'; `lattica node --accept-code members` to take members' code too)"
    return None


class CodeLibrary:
    """Packages loaded on one node, by CID, with the actors that use each."""

    def __init__(
        self,
        me: PeerId,
        trust: Trust,
        accept: str,
        fetch: Callable[[str, int, PeerId], Awaitable[bytes]],
        max_bytes: int = MAX_BYTES,
    ) -> None:
        if accept not in ACCEPT:
            raise ValueError(f"accept_code must be one of {ACCEPT}, not {accept!r}")
        self.me = me
        self.trust = trust
        self.accept = accept
        self.max_bytes = max_bytes
        self._fetch = fetch
        self.loaded: dict[str, Namespace] = {}
        self._loading: dict[str, asyncio.Future] = {}
        self._used_by: dict[str, str] = {}  # actor name -> the CID of its package
        self._spawning: dict[str, int] = {}  # CID -> spawns with it in progress (it stays loaded for them)

    def check(
        self, ticket: Ticket, caller: PeerId | None = None, caller_circle: str = "self", caller_admin: bool = True
    ) -> None:
        """PermissionDenied unless this node runs code from the ticket's sender, asked for by
        ``caller`` (judged by the same setting: a ticket is a name anyone who saw it can repeat,
        so who asks to run the code now counts as much as who wrote it)."""
        if caller is not None and caller != self.me:
            why = refusal(self.accept, caller_circle, caller_admin)
            if why is not None:
                raise PermissionDenied(f"{self.me} refuses to run code that {caller} ({caller_circle}) asks for: {why}")
        if not ticket.verify():
            raise PermissionDenied(f"the code ticket for {ticket.cid} is not signed by {ticket.sender}")
        verdict = self.trust.judge(ticket.sender, list(ticket.certificates), time.time())
        why = refusal(self.accept, verdict.circle, verdict.admin)
        if why is not None:
            raise PermissionDenied(
                f"{self.me} refuses code from {ticket.sender} ({verdict.circle}: {verdict.why}): {why}"
            )

    async def actor_class(self, path: str, ticket: Ticket) -> type:
        """The class at ``path`` in the ticket's package (checked with ``check`` first). The
        package's modules are imported on a worker thread: a slow import must not stall the
        node's loop (its heartbeats, its other calls)."""
        namespace = self.loaded.get(ticket.cid)
        if namespace is None:
            namespace = await self._load(ticket)
        return await asyncio.to_thread(namespace.actor_class, path)

    async def _load(self, ticket: Ticket) -> Namespace:
        loading = self._loading.get(ticket.cid)
        if loading is None:
            if len(self._loading) >= MAX_LOADING:
                raise CodeError(f"{self.me} is fetching {MAX_LOADING} code packages already: try again in a moment")
            loading = self._loading[ticket.cid] = asyncio.get_running_loop().create_future()
            # (the loader, packer and script parser load with the first package)
            from lattica._code.loader import Namespace
            from lattica._code.package import unpack  # (likewise)

            try:
                data = await self._fetch(ticket.cid, self.max_bytes + (1 << 20), ticket.sender)
                namespace = Namespace(ticket, unpack(data, self.max_bytes))
                namespace.install()
                self.loaded[ticket.cid] = namespace
                log.info(
                    "code package loaded",
                    cid=ticket.cid,
                    sender=str(ticket.sender),
                    files=len(namespace.package.files),
                    bytes=namespace.package.size,
                )
                loading.set_result(namespace)
            except BaseException as e:
                error = (
                    e
                    if isinstance(e, (CodeError, PermissionDenied, asyncio.CancelledError))
                    else CodeError(f"the code package {ticket.cid} could not be fetched: {e}")
                )
                loading.set_exception(error)
                loading.exception()
                raise error from None
            finally:
                del self._loading[ticket.cid]
        return await asyncio.shield(loading)

    def spawning(self, cid: str, delta: int) -> None:
        """A spawn with package ``cid`` starts (+1) or ends (-1): while any is in progress the
        package is not unloaded under it (another spawn of it may fail meanwhile)."""
        left = self._spawning.get(cid, 0) + delta
        if left > 0:
            self._spawning[cid] = left
        else:
            self._spawning.pop(cid, None)

    def use(self, actor: str, cid: str) -> None:
        """Actor ``actor`` runs a class of package ``cid`` (it stays loaded until every user ends)."""
        namespace = self.loaded.get(cid)
        if namespace is not None:
            namespace.users += 1
            self._used_by[actor] = cid

    def release(self, actor: str) -> None:
        cid = self._used_by.pop(actor, None)
        namespace = self.loaded.get(cid) if cid is not None else None
        if cid is not None and namespace is not None:
            namespace.users -= 1
            self.unload_unused(cid)

    def unload_unused(self, cid: str) -> None:
        """Unload package ``cid`` if no actor uses it (one whose spawn failed, or whose last actor ended)."""
        namespace = self.loaded.get(cid)
        if namespace is not None and namespace.users <= 0 and not self._spawning.get(cid):
            del self.loaded[cid]
            namespace.unload()
            log.info("code package unloaded", cid=cid)

    def sender_of(self, actor: str) -> PeerId | None:
        """Who sent the code actor ``actor`` runs (None: installed code)."""
        cid = self._used_by.get(actor)
        namespace = self.loaded.get(cid) if cid is not None else None
        return namespace.ticket.sender if namespace is not None else None

    def close(self) -> None:
        for namespace in self.loaded.values():
            namespace.unload()
        self.loaded.clear()
        self._used_by.clear()
