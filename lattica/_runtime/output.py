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
from collections.abc import Callable
from typing import Any, TextIO

from lattica._runtime.refs import ACTOR, ActorRef

__all__ = [
    "OutputRing",
    "install",
    "register",
    "unregister",
    "held_bytes",
    "MAX_LINES",
    "MAX_BYTES",
    "PROCESS_BYTES",
    "MAX_LINE",
]

MAX_LINES = 200  # lines an actor's ring keeps
MAX_BYTES = 32 * 1024  # bytes an actor's ring holds (its lines' characters and what each line costs besides)
MAX_LINE = 2000  # characters of one line (a log record with its traceback counts as one)
PROCESS_BYTES = 16 * 1024 * 1024  # all rings of the process together; past it each keeps its share
_MIN_SHARE = 2048
_LINE_COST = 150  # bytes a kept line holds besides its characters (its tuple, time and string header)

_lock = threading.Lock()  # ring contents and the process total: written from actor threads and the loop
_rings: dict[int, tuple[ActorRef, OutputRing]] = {}  # id of an actor incarnation's ref -> (that ref, its ring)
_total = 0
_record_factory_set = False
_squeezed = 0.0  # when every ring was last cut to its share
_here = threading.local()  # .tee: a Tee writes on this thread; .locked: this thread holds _lock


class _Locked:
    """``_lock`` held, and this thread marked as holding it: a finalizer that prints or logs
    while it is held (the garbage collector runs them at any allocation) writes through without
    being noted, instead of waiting forever for a lock its own thread holds."""

    def __enter__(self) -> None:
        _lock.acquire()
        _here.locked = True

    def __exit__(self, *exc: object) -> None:
        _here.locked = False
        _lock.release()


_locked = _Locked()


def _busy() -> bool:
    """This thread holds the lock (or is inside a Tee's write): note nothing more now."""
    return getattr(_here, "locked", False) or getattr(_here, "tee", False)


class OutputRing:
    """One actor's recent output: ``(time, stream, text)`` lines, oldest first; ``stream`` is
    ``stdout``, ``stderr`` or ``log``."""

    __slots__ = ("lines", "size", "dropped", "released", "_partial", "_logged", "__weakref__")

    def __init__(self) -> None:
        self.lines: collections.deque[tuple[float, str, str]] = collections.deque()
        self.size = 0
        self.dropped = 0  # lines pushed out by the bounds
        self.released = False  # its actor ended: nothing more is added, nor counted
        self._partial: dict[str, str] = {}  # stream -> text written without its newline yet
        self._logged: tuple[str, str] | None = None  # the last record noted (message, its end as a handler prints it)

    def add(self, stream: str, text: str) -> None:
        """Keep one line (what the tee and the log records do; a benchmark fills rings with it)."""
        with _locked:
            self._add(stream, text)

    def release(self) -> None:
        """Stop counting this ring against the process (it is dropped, or its actor ended)."""
        with _locked:
            self._release()

    def snapshot(self, limit: int = MAX_LINES) -> list[tuple[float, str, str]]:
        """The newest ``limit`` lines (and any line still being written)."""
        with _locked:
            out = list(self.lines)[-limit:]
            now = time.time()
            out += [(now, s, t) for s, t in self._partial.items() if t]
        return out

    def write(self, stream: str, data: str) -> None:
        """What an actor wrote to ``stream``, split into lines; only the last MAX_LINES lines
        of one write are kept (cut outside the lock: a huge write holds nobody up)."""
        parts = data.split("\n")
        cut = len(parts) - 1 - MAX_LINES
        if cut > 0:
            parts = parts[cut:]
        with _locked:
            if cut > 0:
                self.dropped += cut
                self._partial.pop(stream, None)  # (its line was among those cut)
            elif self._repeats_record(stream, data):
                return
            self._logged = None
            parts[0] = self._partial.pop(stream, "") + parts[0]
            for line in parts[:-1]:
                self._add(stream, line.rstrip("\r"))
            rest = parts[-1]
            if len(rest) >= MAX_LINE:  # a line that never ends: kept in pieces
                self._add(stream, rest)
                rest = ""
            if rest:
                self._partial[stream] = rest

    def note_log(self, text: str, message: str, tail: str) -> None:
        with _locked:
            self._add("log", text)
            self._logged = (message, tail) if message else None

    # -- under _lock ----------------------------------------------------------------------------

    def _repeats_record(self, stream: str, data: str) -> bool:
        """``data`` is a handler printing the record just noted: one whole line (or several, with
        a traceback) in one write, ending as the record does. A print() writes its text and its
        newline apart, so what a program prints is never taken for it."""
        logged = self._logged
        if logged is None or self._partial.get(stream) or not data.endswith("\n"):
            return False
        self._logged = None
        text = data.rstrip("\n").rstrip("\r")
        return text.endswith(logged[1]) and logged[0] in text

    def _add(self, stream: str, text: str) -> None:
        global _total
        if self.released:
            return
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
        if not self.released:
            _total -= len(old) + _LINE_COST
        self.dropped += 1

    def _release(self) -> None:
        global _total
        if not self.released:
            self.released = True
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
    for _, r in list(_rings.values()):
        while r.lines and r.size > share:
            r._drop()


def held_bytes() -> int:
    """What all rings of the process hold now (their bounds' measure)."""
    return _total


def register(ref: ActorRef) -> OutputRing:
    """The ring of a user actor (this incarnation: ``ref`` is its own) as it starts; installs the
    capture at first use."""
    ring = OutputRing()
    with _locked:
        _rings[id(ref)] = (ref, ring)
    install()
    return ring


def unregister(ref: ActorRef, ring: OutputRing) -> None:
    """The actor ended: nothing more is routed to its ring (which its end record may keep)."""
    with _locked:
        if _rings.get(id(ref), (None, None))[1] is ring:
            del _rings[id(ref)]
        ring._release()


def _ring() -> OutputRing | None:
    """The ring of the actor whose code runs now on this thread, if any (and not busy noting)."""
    ref = ACTOR.get()
    if ref is None or _busy():
        return None
    got = _rings.get(id(ref))
    return got[1] if got is not None and got[0] is ref else None


class _Tee:
    """A text stream that writes through to the real one and notes what an actor wrote."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self._stream = stream
        self._name = name

    def write(self, data: str) -> int:
        ring = _ring()
        if ring is None:
            return self._stream.write(data)
        _here.tee = True
        try:
            n = self._stream.write(data)
        finally:
            _here.tee = False
        if type(data) is str:
            ring.write(self._name, data)
        return n

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, attr: str) -> Any:  # fileno, flush, isatty, encoding, buffer ...
        return getattr(self._stream, attr)


def _noting(make: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    """A log record factory that also notes, in the running actor's ring, each record made (so
    what passes the logger's level, whatever the handlers are). A record whose message cannot
    be formatted is noted as such: logging itself reports it, the call that logs goes on."""

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        ring = _ring()
        if ring is not None:
            _here.tee = True  # (what formatting the record prints is not noted)
            try:
                message = record.getMessage()
                text = f"{record.levelname} {record.name}: {message}"
                tail = message
                if record.exc_info:
                    tail = logging.Formatter().formatException(record.exc_info)
                    text += "\n" + tail
            except Exception:
                message = tail = ""
                text = f"{record.levelname} {record.name}: (a message that could not be formatted)"
            finally:
                _here.tee = False
            ring.note_log(text, message, tail)
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
    with _locked:
        if _record_factory_set:
            return
        _record_factory_set = True
    current = logging.getLogRecordFactory()
    if not getattr(current, "lattica_output", False):
        logging.setLogRecordFactory(_noting(current))
