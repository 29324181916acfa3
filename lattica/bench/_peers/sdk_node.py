"""An SDK node (the GradientHQ Lattica SDK, rust-libp2p 0.54) with its Kademlia and Bitswap, run
as ``sdk_peer.py kad`` by the SDK venv's interpreter and driven from asyncio over JSON lines
(issue 49's interop peer). The wire facts (record values, CIDs, protocols) are in sdk_peer.py's
docstring."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import pathlib
import tempfile
from collections.abc import Sequence
from typing import IO, Any

from . import SDK_PEER

_LINE_LIMIT = 1 << 26  # (a block travels as hex on one line)
_GRACE = 10.0  # seconds we wait beyond what the driver waits for the SDK, so its answer comes first


class SdkError(RuntimeError):
    """An operation the SDK node answered with ``{"ok": false}``, or a driver that stopped."""


@dataclasses.dataclass(frozen=True)
class SdkValue:
    """A value read from the SDK's DHT: the bytes stored and their expiration (unix time)."""

    value: bytes
    expiration: float


class SdkNode:
    """One running SDK node on 127.0.0.1 (TCP and QUIC): its PeerId, its addresses, a method
    per operation of ``sdk_peer.py kad`` (one at a time), and ``stop()``."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr: IO[str], hello: dict[str, Any]) -> None:
        """Use ``await SdkNode.start(...)``."""
        self._proc = proc
        self._stderr = stderr
        self._lock = asyncio.Lock()
        self.peer_id: str = hello["peer_id"]
        self.addrs: list[str] = hello["addrs"]

    @classmethod
    async def start(cls, sdk_python: pathlib.Path, bootstraps: Sequence[str] = (), timeout: float = 30.0) -> SdkNode:
        """Start an SDK node dialing ``bootstraps`` (multiaddrs ending in ``/p2p/<PeerId>``) and
        wait for its PeerId and addresses; ``sdk_python`` is the SDK venv's interpreter, used as
        given (resolving its symlink would lose the venv)."""
        # (its stderr to a file: a pipe nobody reads would stop the SDK once full, e.g. with RUST_LOG)
        stderr = tempfile.TemporaryFile(mode="w+")
        proc = await asyncio.create_subprocess_exec(
            str(sdk_python),
            str(SDK_PEER),
            "kad",
            *bootstraps,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            limit=_LINE_LIMIT,
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
            message = f"the SDK node exited before it was ready: {_tail(stderr)}"
            stderr.close()
            raise SdkError(message)
        return cls(proc, stderr, json.loads(line))

    def addr(self, transport: str = "tcp") -> str:
        """Its address on ``transport`` ("tcp" or "quic"), with its PeerId."""
        return next(a for a in self.addrs if ("/quic-v1" in a) == (transport == "quic"))

    async def store(
        self, key: str, value: bytes, expiration: float, subkey: str | None = None, timeout: float = 30.0
    ) -> None:
        """Put ``value`` (bytes as they are, no pickle) under ``key`` (or ``key``'s ``subkey``)
        until ``expiration`` (unix time), replicated with quorum one."""
        await self._call("store", timeout, key=key, value=value.hex(), expiration=expiration, subkey=subkey)

    async def get(self, key: str, timeout: float = 30.0) -> SdkValue | dict[str, SdkValue] | None:
        """The value under ``key``, the values of its subkeys when it has some, or None (not
        found, expired, or any error: the SDK tells them apart no further)."""
        answer = await self._call("get", timeout, key=key)
        if "subkeys" in answer:
            return {k: SdkValue(bytes.fromhex(v["value"]), v["expiration"]) for k, v in answer["subkeys"].items()}
        if answer["value"] is None:
            return None
        return SdkValue(bytes.fromhex(answer["value"]), answer["expiration"])

    async def provide(self, key: str, timeout: float = 30.0) -> None:
        """Announce this node as a provider of ``key`` (its UTF-8 bytes)."""
        await self._call("provide", timeout, key=key)

    async def providers(self, key: str, timeout: float = 30.0) -> list[str]:
        """The PeerIds the first answer of a provider lookup of ``key`` names (SdkError when the
        SDK has not answered within ``timeout``: with no peer it never does)."""
        return list((await self._call("providers", timeout, key=key))["providers"])

    async def put_block(self, data: bytes, timeout: float = 30.0) -> str:
        """Store ``data`` in the node's blockstore; its CID (v1, raw, sha2-256, base32)."""
        return str((await self._call("put_block", timeout, data=data.hex()))["cid"])

    async def get_block(self, cid: str, timeout: float = 30.0) -> bytes:
        """The block ``cid``, from the blockstore or over Bitswap; SdkError when none came within
        ``timeout`` (which the SDK rounds up to whole seconds)."""
        return bytes.fromhex((await self._call("get_block", timeout, cid=cid))["data"])

    async def get_blocks(self, cids: Sequence[str], threads: int = 16, timeout: float = 300.0) -> dict[str, Any]:
        """``get_block`` of every CID, ``threads`` at once, timed by the driver: ``{"seconds",
        "bytes", "blocks", "from": {PeerId or "local": blocks}, "verified"}`` (the blocks stay
        in the driver; SdkError if any was not fetched within ``timeout``, the whole call's)."""
        return await self._call("get_blocks", timeout, cids=list(cids), threads=threads)

    async def gets(self, keys: Sequence[str], timeout: float = 300.0) -> tuple[list[float], list[bool]]:
        """The SDK's ``get`` of each key in turn, each timed by the driver: the milliseconds of
        each and whether it found a value."""
        answer = await self._call("gets", timeout, keys=list(keys))
        return list(answer["ms"]), list(answer["found"])

    async def peers(self, timeout: float = 30.0) -> list[str]:
        """The SDK's address book: peers identified as ``/lattica/1.0.0``, kept after they leave."""
        return list((await self._call("peers", timeout))["peers"])

    async def connect(self, peer_id: str, timeout: float = 30.0) -> None:
        """Dial ``peer_id`` at addresses the node already knows (it cannot be given one); an
        error when it knows none or is already connected."""
        await self._call("connect", timeout, peer_id=peer_id)

    async def _call(self, op: str, timeout: float, **fields: Any) -> dict[str, Any]:
        """Send one operation, wait for its answer line; SdkError when it says ``ok: false``."""
        async with self._lock:
            proc = self._proc
            if proc.stdin is None or proc.stdout is None or proc.returncode is not None:
                raise SdkError(f"the SDK node is not running: {_tail(self._stderr)}")
            try:
                proc.stdin.write((json.dumps({"op": op, "timeout": timeout, **fields}) + "\n").encode())
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                line = b""
            else:
                line = await asyncio.wait_for(proc.stdout.readline(), timeout + _GRACE)
        if not line:
            raise SdkError(f"the SDK node exited during {op}: {_tail(self._stderr)}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise SdkError(f"{op}: {answer.get('error')}")
        return answer

    async def stop(self) -> None:
        """Close its stdin (the driver closes the node and exits), kill it if it lingers."""
        if self._stderr.closed:
            return
        await _end(self._proc)
        self._stderr.close()

    async def __aenter__(self) -> SdkNode:
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


def _tail(stderr: IO[str]) -> str:
    """The end of what the driver wrote to stderr."""
    if stderr.closed:
        return ""
    stderr.flush()
    stderr.seek(0)
    return stderr.read()[-1500:]
