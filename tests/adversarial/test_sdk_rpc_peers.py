"""Bad input on the Lattica SDK's RPC (issue 50), over real connections on 127.0.0.1: a stranger
(another identity, outside the victim's mesh) writes what it likes on ``/rpc/req-resp/1.0.0`` and
``/rpc/stream/1.0.0``. Malformed bincode, pickles, oversized and stalled requests, reused ids,
floods of calls: each is refused or bounded, nothing is unpickled or run that should not be, and
the victim serves an honest caller on."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Iterator

import pytest

import lattica
import lattica.bench
from lattica.config import InboundBudget
from lattica.errors import LatticaError
from lattica.sdk import _wire as w
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"


class Greeter:
    def __init__(self) -> None:
        self.calls = 0

    def hello(self, request: bytes) -> bytes:
        self.calls += 1
        return b"hello, " + request

    async def slow(self, request: bytes) -> bytes:
        await asyncio.sleep(5)
        return b"late"

    def count(self, request: bytes):  # type: ignore[no-untyped-def]
        for i in range(int(request)):
            yield str(i).encode()


@pytest.fixture
def victim() -> Iterator[tuple[lattica.Node, Greeter]]:
    greeter = Greeter()
    with lattica.Node(
        [TCP], membership=False, pubsub=False, crdt=False, inbound=InboundBudget(deadline=1.0), mesh=MeshKey.generate()
    ) as node:
        lattica.sdk.serve(greeter, node=node)
        yield node, greeter


@pytest.fixture
def stranger(victim: tuple[lattica.Node, Greeter]) -> Iterator[lattica.Node]:
    with lattica.Node([TCP], membership=False, pubsub=False, crdt=False, mesh=MeshKey.generate()) as node:
        node.connect(victim[0].addrs[0])
        assert lattica.bench.host_of(victim[0]).circle_of(node.peer_id) == "stranger"
        yield node


async def _ask(caller: lattica.Node, target: lattica.Node, raw: bytes) -> bytes:
    """Write ``raw`` on a fresh req-resp stream, half-close, read the answer to its end (b"" if
    the stream was reset)."""
    stream = await caller.aopen_stream(target.peer_id, w.REQ_RESP)
    stream.write(raw)
    await stream.close()
    got = b""
    try:
        while chunk := await asyncio.wait_for(stream.read(1 << 20), 10):
            got += chunk
    except LatticaError:
        return b""
    return got


def _honest_call_works(stranger: lattica.Node, victim: lattica.Node) -> None:
    answer = stranger.run(_ask(stranger, victim, w.encode_message(w.Request("ok", "Greeter.hello", b"you"))))
    assert w.decode_message(answer) == w.Response("ok", b"hello, you")


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x00",
        b"\x00\x01a\x0bGreeter.hello\xff\xff",  # a bad varint marker
        b"\x00\x01a\x0bGreeter.hello\x05xy\x00",  # data runs past the end
        b"\x07garbage",  # no such message kind
        w.encode_message(w.Response("r", b"an answer where a request is due")),
    ],
    ids=["empty", "cut", "bad-varint", "short-data", "bad-kind", "an-answer"],
)
def test_malformed_requests_reset_the_stream_and_the_node_serves_on(victim, stranger, raw: bytes) -> None:
    node, greeter = victim
    assert stranger.run(_ask(stranger, node, raw)) == b""
    assert greeter.calls == 0
    _honest_call_works(stranger, node)


def test_a_pickled_request_is_answered_with_an_error_and_never_loaded(victim, stranger) -> None:
    node, greeter = victim

    class Bomb:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (greeter.hello, (b"pwned",))  # (what loading it would run)

    raw = w.encode_message(w.Request("p", "Greeter.hello", pickle.dumps(Bomb())))
    answer = w.decode_message(stranger.run(_ask(stranger, node, raw)))
    assert isinstance(answer, w.Failure) and "never unpickles" in answer.error
    assert greeter.calls == 0


def test_a_compressed_or_unknown_call_is_an_error(victim, stranger) -> None:
    node, greeter = victim
    for request, why in [
        (w.Request("c", "Greeter.hello", b"x", compression=2), "uncompressed"),
        (w.Request("u", "Greeter._secret", b"x"), "no method"),
        (w.Request("u", "Greeter.__init__", b"x"), "no method"),
        (w.Request("n", "Nobody.hello", b"x"), "no service"),
    ]:
        answer = w.decode_message(stranger.run(_ask(stranger, node, w.encode_message(request))))
        assert isinstance(answer, w.Failure) and why in answer.error, answer
    assert greeter.calls == 0


def test_a_request_over_a_strangers_budget_loses_its_stream(victim, stranger) -> None:
    """A stranger's request of 20 MiB: over its 16 MiB share of partly received bytes."""
    node, greeter = victim
    head, tail = w.request_parts("big", "Greeter.hello", 20 << 20)

    async def send() -> bool:
        stream = await stranger.aopen_stream(node.peer_id, w.REQ_RESP)
        try:
            stream.write(head)
            block = bytes(1 << 20)
            for _ in range(20):
                stream.write(block)
                await stream.drain()
            stream.write(tail)
            await stream.close()
            return await asyncio.wait_for(stream.read(1), 10) == b""
        except LatticaError:
            return True

    assert stranger.run(send(), timeout=30)
    assert greeter.calls == 0
    _honest_call_works(stranger, node)


