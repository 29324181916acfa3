"""Actor classes the actor-runtime tests spawn (importable as ``sample_actors`` so a node's
allow-list ``["sample_actors.*"]`` admits them, in this process and in child processes).

Tests observe what happens inside actors through module-level, token-keyed state: each test passes
a fresh token, so tests never see each other's records. ``event(token)`` is a ``threading.Event``
(safe to set from the node loop, an actor thread or the test thread).
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time

import numpy as np

import lattica

_lock = threading.Lock()
_events: dict[str, threading.Event] = {}
RECORDS: dict[str, list] = collections.defaultdict(list)  # token -> what happened, in order
COUNTS: dict[str, int] = collections.defaultdict(int)  # token -> a counter (produced / consumed)
STOPPED: list[str] = []  # tokens of actors whose on_stop hook ran


def event(token: str) -> threading.Event:
    with _lock:
        ev = _events.get(token)
        if ev is None:
            ev = _events[token] = threading.Event()
        return ev


def record(token: str, value) -> None:
    with _lock:
        RECORDS[token].append(value)


_LOCK = threading.Lock()


class CustomError(Exception):
    """Not a built-in: the caller gets a plain RemoteError naming this type."""


@lattica.actor
class Counter:
    """Sync and async methods over one piece of state."""

    def __init__(self, start: int = 0) -> None:
        self.value = start
        self.items: list = []

    def incr(self, n: int = 1) -> int:
        self.value += n
        return self.value

    async def aincr(self, n: int = 1) -> int:
        self.value += n
        return self.value

    def get(self) -> int:
        return self.value

    def append(self, i) -> int:
        self.items.append(i)
        return len(self.items)

    async def aappend(self, i) -> int:
        self.items.append(i)
        return len(self.items)

    async def aitems_list(self) -> list:
        return list(self.items)

    def items_list(self) -> list:
        return list(self.items)

    def wait_gate(self, token: str, limit: float = 10.0) -> str:
        """Blocks this actor's thread until ``event(token)`` is set (at most ``limit`` s)."""
        record(token, "started")
        return "opened" if event(token).wait(limit) else "limit"

    def add(self, a: int, b: int) -> int:
        return a + b

    def echo(self, x):
        return x

    async def aecho(self, x):
        return x


@lattica.actor
class Threads:
    """Reports which thread each kind of method runs on."""

    async def loop_thread(self) -> int:
        return threading.get_ident()

    def sync_thread(self) -> int:
        return threading.get_ident()

    async def loop_thread_after_await(self) -> int:
        await asyncio.sleep(0.001)
        return threading.get_ident()


@lattica.actor
class Worker:
    """Slow, blocking, never-returning and failing methods."""

    async def slow(self, t: float) -> float:
        await asyncio.sleep(t)
        return t

    async def forever(self, token: str) -> None:
        """Never returns; records 'cancelled' when its task is cancelled."""
        event(token + ":started").set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            record(token, "cancelled")
            event(token + ":cancelled").set()
            raise

    def busy(self, token: str, t: float) -> int:
        """Blocks its thread for ``t`` s, recording when it entered and left."""
        record(token, ("enter", time.monotonic(), threading.get_ident()))
        time.sleep(t)
        record(token, ("exit", time.monotonic(), threading.get_ident()))
        return threading.get_ident()

    def wait_gate(self, token: str, limit: float = 10.0) -> str:
        """Blocks until ``event(token)`` is set (at most ``limit`` s)."""
        record(token, "started")
        ok = event(token).wait(limit)
        return "opened" if ok else "limit"

    def raise_value(self, msg: str) -> None:
        raise ValueError(msg)  # RAISE_VALUE_LINE

    async def araise_key(self, key: str) -> None:
        await asyncio.sleep(0)
        raise KeyError(key)

    def raise_custom(self, msg: str) -> None:
        raise CustomError(msg)

    def two_args(self, a, b):
        return [a, b]

    def ping(self) -> str:
        return "pong"

    async def aping(self) -> str:
        return "pong"

    def returns_lock(self):
        return _LOCK  # a live object: the codec refuses it


