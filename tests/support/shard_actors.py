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