async def _stream_frames(caller: lattica.Node, target: lattica.Node, raw: bytes, wait: float = 3.0) -> list[w.Frame]:
    """Write ``raw`` on a fresh ``/rpc/stream/1.0.0`` stream; the frames that come back within
    ``wait`` s, ending with None if the stream was reset or ended."""
    stream = await caller.aopen_stream(target.peer_id, w.STREAM)
    stream.write(raw)
    await stream.drain()
    frames = w.Frames(1 << 20)
    got: list = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    try:
        while (left := deadline - loop.time()) > 0:
            chunk = await asyncio.wait_for(stream.read(1 << 16), left)
            if not chunk:
                got.append(None)
                break
            got += frames.feed(chunk)
    except LatticaError:
        got.append(None)
    except TimeoutError:
        pass
    stream.reset()
    return got


def _call(request_id: str, method: str, data: bytes) -> bytes:
    return w.encode_frame(w.StreamRequest(request_id, method)) + w.encode_frame(w.Data(request_id, data, True))


def test_stream_calls_work_and_garbage_frames_end_the_stream(victim, stranger) -> None:
    node, greeter = victim
    got = stranger.run(_stream_frames(stranger, node, _call("a", "Greeter.count", b"2"), wait=2))
    assert got[:3] == [w.Data("a", b"0", False), w.Data("a", b"1", False), w.Close("a")]
    for raw in [
        (5).to_bytes(4, "big") + b"\x09junk",  # no such frame kind
        (1 << 30).to_bytes(4, "big"),  # a 1 GiB frame announced
        _call("d", "Greeter.hello", b"x") + _call("d", "Greeter.hello", b"y")[:-1],  # an id reused
    ]:
        got = stranger.run(_stream_frames(stranger, node, raw))
        assert got and got[-1] is None, got  # (reset or ended)
    _honest_call_works(stranger, node)


def test_a_stalled_request_loses_its_stream_and_its_bytes(victim, stranger) -> None:
    """A request whose data never ends (no last Data frame): dropped once nothing comes for the
    budget's deadline (1 s here), and the bytes it held are given back."""
    node, _ = victim
    raw = w.encode_frame(w.StreamRequest("s", "Greeter.hello")) + w.encode_frame(w.Data("s", bytes(100_000), False))
    got = stranger.run(_stream_frames(stranger, node, raw, wait=5))
    assert got and got[-1] is None
    assert lattica.bench.host_of(node).runtime.partials.total == 0  # type: ignore[union-attr]
    _honest_call_works(stranger, node)


def test_calls_beyond_a_peers_share_are_told_busy(victim, stranger) -> None:
    """20 slow calls at once on one stream: 16 run, the rest are answered "busy" at once."""
    node, _ = victim
    raw = b"".join(_call(f"c{i}", "Greeter.slow", b"") for i in range(20))
    got = stranger.run(_stream_frames(stranger, node, raw, wait=2), timeout=20)
    busy = [f for f in got if isinstance(f, w.Failure)]
    assert len(busy) == 4 and all("busy" in f.error for f in busy)
