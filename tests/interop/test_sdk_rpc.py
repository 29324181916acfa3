"""Our node and a Lattica SDK node (1.0.21, rust-libp2p) calling each other's RPC methods (issue
50), on 127.0.0.1: unary over ``/rpc/req-resp/1.0.0`` and streaming over ``/rpc/stream/1.0.0``,
both ways, bytes as they are (what the SDK hands a protobuf-typed method); a pickled payload is
refused both ways, and nothing is unpickled here."""

from __future__ import annotations

import asyncio
import hashlib
import os
import pathlib
import subprocess
import sys

import pytest

import lattica
from lattica.bench import host_of
from lattica.bench._peers.sdk_node import SdkError, SdkNode
from lattica.errors import PickleRefused, SdkCallError

pytestmark = pytest.mark.timeout(120)


class Greeter:
    """What our node serves to SDK nodes."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []

    def hello(self, request: bytes) -> bytes:
        self.seen.append(request)
        return b"hello, " + request

    async def digest(self, request: bytes) -> bytes:
        return hashlib.sha256(request).digest()

    def count(self, request: bytes):  # type: ignore[no-untyped-def]
        """A streaming method: ``int(request)`` items."""
        for i in range(int(request)):
            yield f"item {i}".encode()

    def fails(self, request: bytes) -> bytes:
        raise ValueError("no such thing")


def test_the_sdk_calls_us(sdk_python):
    greeter = Greeter()
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], membership=False, pubsub=False, crdt=False) as node:
        assert lattica.sdk.serve(greeter, node=node) == "Greeter"
        me = str(node.peer_id)

        async def run() -> None:
            async with await SdkNode.start(sdk_python, [str(node.addrs[0])]) as sdk:
                assert await sdk.rpc(me, "Greeter.hello", b"sdk") == b"hello, sdk"
                assert greeter.seen == [b"sdk"]
                big = os.urandom(3 << 20)
                assert await sdk.rpc(me, "Greeter.digest", big) == hashlib.sha256(big).digest()
                # over the stream protocol: a method that answers once, and a streaming one
                assert await sdk.rpc(me, "Greeter.digest", big, how="stream") == hashlib.sha256(big).digest()
                assert await sdk.rpc(me, "Greeter.count", b"4", how="iter") == [f"item {i}".encode() for i in range(4)]
                # errors come back as errors, saying what failed
                with pytest.raises(SdkError, match="no such thing"):
                    await sdk.rpc(me, "Greeter.fails", b"x")
                with pytest.raises(SdkError, match="no service 'Nobody'"):
                    await sdk.rpc(me, "Nobody.hello", b"x")
                # a pickled request (the SDK's stub for an untyped method) is refused unread
                with pytest.raises(SdkError, match="never unpickles"):
                    await sdk.rpc_pickled(me, "Greeter.hello")
                assert greeter.seen == [b"sdk"]

        node.run(run(), timeout=90)


def test_we_call_the_sdk(sdk_python):
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], membership=False, pubsub=False, crdt=False) as node:

        async def run() -> None:
            async with await SdkNode.start(sdk_python, [str(node.addrs[0])]) as sdk:
                echo = lattica.sdk.stub(sdk.peer_id, "Echo", node=node)
                deadline = asyncio.get_running_loop().time() + 15
                while sdk.peer_id not in [str(p.peer_id) for p in host_of(node).peers()]:  # (it dials us)
                    assert asyncio.get_running_loop().time() < deadline, "the SDK node never connected"
                    await asyncio.sleep(0.05)
                assert await echo.echo.remote(b"ping") == b"ping"
                big = os.urandom(5 << 20)
                assert await echo.echo.remote(big) == big
                items = [item async for item in echo.count.stream(b"5")]
                assert items == [str(i).encode() for i in range(5)]
                with pytest.raises(SdkCallError):
                    await echo.nothing.remote(b"x")
                # an untyped SDK method answers with a pickle: refused, never loaded
                with pytest.raises(PickleRefused):
                    await echo.legacy.remote()

        node.run(run(), timeout=90)


def test_the_example_runs_as_written(sdk_python):
    """examples/sdk_interop.py, as a user runs it: an SDK node and a Lattica actor call each other."""
    root = pathlib.Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "examples/sdk_interop.py", "--sdk-python", str(sdk_python)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "the SDK node got:   HELLO FROM THE SDK" in out.stdout
    assert "the actor got:      echo: hello from a Lattica actor" in out.stdout
