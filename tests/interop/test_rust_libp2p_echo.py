"""Interop with rust-libp2p 0.54 (the GradientHQ Lattica SDK wheel): one stream echoing 64 MiB,
over TCP (Noise, yamux) and QUIC. The SDK opens no raw streams, so the echo is its RPC: our node
opens ``/rpc/req-resp/1.0.0`` on the SDK node, writes one bincode ``RpcMessage::Request`` carrying
64 MiB and half-closes; the SDK reads it to EOF, calls the Python method ``Echo.echo`` and writes
``RpcMessage::Response`` with the same bytes, which we read to EOF.

The wire format (``GradientHQ/lattica@98318ba:lattica/src/rpc/protocol.rs``, ``RpcCodec``; the
1.0.21 wheel answered it byte for byte): bincode 2, ``config::standard()`` (varint integers,
little endian, no size limit), read with ``read_to_end``, so neither side caps the message;
``enum RpcMessage { Request{id: String, method: String, data: Vec<u8>, compression:
Option<CompressionAlgorithm>}, Response{id, data, compression}, Error{id, error: String} }``.
The SDK compresses only when configured (``compression_algorithm`` defaults to None, and its
Python API cannot set it); the request times out after 3 minutes (``behaviour.rs``).

The payload crosses the SDK's Python layer as raw bytes (``sdk_echo_peer.Raw``, which the SDK
takes for a protobuf class): nothing is pickled, and we never unpickle."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import subprocess
from collections.abc import Iterator

import pytest

import lattica

LISTEN = {"tcp": "/ip4/127.0.0.1/tcp/0", "quic": "/ip4/127.0.0.1/udp/0/quic-v1"}
ECHO_PEER = pathlib.Path(__file__).resolve().parent / "sdk_echo_peer.py"
RPC = "/rpc/req-resp/1.0.0"
SIZE = 64 << 20

# -- bincode 2 (standard config), only what RpcMessage needs; sans-IO -------------------------

_WIDTH = {251: 2, 252: 4, 253: 8, 254: 16}  # a varint's marker byte -> the little-endian integer's bytes


def _varint(n: int) -> bytes:
    """bincode's varint: below 251 one byte, else a marker byte and the integer, little endian."""
    if n < 251:
        return bytes([n])
    for marker, width in _WIDTH.items():
        if n < 1 << (8 * width):
            return bytes([marker]) + n.to_bytes(width, "little")
    raise ValueError(f"{n} does not fit in 128 bits")


def _text(s: str) -> bytes:
    """A String: its UTF-8 length, then the bytes."""
    raw = s.encode()
    return _varint(len(raw)) + raw


def request_frame(request_id: str, method: str, size: int) -> tuple[bytes, bytes]:
    """``RpcMessage::Request`` without compression, as the bytes before ``size`` bytes of data and
    the bytes after them (so the data is written as it is, never copied into one message)."""
    return b"\x00" + _text(request_id) + _text(method) + _varint(size), b"\x00"  # (variant 0; data; None)


def _uint(buf: memoryview, pos: int) -> tuple[int, int]:
    """A varint at ``pos``: (its value, the position after it)."""
    marker = buf[pos]
    if marker < 251:
        return marker, pos + 1
    width = _WIDTH.get(marker)
    if width is None or pos + 1 + width > len(buf):
        raise ValueError(f"bad varint at {pos}")
    return int.from_bytes(buf[pos + 1 : pos + 1 + width], "little"), pos + 1 + width


def _blob(buf: memoryview, pos: int) -> tuple[memoryview, int]:
    """A length-prefixed String or Vec<u8> at ``pos``: (a view of it, the position after it)."""
    n, pos = _uint(buf, pos)
    if pos + n > len(buf):
        raise ValueError(f"a field of {n} bytes at {pos} runs past the message's end")
    return buf[pos : pos + n], pos + n


def decode_message(buf: bytes | bytearray) -> dict:
    """One whole ``RpcMessage`` (a stream read to EOF): ``{"kind", "id", ...}``; data stays a view."""
    view = memoryview(buf)
    variant, pos = _uint(view, 0)
    raw_id, pos = _blob(view, pos)
    out: dict = {"id": bytes(raw_id).decode()}
    if variant == 2:
        error, pos = _blob(view, pos)
        out.update(kind="error", error=bytes(error).decode())
    elif variant in (0, 1):
        if variant == 0:
            method, pos = _blob(view, pos)
            out["method"] = bytes(method).decode()
        data, pos = _blob(view, pos)
        tag, pos, compression = view[pos], pos + 1, None
        if tag == 1:  # Some(CompressionAlgorithm): its variant, of None, Gzip, Zstd, Lz4, Brotli
            compression, pos = _uint(view, pos)
        elif tag != 0:
            raise ValueError(f"bad Option tag {tag}")
        out.update(kind="request" if variant == 0 else "response", data=data, compression=compression)
    else:
        raise ValueError(f"unknown RpcMessage variant {variant}")
    if pos != len(view):
        raise ValueError(f"{len(view) - pos} bytes after the message")
    return out


# -- the SDK node --------------------------------------------------------------------------------


@contextlib.contextmanager
def _sdk_echo(sdk_python: pathlib.Path) -> Iterator[tuple[dict, dict]]:
    """An SDK node serving ``Echo.echo``: yields (its PeerId and addresses, a dict that receives
    what it echoed once the block ends)."""
    home = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "lattica-sdk-home"  # (its key and DHT go there)
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "RUST_LOG"}  # (its tracing would print on stdout)
    proc = subprocess.Popen(
        [str(sdk_python), str(ECHO_PEER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=home,
        env={**env, "HOME": str(home)},
    )
    assert proc.stdout is not None and proc.stdin is not None
    report: dict = {}
    try:
        yield json.loads(proc.stdout.readline()), report
        proc.stdin.close()
        report.update(json.loads(proc.stdout.readline()))
    finally:
        if not proc.stdin.closed:
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_one_stream_echoes_64_mib_through_rust_libp2p(sdk_python, transport):
    """Our yamux (TCP) or QUIC stream carries 64 MiB to rust-libp2p and 64 MiB back on the same
    stream, half-closed in between, as its request-response protocol wants."""
    data = os.urandom(SIZE)
    digest = hashlib.sha256(data).hexdigest()
    with _sdk_echo(sdk_python) as (hello, report), lattica.Node([LISTEN[transport]]) as node:
        addr = next(a for a in hello["addrs"] if ("/quic-v1" in a) == (transport == "quic"))
        info = node.connect(addr)
        assert info.transport == transport and RPC in info.protocols

        async def call() -> bytearray:
            stream = await node._host.open_stream(info.peer_id, RPC)
            head, tail = request_frame("lattica-echo-1", "Echo.echo", SIZE)
            stream.write(head)
            view = memoryview(data)
            for at in range(0, SIZE, 1 << 20):
                stream.write(view[at : at + (1 << 20)])
                await stream.drain()
            stream.write(tail)
            await stream.close()  # (half-close: the SDK reads the request to EOF)
            got = bytearray()
            while chunk := await stream.read(1 << 20):
                got += chunk
                assert len(got) <= SIZE + 1024, "the answer is longer than the echo"
            return got

        answer = decode_message(node.run(call(), timeout=100))
    assert answer["kind"] == "response", answer
    assert answer["id"] == "lattica-echo-1" and answer["compression"] is None
    assert len(answer["data"]) == SIZE and hashlib.sha256(answer["data"]).hexdigest() == digest
    assert report["echoed"] == [{"size": SIZE, "sha256": digest}]  # (the SDK's Python got our bytes as sent)
