"""go-libp2p 0.32 for the interop tests and ``lattica bench libp2p``: the ``p2pd`` daemon from the hivemind 1.1.12 wheel,
driven over its control socket (uvarint-delimited protobuf ``Request``/``Response``, as
go-libp2p-daemon's p2pd.proto defines them). Never started with ``-b`` (which dials public
bootstrap peers): it listens and dials on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import subprocess
import tempfile
import time
from collections.abc import Iterator

from lattica._identity import PeerId
from lattica._multiaddr import Multiaddr
from lattica._protobuf import decode_fields, decode_repeated, encode_fields, uvarint

LISTEN = ("/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1")
IDENTIFY, CONNECT, STREAM_OPEN, STREAM_HANDLER, DISCONNECT = 0, 1, 2, 3, 7


async def read_delimited(reader: asyncio.StreamReader) -> bytes:
    n = shift = 0
    while True:
        b = (await reader.readexactly(1))[0]
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return await reader.readexactly(n)
        shift += 7


class Daemon:
    """One running p2pd and its control socket."""

    def __init__(self, binary: pathlib.Path, workdir: pathlib.Path, listen: tuple[str, ...] = LISTEN) -> None:
        """``listen``: its host's addresses (a bench listens on one transport only: go dials a
        peer's QUIC addresses first once identify told it of them)."""
        self.control = workdir / "p2pd.sock"
        self.proc = subprocess.Popen(
            [
                str(binary),
                "-q",
                "-listen",
                f"/unix{self.control}",
                "-hostAddrs",
                ",".join(listen),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 15
        while not self.control.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"p2pd did not start: {self.proc.stderr.read().decode()[-1000:] if self.proc.stderr else ''}"
                )
            time.sleep(0.05)

    async def _request(self, fields: list) -> tuple[dict, asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_unix_connection(str(self.control))
        body = encode_fields(fields)
        writer.write(uvarint(len(body)) + body)
        await writer.drain()
        resp = decode_fields(await read_delimited(reader))
        if resp.get(1) != 0:
            raw = resp.get(2)
            err = decode_fields(raw) if isinstance(raw, bytes) else {}
            writer.close()
            raise RuntimeError(f"p2pd refused: {err.get(1, b'?')!r}")
        return resp, reader, writer

    async def identify(self) -> tuple[PeerId, list[Multiaddr]]:
        resp, _, writer = await self._request([(1, IDENTIFY)])
        writer.close()
        ident = resp[4]
        assert isinstance(ident, bytes)
        fields = decode_fields(ident)
        peer = PeerId.from_bytes(fields[1])  # type: ignore[arg-type]
        return peer, [Multiaddr.from_bytes(a) for a in decode_repeated(ident, 2)]

    async def connect(self, peer: PeerId, addrs: list[Multiaddr]) -> None:
        req = encode_fields([(1, peer.to_bytes())] + [(2, a.to_bytes()) for a in addrs] + [(3, 10)])
        _, _, writer = await self._request([(1, CONNECT), (2, req)])
        writer.close()

    async def disconnect(self, peer: PeerId) -> None:
        """Close the daemon's connections to ``peer`` (the next connect dials afresh)."""
        _, _, writer = await self._request([(1, DISCONNECT), (7, encode_fields([(1, peer.to_bytes())]))])
        writer.close()

    async def open_stream(self, peer: PeerId, proto: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A stream from the daemon's node to ``peer`` speaking ``proto``, as a unix socket."""
        req = encode_fields([(1, peer.to_bytes()), (2, proto.encode()), (3, 10)])
        _, reader, writer = await self._request([(1, STREAM_OPEN), (3, req)])
        return reader, writer

    async def serve(self, proto: str, socket_path: pathlib.Path) -> None:
        """Streams peers open to the daemon's node for ``proto`` arrive at ``socket_path``
        (each starts with a delimited StreamInfo)."""
        req = encode_fields([(1, _unix_addr(socket_path)), (2, proto.encode()), (3, 0)])
        _, _, writer = await self._request([(1, STREAM_HANDLER), (4, req)])
        writer.close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _unix_addr(path: pathlib.Path) -> bytes:
    """The binary multiaddr ``/unix/<path>`` (code 400, a length-prefixed path), which our
    multiaddr table does not carry."""
    raw = str(path).encode()
    return uvarint(400) + uvarint(len(raw)) + raw


@contextlib.contextmanager
def daemon(binary: pathlib.Path, listen: tuple[str, ...] = LISTEN) -> Iterator[Daemon]:
    """A p2pd listening on ``listen`` (127.0.0.1), stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="p2pd-") as tmp:
        d = Daemon(binary, pathlib.Path(tmp), listen)
        try:
            yield d
        finally:
            d.stop()
