"""Actors the path-change tests call across a connection that goes away (tests/integration/
test_path_changes.py): a log that checks each caller's calls arrive in the order they were made,
and a slow stream."""

from __future__ import annotations

import asyncio

import lattica


@lattica.actor
class OrderLog:
    """Remembers, per caller, the last sequence number that arrived; a call arriving out of
    order is counted (async methods start in mailbox order, so this sees arrival order)."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self.out_of_order: list[tuple[str, int, int]] = []
        self.calls = 0

    async def put(self, who: str, seq: int, delay: float = 0.0, blob: bytes = b"") -> int:
        last = self.last.get(who, -1)
        if seq <= last:
            self.out_of_order.append((who, last, seq))
        self.last[who] = max(seq, last)
        self.calls += 1
        if delay:
            await asyncio.sleep(delay)
        return seq

    async def report(self) -> dict:
        return {"calls": self.calls, "out_of_order": self.out_of_order}

    async def ticks(self, n: int, every: float):
        for i in range(n):
            await asyncio.sleep(every)
            yield i
