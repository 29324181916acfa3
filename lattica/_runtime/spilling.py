"""The runtime's side of spilling (lattica._runtime.spill): a call or answer over the message cap
stores its big values in this node's content store and sends their CIDs; the receiver fetches
them from the sender before the method runs or the caller sees the answer. What a caller stored
goes when its call is over; what a callee stored for an answer goes after ``KEEP_ANSWERS``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lattica._runtime.spill import DEFAULT_SPILL_LIMIT, Spilled, placeholders, restore, spill
from lattica.errors import ContentError, FrameTooLarge, LatticaError
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._identity import PeerId
    from lattica._runtime.ports import Blocks
    from lattica._runtime.registry import Runtime
    from lattica.content._cid import Cid

__all__ = ["Spills", "KEEP_ANSWERS", "KEEP_TELLS"]

log = get_logger("lattica.runtime")

KEEP_ANSWERS = 120.0  # seconds a spilled answer stays for its caller to fetch
KEEP_TELLS = 600.0  # seconds a spilled fire-and-forget call's values stay (no answer says when it ran)


class Spills:
    """One node's spilled values: stored for peers, and fetched from them."""

    def __init__(self, rt: Runtime, limit: int = DEFAULT_SPILL_LIMIT) -> None:
        self.rt = rt
        self.limit = limit

    def content_for(self, why: FrameTooLarge) -> Blocks:
        """The content service that holds spilled values, or ``why`` raised (none: no spilling)."""
        content = self.rt.blocks
        if content is None or self.limit <= 0:
            raise why
        return content

    # -- sending ------------------------------------------------------------------------------

    def spill_now(self, msg: list, why: FrameTooLarge) -> list[Cid]:
        """Spill a CALL's arguments here and now (a caller's own thread, as Ray's ``.remote()``
        puts its big arguments): ``msg`` is rewritten; the CIDs stored. ``why`` is raised when
        nothing can be spilled."""
        content = self.content_for(why)
        roots: list[Cid] = []
        try:
            (msg[4], msg[5]), _ = spill([msg[4], msg[5]], _keeper(content, roots), self.limit)
        except (LatticaError, ValueError) as e:
            self.release(roots)
            raise FrameTooLarge(f"{why} (nor could its big values travel by CID: {e})") from None
        return roots

    async def spill_call(self, msg: list, why: FrameTooLarge) -> list[Cid]:
        """``spill_now`` from the node loop: the storing runs on a worker thread."""
        content = self.content_for(why)
        return await content.in_thread(self.spill_now, msg, why)

    async def spill_answer(self, value: Any, why: FrameTooLarge) -> Any:
        """An answer's value with its big values stored (on a worker thread) for the caller to
        fetch; they go after KEEP_ANSWERS."""
        content = self.content_for(why)
        roots: list[Cid] = []
        try:
            out, _ = await content.in_thread(spill, value, _keeper(content, roots), self.limit)
        except (LatticaError, ValueError) as e:
            self.release(roots)
            raise FrameTooLarge(f"{why} (nor could its big values travel by CID: {e})") from None
        self.release_later(roots, KEEP_ANSWERS)
        return out

    def release(self, roots: list[Cid]) -> None:
        """What was stored for a call that is over goes (on a worker thread)."""
        content = self.rt.blocks
        if content is None or not roots:
            return
        for root in roots:
            self.rt.host.spawn(_quietly(content.in_thread(content.drop, root)))

    def release_later(self, roots: list[Cid], seconds: float) -> None:
        if roots:
            self.rt.loop.call_later(seconds, self.release, roots)

    # -- receiving ----------------------------------------------------------------------------

    async def fetch(self, value: Any, source: PeerId) -> Any:
        """``value`` with its placeholders replaced by their objects, fetched from ``source``
        (verified against their CIDs). LatticaError when they cannot be (too big for this node's
        spill_limit, no content service, a fetch that fails)."""
        from lattica.content._cid import Cid  # (only a node that receives spilled values parses their CIDs)

        found = placeholders(value)
        if not found:
            return value
        content = self.rt.blocks
        if content is None:
            raise ContentError("this node runs no content service: values that travel by CID cannot reach it")
        total = sum(s.size for s in found)
        if total > self.limit:
            raise ContentError(
                f"{total} bytes travel by CID with this message, more than this node's spill_limit of {self.limit}"
            )

        async def one(s: Spilled) -> Any:
            try:
                data = await content.take(Cid.parse(s.cid), source, max_size=s.size)
                return s.rebuild(data)
            except ValueError as e:
                raise ContentError(str(e)) from None

        objects = await asyncio.gather(*(one(s) for s in found))
        return restore(value, {id(s): o for s, o in zip(found, objects)})


def _keeper(content: Blocks, roots: list[Cid]) -> Callable[[Any], str]:
    """What ``spill`` stores a value with: kept in ``content``, its root noted in ``roots``."""

    def put(data: Any) -> str:
        root = content.keep(data)
        roots.append(root)
        return str(root)

    return put


async def _quietly(job: Any) -> None:
    try:
        await job
    except Exception:  # (the node is closing, or it was dropped already)
        log.debug("spilled value not dropped", exc_info=True)
