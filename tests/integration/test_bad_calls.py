"""Call channels against a hostile caller (a helper's hostile review, 2026-11-27): what a peer
that speaks the call protocol by hand can make a node hold or do, and the defined outcome."""

import asyncio
import time

import pytest

import lattica
from lattica import _rpc as rpc
from lattica import codec
from lattica._runtime.limits import CALL_CHANNELS, MAX_STREAM_ARGS
from lattica._runtime.refs import StreamArg
from lattica.errors import StreamReset
from lattica.transports.mux import F_SYN, FRAME_HEADER, T_PING
from tests.integration.test_bad_input import _hostport, _raw_secure


@lattica.actor
class Target:
    async def hello(self, x):
        return x

    async def nap(self, x):
        await asyncio.sleep(0.3)
        return x


@pytest.fixture
def server():
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], mesh="open") as node:  # (a hand-made caller is a member)
        node.run(_spawn_target())
        yield node


async def _spawn_target():
    await Target.options(name="target").remote()._spawn


def _frame(msg) -> bytes:
    body = b"".join(bytes(c) for c in codec.encode(msg))
    return len(body).to_bytes(4, "big") + body


@pytest.fixture
def probe(server):
    """A well-behaved node (it identifies itself, as a caller does) that hand-writes call channels."""
    with lattica.Node([]) as node:
        node.connect(server.addrs[0])
        yield node


def _run(probe, server, body):
    """Run ``body(open_channel)`` on the probe's loop; ``open_channel()`` opens a call channel to
    ``server`` on the probe's connection and writes nothing on it."""

    async def go():
        return await body(lambda: probe.aopen_stream(server.peer_id, rpc.PROTOCOL))

    return probe.run(go(), timeout=60)


async def _replies(s, n, timeout=5.0):
    """The next ``n`` messages on a call channel."""
    splitter = rpc.FrameSplitter(1 << 26)
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        data = await asyncio.wait_for(s.read(1 << 20), max(0.01, deadline - time.monotonic()))
        if not data:
            break
        out += [codec.decode(f) for f in splitter.feed(data)]
    return out


def _still_serves(server):
    with lattica.Node([]) as probe:
        probe.connect(server.addrs[0])
        assert probe.ping(server.peer_id) > 0


def test_call_channels_per_connection_are_capped(server, probe):
    """Each call channel holds its own replies and unread calls: a peer opening many on one
    connection gets those beyond CALL_CHANNELS reset."""

    async def body(open_channel):
        chans = [await open_channel() for _ in range(CALL_CHANNELS + 4)]
        served = 0
        for s in chans:
            try:
                s.write(_frame(rpc.call(1, "target", "hello", [1], {}, None, 0)))
                served += len(await _replies(s, 1, timeout=3.0)) == 1
            except (TimeoutError, StreamReset):
                pass
        return served

    assert _run(probe, server, body) == CALL_CHANNELS
    _still_serves(server)


def test_repeated_call_id_is_refused(server, probe):
    async def body(open_channel):
        s = await open_channel()
        call = _frame(rpc.call(7, "target", "nap", ["a"], {}, None, 0))  # (the first still runs when the second comes)
        s.write(call + call)
        return await _replies(s, 2)

    got = _run(probe, server, body)
    kinds = sorted((m[0], m[2] if m[0] == rpc.ERR else None) for m in got)
    assert (rpc.ERR, rpc.E_PROTOCOL) in kinds and (rpc.OK, None) in kinds


@pytest.mark.parametrize(
    "indexes", [[i % MAX_STREAM_ARGS for i in range(10_000)], [0, 0]], ids=["too many", "repeated"]
)
def test_streamed_arguments_are_checked_by_the_callee(server, probe, indexes):
    """The caller's side allows at most MAX_STREAM_ARGS streamed arguments, each its own index
    (an index beyond them does not even decode): a hand-made call that breaks that is refused,
    and makes no streams (each would have been granted credit at once)."""

    async def body(open_channel):
        s = await open_channel()
        s.write(_frame(rpc.call(1, "target", "hello", [StreamArg(i) for i in indexes], {}, None, rpc.F_ARGSTREAM)))
        return await _replies(s, 1)

    (msg,) = _run(probe, server, body)
    assert msg[0] == rpc.ERR and msg[2] == rpc.E_PROTOCOL and "streams at most" in msg[4]


def test_a_body_of_millions_of_lists_is_refused_early(server, probe):
    """A few MiB of one-byte empty lists would decode into millions of list objects (GBs and
    seconds of the loop): the frame is refused once it holds more than max_containers."""
    n, k = 900_000, 4  # (each list within max_items: it is their sum that costs)
    msg = bytearray(b"\x98\x00\x01\xa6target\xa5hello\x94")
    for _ in range(k):
        msg += b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n
    msg += b"\xc0\xc0\x00"
    frame = b"\x01\x00\x00\x00" + len(msg).to_bytes(4, "little") + bytes(msg)  # (a codec frame: header, then the body)

    async def body(open_channel):
        s = await open_channel()
        t0 = time.monotonic()
        s.write(len(frame).to_bytes(4, "big") + frame)
        with pytest.raises(StreamReset):  # (the channel is reset: the caller broke the protocol)
            await asyncio.wait_for(s.read(), 30)
        return time.monotonic() - t0

    assert _run(probe, server, body) < 10  # (seconds of one core and GBs before; ~0.2 s now)
    _still_serves(server)


def test_mux_pings_from_a_peer_that_never_reads_close_the_connection(server):
    """Pongs queue while the peer does not read its socket: past 1 MiB of them the connection is
    dropped, instead of holding up to the 256 MiB cap on unsent bytes."""

    async def main():
        reader, writer, session = await _raw_secure(*_hostport(server))
        pings = FRAME_HEADER.pack(0, T_PING, F_SYN, 0, 1) * 5000
        for sent in range(1000):  # up to ~57 MiB of pings, never reading a pong
            try:
                writer.write(session.seal(pings))
                await asyncio.wait_for(writer.drain(), 5.0)
            except ConnectionError:
                return sent
        return None

    cut_at = asyncio.run(main())
    assert cut_at is not None and cut_at < 500  # (~9 MiB in here: the kernel's socket buffers hold the rest)
    _still_serves(server)


def test_replies_a_caller_does_not_read_are_bounded_across_its_channels(server, probe):
    """Calls whose (bigger) refusals the caller never reads, on every channel it may open: the
    callee stops reading calls once the replies waiting on all of them pass the high-water mark,
    not once per channel."""
    from lattica._runtime.limits import CHANNEL_HIGH_WATER

    calls = b"".join(_frame(rpc.call(i, "nobody", "m", [], {}, None, 0)) for i in range(2000))

    async def body(open_channel):
        chans = [await open_channel() for _ in range(CALL_CHANNELS)]
        for _ in range(12 * 2**20 // len(calls)):  # ~12 MiB of calls a channel, ~4x that in refusals
            for s in chans:
                s.write(calls)
        await asyncio.sleep(5)  # (never read: the replies wait at the callee)

    _run(probe, server, body)

    async def backlog():
        rt = server._host.runtime
        return sum(ch.writer.backlog() for ch in rt._serving.get(probe.peer_id, ()))

    held = server.run(backlog())
    assert held > CHANNEL_HIGH_WATER // 2  # (the caller did make it hold replies)
    # one high-water mark for the connection, plus what each channel's last read of calls made
    # (a read is at most 1 MiB of calls: ~4.5 MiB of refusals); each channel alone: ~4 x 20 MiB
    assert held < CHANNEL_HIGH_WATER + CALL_CHANNELS * 5 * 2**20
    _still_serves(server)
