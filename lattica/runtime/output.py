"""What actors print and log, kept per actor so a dashboard on any node can show it (as Ray shows
a worker's logs). ``sys.stdout`` and ``sys.stderr`` are teed (everything still reaches the real
streams) and log records are noted as they are made; a line written while an actor's code runs
(its constructor, hooks and methods: the ``ACTOR`` context) goes to that actor's ring. Bounded per
actor (lines and bytes) and per process; installed as user actors start.

Not caught: output of threads an actor starts itself (they do not inherit the context), of C code
and of subprocesses, which write to the file descriptors directly."""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from typing import Any, Callable, TextIO

from lattica.identity import PeerId
from lattica.runtime.refs import ACTOR

__all__ = ["OutputRing", "install", "register", "unregister", "held_bytes", "MAX_LINES", "MAX_BYTES", "PROCESS_BYTES", "MAX_LINE"]

MAX_LINES = 200  # lines an actor's ring keeps
MAX_BYTES = 32 * 1024  # bytes an actor's ring holds (its lines' characters and what each line costs besides)
MAX_LINE = 2000  # characters of one line (a log record with its traceback counts as one)
PROCESS_BYTES = 16 * 1024 * 1024  # all rings of the process together; past it each keeps its share
_MIN_SHARE = 2048
_LINE_COST = 150  # bytes a kept line holds besides its characters (its tuple, time and string header)

_lock = threading.Lock()  # ring contents and the process total: written from actor threads and the loop
_rings: dict[tuple[PeerId, str], OutputRing] = {}
_total = 0
_record_factory_set = False
_squeezed = 0.0  # when every ring was last cut to its share
_inside = threading.local()  # a Tee writing on this thread (a Tee wrapped in another notes once)


class OutputRing:
    """One actor's recent output: ``(time, stream, text)`` lines, oldest first; ``stream`` is
    ``stdout``, ``stderr`` or ``log``."""

    __slots__ = ("lines", "size", "dropped", "_partial", "_logged", "__weakref__")

    def __init__(self) -> None:
        self.lines: collections.deque[tuple[float, str, str]] = collections.deque()
        self.size = 0
        self.dropped = 0  # lines pushed out by the bounds
        self._partial: dict[str, str] = {}  # stream -> text written without its newline yet
        self._logged: str | None = None  # the last log record's message, until a stream line repeats it

    def add(self, stream: str, text: str) -> None:
        """Keep one line (what the tee and the log records do; a benchmark fills rings with it)."""
        with _lock:
            self._add(stream, text)

    def release(self) -> None:
        """Stop counting this ring against the process (it is dropped)."""
        with _lock:
            self._release()

    def snapshot(self, limit: int = MAX_LINES) -> list[tuple[float, str, str]]:
        """The newest ``limit`` lines (and any line still being written)."""
        with _lock:
            out = list(self.lines)[-limit:]
            now = time.time()
            out += [(now, s, t) for s, t in self._partial.items() if t]
        return out

    # -- under _lock ----------------------------------------------------------------------------

    def _write(self, stream: str, data: str) -> None:
        text = self._partial.pop(stream, "") + data
        *done, rest = text.split("\n")
        for line in done:
            self._stream_line(stream, line)
        if len(rest) >= MAX_LINE:  # a line that never ends: kept in pieces
            self._stream_line(stream, rest)
            rest = ""
        if rest:
            self._partial[stream] = rest

    def _stream_line(self, stream: str, line: str) -> None:
        logged, self._logged = self._logged, None
        if logged and logged in line:  # a handler printing the record just noted: once is enough
            return
        self._add(stream, line.rstrip("\r"))

    def _note_log(self, text: str, message: str) -> None:
        self._add("log", text)
        self._logged = message or None

    def _add(self, stream: str, text: str) -> None:
        global _total
        text = text[:MAX_LINE]
        self.lines.append((time.time(), stream, text))
        self.size += len(text) + _LINE_COST
        _total += len(text) + _LINE_COST
        if _total > PROCESS_BYTES:
            _squeeze(self)
        while self.lines and (len(self.lines) > MAX_LINES or self.size > MAX_BYTES):
            self._drop()

    def _drop(self) -> None:
        global _total
        _, _, old = self.lines.popleft()
        self.size -= len(old) + _LINE_COST
        _total -= len(old) + _LINE_COST
        self.dropped += 1

    def _release(self) -> None:
        """The actor ended: its lines stop counting against the process (its record keeps them)."""
        global _total
        _total -= self.size


def _squeeze(ring: OutputRing) -> None:
    """Past the process's budget, rings keep only their share (under _lock): the one being
    written, then every ring if that was not enough. With more rings than the budget has
    shares (each keeps _MIN_SHARE), the sweep runs at most once a second."""
    global _squeezed
    share = max(_MIN_SHARE, PROCESS_BYTES // max(1, len(_rings)))
    while ring.lines and ring.size > share:
        ring._drop()
    now = time.monotonic()
    if _total <= PROCESS_BYTES or (share == _MIN_SHARE and now - _squeezed < 1.0):
        return
    _squeezed = now
    for r in list(_rings.values()):
        while r.lines and r.size > share:
            r._drop()


def held_bytes() -> int:
    """What all rings of the process hold now (their bounds' measure)."""
    return _total


def register(peer: PeerId, name: str) -> OutputRing:
    """The ring of a user actor starting on node ``peer`` (installs the capture at first use)."""
    ring = OutputRing()
    with _lock:
        _rings[(peer, name)] = ring
    install()
    return ring


def unregister(peer: PeerId, name: str, ring: OutputRing) -> None:
    """The actor ended: nothing more is routed to its ring (which its end record may keep)."""
    with _lock:
        if _rings.get((peer, name)) is ring:
            del _rings[(peer, name)]
            ring._release()


def _ring() -> OutputRing | None:
    ref = ACTOR.get()
    if ref is None:
        return None
    return _rings.get((ref.peer_id, ref.name))


class _Tee:
    """A text stream that writes through to the real one and notes what an actor wrote."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self._stream = stream
        self._name = name

    def write(self, data: str) -> int:
        if getattr(_inside, "tee", False):
            return self._stream.write(data)
        _inside.tee = True
        try:
            n = self._stream.write(data)
        finally:
            _inside.tee = False
        ring = _ring()
        if ring is not None and type(data) is str:
            with _lock:
                ring._write(self._name, data)
        return n

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, attr: str) -> Any:  # fileno, flush, isatty, encoding, buffer ...
        return getattr(self._stream, attr)


def _noting(make: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    """A log record factory that also notes, in the running actor's ring, each record made (so
    what passes the logger's level, whatever the handlers are)."""

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        ring = _ring()
        if ring is not None:
            try:
                message = record.getMessage()
                text = f"{record.levelname} {record.name}: {message}"
                if record.exc_info:
                    text += "\n" + logging.Formatter().formatException(record.exc_info)
            except Exception:  # (a record whose arguments do not fit its format: its handler reports it)
                message, text = "", f"{record.levelname} {record.name}: {record.msg!r}"
            with _lock:
                ring._note_log(text, message)
        return record

    factory.lattica_output = True  # type: ignore[attr-defined]
    return factory


def install() -> None:
    """Tee the process's stdout and stderr and note log records (idempotent; run as each user
    actor starts, so streams a program swapped since, as pytest does, are teed again)."""
    global _record_factory_set
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Tee):
            setattr(sys, name, _Tee(stream, name))
    with _lock:
        if _record_factory_set:
            return
        _record_factory_set = True
    current = logging.getLogRecordFactory()
    if not getattr(current, "lattica_output", False):
        logging.setLogRecordFactory(_noting(current))
