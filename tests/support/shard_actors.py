"""Actors the shard tests serve (importable as ``shard_actors`` in this process and in child
node processes, which admit ``shard_actors.*``)."""

from __future__ import annotations

import asyncio
import os

import lattica


@lattica.actor
class Stage:
    """A pure stage: ``forward(x) = x * k + b``; ``who()`` says which process served."""

    def __init__(self, k: int, b: int = 0) -> None:
        self.k, self.b = k, b

    def forward(self, x):
        return x * self.k + self.b

    def who(self) -> int:
        return os.getpid()

    async def slow(self, x, seconds: float):
        await asyncio.sleep(seconds)
        return x * self.k + self.b

    def boom(self) -> None:
        raise ValueError("the method's own error")

    async def count(self, n: int, every: float = 0.0):
        """``n`` items ``[pid, i * k]``, ``every`` seconds apart (a streaming method)."""
        for i in range(n):
            if every:
                await asyncio.sleep(every)
            yield [os.getpid(), i * self.k]

    async def count_then_boom(self, n: int):
        for i in range(n):
            yield i
        raise ValueError("the stream's own error")