@lattica.actor
class Streamer:
    """Generator methods, and methods consuming a client stream."""

    async def agen(self, n: int):
        for i in range(n):
            yield i

    def gen(self, n: int):
        for i in range(n):
            yield i * 10

    async def agen_fail(self, n: int):
        for i in range(n):
            yield i
        raise ValueError("stream broke")

    async def produce(self, token: str, n: int):
        """Counts how many items it has handed over (COUNTS[token])."""
        for i in range(n):
            COUNTS[token] += 1
            yield i

    async def blobs(self, token: str, n: int, size: int):
        """``n`` items of ``size`` bytes, counted as they are handed over (COUNTS[token])."""
        for i in range(n):
            COUNTS[token] += 1
            yield bytes(size)

    def sync_produce(self, token: str, n: int):
        for i in range(n):
            COUNTS[token] += 1
            yield i

    async def produce_forever(self, token: str):
        i = 0
        try:
            while True:
                yield i
                i += 1
                await asyncio.sleep(0.001)
        except (asyncio.CancelledError, GeneratorExit):
            event(token + ":stopped").set()
            raise

    async def total(self, items) -> int:
        s = 0
        async for x in items:
            s += x
        return s

    async def slow_total(self, items, token: str, delay: float) -> int:
        """Consumes the client stream slowly, counting what it has taken (COUNTS[token])."""
        s = 0
        async for x in items:
            COUNTS[token] += 1
            s += x
            await asyncio.sleep(delay)
        return s

    async def guarded_total(self, items, token: str) -> int:
        """Sums a client stream; records 'cancelled' if its call is cancelled while it waits."""
        event(token + ":started").set()
        s = 0
        try:
            async for x in items:
                s += x
        except asyncio.CancelledError:
            record(token, "cancelled")
            event(token + ":cancelled").set()
            raise
        return s

    async def collect(self, items) -> list:
        return [x async for x in items]

    async def both(self, a, b) -> list:
        """Takes two client streams in turns; how many items each had."""
        counts, its, done = [0, 0], [a.__aiter__(), b.__aiter__()], [False, False]
        while not all(done):
            for k in (0, 1):
                if not done[k]:
                    try:
                        await its[k].__anext__()
                        counts[k] += 1
                    except StopAsyncIteration:
                        done[k] = True
        return counts

    async def first_only(self, items):
        """Returns the first item of a client stream and leaves the rest."""
        async for x in items:
            return x
        return None


@lattica.actor
class Numeric:
    """numpy arrays as arguments and results."""

    def __init__(self) -> None:
        self.kept = None

    def matmul(self, a, b):
        return a @ b

    def echo(self, x):
        return x

    async def aecho(self, x):
        return x

    def keep(self, x) -> int:
        self.kept = x
        return id(x)

    def kept_id(self) -> int:
        return id(self.kept)

    def checksum(self, x) -> list:
        return [float(x.sum()), list(x.shape), str(x.dtype)]

    def make(self, n: int, seed: int):
        return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


@lattica.actor
class Stoppable:
    """Records its on_stop hook (in STOPPED and, if given, a file)."""

    def __init__(self, token: str, path: str | None = None) -> None:
        self.token = token
        self.path = path

    def ping(self) -> str:
        return "pong"

    def wait_gate(self, token: str, limit: float = 10.0) -> str:
        record(token, "started")
        ok = event(token).wait(limit)
        return "opened" if ok else "limit"

    async def forever(self, token: str | None = None) -> None:
        if token is not None:
            event(token + ":started").set()
        await asyncio.Event().wait()

    def on_stop(self) -> None:
        STOPPED.append(self.token)
        if self.path:
            with open(self.path, "a") as f:
                f.write(f"stopped {self.token}\n")


