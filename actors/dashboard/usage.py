"""Utilisation over time, kept on every node and pulled on demand (no head node): every
``EVERY`` seconds the node's CPU, resident memory, calls/s and errors/s, and each actor's calls/s,
errors/s, CPU (the thread of its sync methods; async methods share the node loop's), mailbox and,
while its panel is open, an estimate of the memory it holds (``footprint``).
The last ``SAMPLES`` of each, in fixed arrays (a few KiB per actor, whatever the traffic)."""

from __future__ import annotations

import array
import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

    from lattica._runtime import LocalActor
    from lattica._runtime.calls import Calls

__all__ = ["Usage", "ActorCounters", "EVERY", "SAMPLES", "MAX_ACTORS"]

EVERY = 2.0  # seconds between samples
SAMPLES = 150  # samples kept: the last five minutes
MAX_ACTORS = 2000  # actors with series of their own (the first ones seen when there are more)
NODE_FIELDS = ("cpu", "memory", "calls", "errors")  # % of one core, bytes, per second, per second
ACTOR_FIELDS = (
    "calls",
    "errors",
    "cpu",
    "mailbox",
    "memory",
)  # per second, per second, % of one core, calls waiting, bytes (-1: not measured)
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _Ring:
    """``len(fields)`` series of ``SAMPLES`` floats, written at one shared position."""

    __slots__ = ("values", "born")

    def __init__(self, fields: int, born: int) -> None:
        self.values = array.array("f", bytes(4 * fields * SAMPLES))
        self.born = born  # the sample count when it began (earlier samples are not its)

    def put(self, at: int, row: tuple[float, ...]) -> None:
        base = (at % SAMPLES) * len(row)
        for i, v in enumerate(row):
            self.values[base + i] = v

    def series(self, fields: tuple[str, ...], count: int) -> dict[str, list[float]]:
        """Each field's samples from the oldest kept to the newest."""
        n = len(fields)
        first = max(self.born, count - SAMPLES)
        order = [(k % SAMPLES) * n for k in range(first, count)]
        return {f: [round(self.values[b + i], 3) for b in order] for i, f in enumerate(fields)}


class ActorCounters:
    """One actor's counters at the last sample, and its series."""

    __slots__ = ("actor", "calls", "errors", "cpu", "memory", "ring")

    def __init__(self, actor: LocalActor, born: int) -> None:
        self.actor = actor
        self.calls: int = actor.calls
        self.errors: int = actor.errors
        self.cpu = _thread_cpu(actor.thread_id)
        self.memory: float | None = None  # the last estimate of what it holds (an open panel asks for one)
        self.ring = _Ring(len(ACTOR_FIELDS), born)


class Usage:
    """This node's samples (``sample`` every ``EVERY`` seconds from ``start`` until ``close``)."""

    def __init__(self, rt: Calls) -> None:
        self.rt = rt
        self.count = 0  # samples taken
        self.times = array.array("d", bytes(8 * SAMPLES))
        self.node = _Ring(len(NODE_FIELDS), 0)
        self.latest: dict[str, float] = {}
        self._actors: dict[str, ActorCounters] = {}
        self._last: tuple[float, float, int, int] | None = None  # (wall, process cpu, calls, errors)
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.sample()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def sample(self) -> None:
        """Take one sample now (and schedule the next)."""
        try:
            self._sample()
        finally:
            if not self.rt.loop.is_closed():
                self._timer = self.rt.loop.call_later(EVERY, self.sample)

    def _sample(self) -> None:
        now, cpu = time.time(), time.process_time()
        at = self.count
        actors = self.rt.actors
        calls = errors = 0
        for a in actors.values():
            calls += a.calls
            errors += a.errors
        last = self._last
        self._last = (now, cpu, calls, errors)
        self._sample_actors(now, at, last[0] if last else None)
        if last is None:
            return
        dt = max(now - last[0], 1e-6)
        row = (
            100.0 * (cpu - last[1]) / dt,
            float(_memory()),
            max(0, calls - last[2]) / dt,
            max(0, errors - last[3]) / dt,
        )
        self.times[at % SAMPLES] = now
        self.node.put(at, row)
        self.latest = dict(zip(NODE_FIELDS, (round(v, 2) for v in row)))
        self.count += 1

    def _sample_actors(self, now: float, at: int, before: float | None) -> None:
        """Every tracked actor gets its row (so no series has holes); actors beyond MAX_ACTORS
        are not tracked until tracked ones end."""
        actors = self.rt.actors
        kept = self._actors
        for name in [n for n, c in kept.items() if actors.get(n) is not c.actor]:
            del kept[name]  # ended (or its name taken by another)
        dt = max(now - before, 1e-6) if before is not None else None
        for name, a in list(actors.items()):
            c = kept.get(name)
            if c is None:
                if len(kept) < MAX_ACTORS:
                    kept[name] = ActorCounters(
                        a, at if before is None else at + 1
                    )  # (its first row: the next sample's)
                continue
            cpu = _thread_cpu(a.thread_id) if a.thread_id is not None else None
            if dt is not None:
                c.ring.put(
                    at,
                    (
                        max(0, a.calls - c.calls) / dt,
                        max(0, a.errors - c.errors) / dt,
                        100.0 * (cpu - c.cpu) / dt if cpu is not None and c.cpu is not None else -1.0,
                        float(len(a.waiting)),
                        c.memory if c.memory is not None else -1.0,
                    ),
                )
            c.calls, c.errors, c.cpu, c.memory = a.calls, a.errors, cpu, None

    # -- what the dashboard pulls ---------------------------------------------------------------

    def node_series(self) -> dict[str, Any]:
        """The node's samples: ``time`` and each of NODE_FIELDS, oldest first."""
        first = max(0, self.count - SAMPLES)
        return {
            "every": EVERY,
            "time": [round(self.times[k % SAMPLES], 2) for k in range(first, self.count)],
            **self.node.series(NODE_FIELDS, self.count),
        }

    def actor_series(self, name: str) -> dict[str, Any] | None:
        """One actor's samples (``cpu`` is -1 where it has no thread of its own), or None."""
        c = self._actors.get(name)
        if c is None:
            return None
        first = max(c.ring.born, self.count - SAMPLES)
        return {
            "every": EVERY,
            "time": [round(self.times[k % SAMPLES], 2) for k in range(first, self.count)],
            **c.ring.series(ACTOR_FIELDS, self.count),
        }

    def note_memory(self, name: str, estimate: float) -> None:
        """An estimate of what actor ``name`` holds: the next sample's memory figure."""
        c = self._actors.get(name)
        if c is not None:
            c.memory = estimate

    def tracked(self) -> int:
        return len(self._actors)


def _memory() -> int:
    """This process's resident memory in bytes (its peak where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        import resource  # (not Linux)

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _thread_cpu(tid: int | None) -> float | None:
    """CPU seconds a thread of this process used (Linux), or None."""
    if tid is None:
        return None
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15 of the line)
    except (OSError, ValueError, IndexError):
        return None
