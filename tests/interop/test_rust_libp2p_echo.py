"""Interop with rust-libp2p 0.54 (the GradientHQ Lattica SDK wheel): one stream echoing 64 MiB,
over TCP (Noise, yamux) and QUIC. The SDK opens no raw streams, so the echo is its RPC: our node
opens ``/rpc/req-resp/1.0.0`` on the SDK node (``sdk_peer.py serve``), writes one bincode
``RpcMessage::Request`` carrying 64 MiB and half-closes; the SDK reads it to EOF, calls the Python
method ``Echo.echo`` and writes ``RpcMessage::Response`` with the same bytes, which we read to EOF.
The wire format and its source: lattica/sdk/_wire.py.

The payload crosses the SDK's Python layer as raw bytes (sdk_peer.py's ``Raw``, which the SDK
takes for a protobuf class): nothing is pickled, and we never unpickle."""

from __future__ import annotations

import hashlib
import os

import pytest

import lattica
from lattica.bench._peers import sdk_rpc
from lattica.bench.libp2p import sdk_responder
from lattica.sdk._wire import Response

LISTEN = {"tcp": "/ip4/127.0.0.1/tcp/0", "quic": "/ip4/127.0.0.1/udp/0/quic-v1"}
SIZE = 64 << 20


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_one_stream_echoes_64_mib_through_rust_libp2p(sdk_python, transport):
    """Our yamux (TCP) or QUIC stream carries 64 MiB to rust-libp2p and 64 MiB back on the same
    stream, half-closed in between, as its request-response protocol wants."""
    data = os.urandom(SIZE)
    digest = hashlib.sha256(data).hexdigest()
    with sdk_responder(sdk_python) as sdk, lattica.Node([LISTEN[transport]]) as node:
        addr = next(a for a in sdk.hello["addrs"] if ("/quic-v1" in a) == (transport == "quic"))
        info = node.connect(addr)
        assert info.transport == transport and sdk_rpc.PROTOCOL in info.protocols

        async def call() -> dict:
            stream = await node.aopen_stream(info.peer_id, sdk_rpc.PROTOCOL)
            # (an answer longer than the echo is a ValueError)
            return await sdk_rpc.call(stream, "lattica-echo-1", "Echo.echo", data, limit=SIZE + 1024)

        answer = node.run(call(), timeout=100)
        report = sdk.report()
    assert isinstance(answer, Response), answer
    assert answer.id == "lattica-echo-1" and answer.compression is None
    assert len(answer.data) == SIZE and hashlib.sha256(answer.data).hexdigest() == digest
    assert report["echoed"] == [{"size": SIZE, "sha256": digest}]  # (the SDK's Python got our bytes as sent)