@lattica.actor
class AsyncStoppable:
    """Only async methods (no actor thread) with an async on_stop hook."""

    def __init__(self, token: str) -> None:
        self.token = token

    async def ping(self) -> str:
        return "pong"

    async def on_stop(self) -> None:
        await asyncio.sleep(0)
        STOPPED.append(self.token)


@lattica.actor
class BadInit:
    def __init__(self, why: str = "boom in init", delay: float = 0.0, token: str | None = None) -> None:
        time.sleep(delay)
        if token is not None:
            event(token).set()
        raise RuntimeError(why)

    def ping(self) -> str:
        return "pong"


@lattica.actor
class Caller:
    """Calls another actor given as a ref argument (refs are values)."""

    async def call_incr(self, ref, n: int) -> int:
        return await ref.incr.remote(n)

    def call_incr_sync(self, ref, n: int) -> int:
        return lattica.get(ref.incr.remote(n), timeout=10)

    async def where(self, ref) -> list:
        return [str(ref.peer_id), ref.name]

    async def spawn_counter(self, start: int):
        """Spawns a Counter on this actor's own node and returns its ref."""
        return Counter.remote(start)


@lattica.actor
class Info:
    async def pid(self) -> int:
        return os.getpid()


class NotAnActor:
    """A plain class under the allowed prefix (the spawner still imports it)."""

    def ping(self) -> str:
        return "pong"


@lattica.actor
class Tally:
    """A supervised worker with state: ``checkpoint`` / ``restore`` carry it across restarts."""

    def __init__(self, label: str = "") -> None:
        self.label = label
        self.total = 0
        self.restored = False

    async def add(self, n: int) -> int:
        self.total += n
        return self.total

    async def get(self) -> int:
        return self.total

    async def where(self) -> str:
        return str(lattica.current_actor().peer_id)

    async def was_restored(self) -> bool:
        return self.restored

    async def checkpoint(self) -> dict:
        return {"total": self.total}

    def restore(self, state: dict) -> None:
        self.total = state["total"]
        self.restored = True

    async def quit(self, reason: str = "normal") -> None:
        """End this actor on its own, with ``reason``, once this call has answered."""
        lattica.exit_actor(reason)


@lattica.actor
class SlowSupervisor(lattica.Supervisor.cls):
    """A supervisor slow to stop its children: its on_stop hook waits ``stop_delay`` seconds first
    (its next incarnation, restarted meanwhile, starts theirs before it stops its own)."""

    def __init__(self, *args, stop_delay: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stop_delay = stop_delay

    async def on_stop(self) -> None:
        await asyncio.sleep(self.stop_delay)
        await super().on_stop()


@lattica.actor
class Linker:
    """Links itself to other actors (OTP's link) and undoes it."""

    async def link_to(self, ref: lattica.ActorRef) -> None:
        lattica.link(ref)

    async def unlink_from(self, ref: lattica.ActorRef) -> None:
        lattica.unlink(ref)

    async def ping(self) -> str:
        return "pong"


@lattica.actor
class Shop:
    """An actor with one method open to strangers (``browse``) and the rest for members only."""

    def __init__(self) -> None:
        self.stock = {"apple": 3}

    @lattica.public
    def browse(self) -> dict:
        return dict(self.stock)

    @lattica.public
    async def who(self) -> str:
        return str(lattica.current_caller())

    def restock(self, item: str, n: int) -> int:
        self.stock[item] = self.stock.get(item, 0) + n
        return self.stock[item]

    @lattica.public
    def order(self, item: str, vip: str = "") -> str:
        """Open to strangers, but its own ACL: members, and one named stranger."""
        who = lattica.require_caller("member", *([vip] if vip else []))
        return f"{item} for {who}"


@lattica.actor(public=True)
class Echo:
    """Every method open to strangers."""

    def echo(self, x):
        return x


@lattica.actor
class Collector:
    """Keeps what it is told (pub-sub handler tests)."""

    def __init__(self) -> None:
        self.items: list = []

    async def on_message(self, msg) -> None:
        self.items.append([msg.topic, str(msg.author), msg.data])

    async def got(self) -> list:
        return self.items
