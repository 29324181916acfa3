"""Eager tasks for Python 3.11: what ``asyncio.Task(..., eager_start=True)`` does on 3.12+.

An actor method runs inside its own Task (so ``asyncio.current_task()``, ``asyncio.timeout`` and
TaskGroups behave), but its first step runs at once instead of on the next loop iteration; most
short methods finish in that step, which saves a loop round per call. Python 3.12's implementation
is mirrored: the pure-Python Task takes its first step immediately, with the loop's current task
swapped out around it. Private asyncio names used here (checked on CPython 3.11):
``asyncio.tasks._PyTask`` and ``asyncio.tasks._current_tasks``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

__all__ = ["eager_task"]


class _StepNow:
    """Stands in for the loop during Task.__init__ only, to run the first step immediately."""

    __slots__ = ("loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def call_soon(self, callback: Any, *args: Any, context: Any = None) -> None:
        task = callback.__self__
        task._loop = self.loop  # from here on the task belongs to the real loop
        current = asyncio.tasks._current_tasks  # type: ignore[attr-defined]
        previous = current.pop(self.loop, None)
        try:
            if context is not None:
                context.run(callback, *args)
            else:
                callback(*args)
        finally:
            if previous is not None:
                current[self.loop] = previous

    def get_debug(self) -> bool:
        return self.loop.get_debug()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loop, name)


if sys.version_info < (3, 12):

    class _EagerTask(asyncio.tasks._PyTask):  # type: ignore[name-defined]
        def __init__(self, coro: Any, loop: asyncio.AbstractEventLoop) -> None:
            super().__init__(coro, loop=_StepNow(loop))
            self._loop = loop

    def eager_task(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task:
        return _EagerTask(coro, loop)

else:

    def eager_task(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task:
        return asyncio.Task(coro, loop=loop, eager_start=True)
