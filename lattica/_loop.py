"""The node loop: uvloop, or asyncio with an adaptive busy-poll selector.

On virtual machines (and laptops in power-saving states) a CPU that goes idle takes tens of
microseconds to wake, and every network round trip pays that twice. Polling the sockets for a short
window before blocking keeps the loop awake across a request/response exchange, as low-latency
runtimes and the kernel's own haltpoll do. The window adapts: it doubles when an event came within
the longest window (polling caught it, or would have with a longer window) and halves when the
loop waited longer than that, so an idle node spends almost nothing on it.

Polling only pays while a CPU would otherwise sit idle. When tasks on the machine are already
waiting for a CPU (Linux's pressure stall information says so), a spinning loop takes the CPU
from the very process that would send it the next event, so polling pauses until that passes.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import time
from typing import Any

BUSY_POLL_US = 200.0  # the window a node asks for with busy_poll_us (the benches' "busy poll")
# The plain loop (uvloop) won more workloads (``lattica bench busy-poll``, docs/benchmarks.md),
# but a node on it died of a segmentation fault inside uvloop, twice, on a QUIC path in the NAT
# lab (docs/benchmarks.md, "Which loop by default"): until that is found, the busy poll (asyncio)
# stays the default.
DEFAULT_BUSY_POLL_US = BUSY_POLL_US
_BASE = getattr(selectors, "EpollSelector", selectors.DefaultSelector)
_PSI_CPU = "/proc/pressure/cpu"


class CpuPressure:
    """Whether tasks on this machine were kept waiting for a CPU for more than ``threshold`` of the
    last ``period`` seconds, from the kernel's cumulative stall time (checked at most once a
    period). Always False where the kernel does not report it."""

    def __init__(self, path: str = _PSI_CPU, threshold: float = 0.1, period: float = 0.25) -> None:
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY)
        except OSError:
            self._fd = None
        self._threshold = threshold
        self._period = period
        self._at = 0.0  # when the stall total was last read
        self._total = self._read()
        self._contended = False

    def _read(self) -> int:
        if self._fd is None:
            return 0
        try:
            line = os.pread(self._fd, 128, 0).split(b"\n", 1)[0]  # "some avg10=.. total=<us>"
            return int(line.rsplit(b"total=", 1)[1])
        except (OSError, IndexError, ValueError):
            os.close(self._fd)
            self._fd = None
            return 0

    def contended(self, now: float) -> bool:
        elapsed = now - self._at
        if elapsed >= self._period and self._fd is not None:
            total = self._read()
            self._contended = (total - self._total) * 1e-6 > self._threshold * elapsed
            self._at, self._total = now, total
        return self._contended


_shared: CpuPressure | None = None


def _process_pressure() -> CpuPressure:
    """One per process (opened on first use): every node's loop asks the same question."""
    global _shared
    if _shared is None:
        _shared = CpuPressure()
    return _shared


class BusyPollSelector(_BASE):  # type: ignore[misc, valid-type]
    """A selector that polls (timeout 0) for up to an adaptive window before blocking."""

    def __init__(self, max_spin: float, pressure: CpuPressure | None = None) -> None:
        super().__init__()
        self._max = max_spin
        self._min = max_spin / 8
        self._spin = max_spin
        self._pressure = pressure or _process_pressure()

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is not None and timeout <= 0:
            return super().select(0)
        clock = time.perf_counter
        start = clock()
        window = self._spin if timeout is None else min(self._spin, timeout)
        if self._pressure.contended(start):
            window = 0.0  # a CPU is short: block, leave it to whoever is waiting for it
        end = start + window
        poll = super().select
        while True:
            events = poll(0)
            if events:
                self._spin = min(self._max, self._spin * 2)
                return events
            if clock() >= end:
                break
        if timeout is not None:
            timeout = max(0.0, timeout - (clock() - start))
        events = poll(timeout)
        # Grow again if the longest window would have caught this event: otherwise a round trip a
        # little longer than the current window shrinks it to the minimum and it never recovers.
        if events and clock() - start <= self._max:
            self._spin = min(self._max, self._spin * 2)
        else:
            self._spin = max(self._min, self._spin / 2)
        return events


def new_loop(busy_poll_us: float, use_uvloop: bool | None) -> asyncio.AbstractEventLoop:
    """A fresh loop for a node thread. ``use_uvloop=True``: uvloop (it cannot busy-poll);
    otherwise busy-polling asyncio if ``busy_poll_us`` > 0; otherwise uvloop when installed
    (unless ``use_uvloop`` is False), else plain asyncio."""
    if busy_poll_us > 0 and not use_uvloop:
        return asyncio.SelectorEventLoop(BusyPollSelector(busy_poll_us * 1e-6))
    if use_uvloop is not False:
        try:
            import uvloop  # optional (the `fast` extra)

            return uvloop.new_event_loop()
        except ImportError:
            if use_uvloop:
                raise
    return asyncio.new_event_loop()
