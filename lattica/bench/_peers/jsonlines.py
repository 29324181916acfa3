"""A peer process driven from asyncio over JSON lines (the SDK's and kubo's drivers, issue 49):
one operation a line on its stdin, one answer a line on its stdout, its stderr kept in a file
(a pipe nobody reads would stop the peer once full) and quoted in errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from collections.abc import Sequence
from typing import IO, Any, ClassVar, TypeVar

GRACE = 10.0  # seconds we wait beyond what the driver waits for its peer, so its answer comes first

T = TypeVar("T", bound="JsonLinesPeer")


class PeerError(RuntimeError):
    """An operation the peer answered with ``{"ok": false}``, or a driver that stopped."""


class JsonLinesPeer:
    """One running driver: its hello line (PeerId, addresses, ...), ``_call`` per operation (one
    at a time), ``log()`` and ``stop()``; subclasses name their error and add the operations."""

    error: ClassVar[type[PeerError]] = PeerError
    what: ClassVar[str] = "the peer"  # for messages: "the SDK node", "kubo"
    line_limit: ClassVar[int] = 1 << 26  # (blocks travel as hex on one line)

    def __init__(self, proc: asyncio.subprocess.Process, stderr: IO[str], hello: dict[str, Any]) -> None:
        """Use ``await Subclass.launch(...)``."""
        self._proc = proc
        self._stderr = stderr
        self._lock = asyncio.Lock()
        self.hello = hello
        self.peer_id: str = hello["peer_id"]
        self.addrs: list[str] = hello["addrs"]

    @classmethod
    async def launch(cls: type[T], argv: Sequence[str], timeout: float) -> T:
        """Run ``argv`` and wait for its hello line."""
        stderr = tempfile.TemporaryFile(mode="w+")
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            limit=cls.line_limit,
        )
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout)
        except BaseException:
            await _end(proc)
            stderr.close()
            raise
        if not line:
            await _end(proc)
            message = f"{cls.what} exited before it was ready: {_tail(stderr)}"
            stderr.close()
            raise cls.error(message)
        return cls(proc, stderr, json.loads(line))

    @property
    def pid(self) -> int:
        return self._proc.pid

    async def _call(self, op: str, timeout: float, **fields: Any) -> dict[str, Any]:
        """Send one operation, wait for its answer line; ``error`` when it says ``ok: false``."""
        async with self._lock:
            proc = self._proc
            if proc.stdin is None or proc.stdout is None or proc.returncode is not None:
                raise self.error(f"{self.what} is not running: {_tail(self._stderr)}")
            try:
                proc.stdin.write((json.dumps({"op": op, "timeout": timeout, **fields}) + "\n").encode())
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                line = b""
            else:
                line = await asyncio.wait_for(proc.stdout.readline(), timeout + GRACE)
        if not line:
            raise self.error(f"{self.what} exited during {op}: {_tail(self._stderr)}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise self.error(f"{op}: {answer.get('error')}")
        return answer

    def log(self, whole: bool = False) -> str:
        """The end (or ``whole``: all) of what the peer and its driver wrote to stderr."""
        return _tail(self._stderr, None if whole else 1500)

    async def stop(self) -> None:
        """Close its stdin (the driver closes its peer and exits), kill it if it lingers."""
        if self._stderr.closed:
            return
        await _end(self._proc)
        self._stderr.close()

    async def __aenter__(self: T) -> T:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def _end(proc: asyncio.subprocess.Process, wait: float = 10.0) -> None:
    """Close ``proc``'s stdin and wait ``wait`` seconds for it to exit; then kill it."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), wait)
    except TimeoutError:
        proc.kill()
        await proc.wait()


def _tail(stderr: IO[str], chars: int | None = 1500) -> str:
    """The end (its last ``chars``; None: all) of what the driver wrote to stderr."""
    if stderr.closed:
        return ""
    stderr.flush()
    stderr.seek(0)
    text = stderr.read()
    stderr.seek(0, 2)
    return text if chars is None else text[-chars:]
