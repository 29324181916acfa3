"""Actor classes for the tests of call semantics (mailboxes, failures, async methods, streaming
calls, the allow-list: tests/integration/test_mailboxes.py and its neighbours).

Importable as ``call_actors``; nodes admit them with the allow-list pattern ``"call_actors.*"``.
As in ``sample_actors``, tests observe what happens inside actors through token-keyed module state:
``event(token)`` is a ``threading.Event``, ``COUNTS[token]`` a counter, ``RECORDS[token]`` a list.

``subprocess`` is imported here on purpose: a spawn of ``call_actors.subprocess.Popen`` (or of
``call_actors:subprocess.Popen``) must not get past the allow-list to a non-actor class.
"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import threading

import lattica

# The allow-list bypass test tries to reach subprocess.Popen through this module's namespace.
REACHABLE = subprocess.Popen

_lock = threading.Lock()
_events: dict[str, threading.Event] = {}
COUNTS: dict[str, int] = collections.defaultdict(int)
RECORDS: dict[str, list] = collections.defaultdict(list)


def event(token: str) -> threading.Event:
    with _lock:
        ev = _events.get(token)
        if ev is None:
            ev = _events[token] = threading.Event()
        return ev


def record(token: str, value) -> None:
    with _lock:
        RECORDS[token].append(value)


def bump(token: str) -> None:
    with _lock:
        COUNTS[token] += 1


async def _poll(token: str, limit: float) -> bool:
    """Wait (on the node loop, without blocking it) until ``event(token)`` is set."""
    ev = event(token)
    loop = asyncio.get_running_loop()
    end = loop.time() + limit
    while not ev.is_set():
        if loop.time() > end:
            return False
        await asyncio.sleep(0.005)
    return True


@lattica.actor
class Probe:
    """Async and sync methods that hang, block, raise odd exceptions or use asyncio structure."""

    def __init__(self) -> None:
        self.ready: asyncio.Future | None = None
        self.seen: dict[str, object] = {}

    # -- plain answers ----------------------------------------------------------------------------

    def ping(self) -> str:
        return "pong"

    async def aping(self) -> str:
        return "pong"

    async def quick(self, i: int) -> int:
        return i

    def squick(self, i: int) -> int:
        return i

    # -- never returning / blocking -------------------------------------------------------------

    async def forever(self, token: str) -> None:
        """Never returns; counts its starts in COUNTS[token]."""
        bump(token)
        await asyncio.sleep(30)

    async def hold(self, token: str, limit: float = 10.0) -> str:
        """Holds an async slot until ``event(token)`` is set (polling; counts starts)."""
        bump(token + ":started")
        return "opened" if await _poll(token, limit) else "limit"

    # -- odd exceptions ---------------------------------------------------------------------------

    def bad_decode(self) -> str:
        return b"\xff".decode()

    async def abad_decode(self) -> str:
        return b"\xff".decode()

    def group(self) -> None:
        raise ExceptionGroup("g", [ValueError("x")])

    async def agroup(self) -> None:
        raise ExceptionGroup("g", [ValueError("x")])

    # -- asyncio structure inside methods ---------------------------------------------------------

    async def with_timeout(self) -> str:
        try:
            async with asyncio.timeout(0.05):
                await asyncio.sleep(1)
        except TimeoutError:
            return "timed-out"
        return "not-timed-out"

    async def task_group(self) -> list:
        async def child(i: int) -> int:
            await asyncio.sleep(0.01 * i)
            return i * 10

        async with asyncio.TaskGroup() as tg:
            a = tg.create_task(child(1))
            b = tg.create_task(child(2))
        return [a.result(), b.result()]

    async def task_probe(self, key: str, delay: float) -> bool:
        t = asyncio.current_task()
        self.seen[key] = t
        await asyncio.sleep(delay)
        return t is not None

    async def tasks_distinct(self, a: str, b: str) -> list:
        ta, tb = self.seen.get(a), self.seen.get(b)
        return [ta is not None, tb is not None, ta is not tb]

    # -- a future shared by several calls -------------------------------------------------------

    async def make_ready(self) -> None:
        self.ready = asyncio.get_running_loop().create_future()

    async def wait_ready(self):
        return await self.ready

    async def set_ready(self, value) -> None:
        self.ready.set_result(value)


@lattica.actor
class Gens:
    """Generator methods that count what they produce and record when they are closed."""

    def ping(self) -> str:
        return "pong"

    async def aping(self) -> str:
        return "pong"

    def gen(self, token: str, n: int):
        try:
            for i in range(n):
                bump(token)
                yield i
        finally:
            event(token + ":closed").set()

    async def agen(self, token: str, n: int):
        try:
            for i in range(n):
                bump(token)
                yield i
                await asyncio.sleep(0)
        finally:
            event(token + ":closed").set()

    async def total(self, items) -> int:
        s = 0
        async for x in items:
            s += x
        return s


@lattica.actor
class Nobody:
    """Spawned under the name ``nobody`` after tells were sent to that name."""

    async def f(self) -> str:
        return "f"


@lattica.actor
class WithOnStop:
    """Has an on_stop hook: a lifecycle hook, never a remotely callable method."""

    def __init__(self, token: str) -> None:
        self.token = token

    def ping(self) -> str:
        return "pong"

    def on_stop(self) -> None:
        record(self.token, "on_stop")


class Plain:
    """Not decorated with @lattica.actor: under the allowed prefix, yet not spawnable."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def ping(self) -> str:
        return "pong"


@lattica.actor
class Manager:
    """Finds and kills other actors from inside async methods (on the node loop)."""

    async def find(self, name: str, node: str | None = None) -> lattica.ActorRef:
        return await lattica.aget_actor(name, node=node)

    async def stop(self, ref: lattica.ActorRef) -> str:
        await lattica.akill(ref)
        return "killed"
