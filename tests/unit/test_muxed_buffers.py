"""A Noise-sealed MuxedConnection reuses its sealing buffer only when the writer holds none of it."""

import asyncio
import hashlib
import os

from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica.transports.muxed import MuxedConnection
from lattica.transports.noise import NoiseHandshake

_ADDR = Multiaddr("/ip4/127.0.0.1/tcp/1")


class _Writer:
    """A byte pipe to ``peer``. ``hold=True`` keeps references to what it is given (as an asyncio
    transport does with a partly sent buffer on newer Pythons) and delivers them only later;
    otherwise it copies and delivers at once."""

    def __init__(self, hold: bool) -> None:
        self.hold = hold
        self.peer: MuxedConnection | None = None
        self.held: list = []

    def write(self, data) -> None:
        if self.hold:
            self.held.append(data)
        else:
            self.peer.data_received(bytes(data))

    def release(self) -> None:
        held, self.held = self.held, []
        for data in held:
            self.peer.data_received(bytes(data))

    def get_write_buffer_size(self) -> int:
        return sum(len(d) for d in self.held)

    def close(self) -> None:
        pass

    abort = close

    def is_closing(self) -> bool:
        return False


def _pair(hold: bool) -> tuple[MuxedConnection, MuxedConnection, _Writer]:
    ka, kb = KeyPair.generate(), KeyPair.generate()
    a, b = NoiseHandshake(ka, True, kb.peer_id), NoiseHandshake(kb, False)
    to_b = a.start()
    while not (a.complete and b.complete):
        to_a = b.receive(to_b) if to_b else b""
        to_b = a.receive(to_a) if to_a and not a.complete else b""
    wa, wb = _Writer(hold), _Writer(False)
    common = dict(transport="tcp", local_addr=_ADDR, remote_addr=_ADDR, keepalive_interval=0, writer_lets_go=True)
    ca = MuxedConnection(
        wa, direction="outbound", local_peer=ka.peer_id, remote_peer=kb.peer_id, session=a.session, **common
    )
    cb = MuxedConnection(
        wb, direction="inbound", local_peer=kb.peer_id, remote_peer=ka.peer_id, session=b.session, **common
    )
    wa.peer, wb.peer = cb, ca
    return ca, cb, wa


async def _send_and_check(hold: bool) -> MuxedConnection:
    ca, cb, wa = _pair(hold)
    got: list[bytes] = []
    done = asyncio.Event()

    async def serve(stream) -> None:
        h = hashlib.sha256()
        while data := await stream.read(1 << 20):
            h.update(data)
        got.append(h.digest())
        done.set()

    cb.set_stream_handler(lambda s: asyncio.get_running_loop().create_task(serve(s)))

    async def deliver_late() -> None:  # what a held writer holds goes out a little later
        while True:
            await asyncio.sleep(0.002)
            wa.release()

    releaser = asyncio.get_running_loop().create_task(deliver_late())
    blobs = [os.urandom(n) for n in (200_000, 70_000, 5, 300_000, 1_000, 250_000)]
    stream = await ca.open_stream()
    for blob in blobs:
        stream.write(blob)
        await asyncio.sleep(0)  # each write is sealed and flushed on its own
        await asyncio.sleep(0)
    await asyncio.wait_for(stream.close(), 5)
    await asyncio.wait_for(done.wait(), 5)
    releaser.cancel()
    assert got == [hashlib.sha256(b"".join(blobs)).digest()]
    return ca


def test_sealing_buffer_is_reused_when_the_writer_keeps_nothing():
    async def main():
        ca = await _send_and_check(hold=False)
        spare = ca._spare
        assert spare is not None and len(spare) >= 300_000  # the buffer kept for the next write
        ca._schedule_flush()
        (await ca.open_stream()).write(b"x" * 1000)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert ca._spare is spare  # sealed into it again, not into a fresh buffer

    asyncio.run(main())


def test_sealing_buffer_is_not_reused_while_the_writer_holds_it():
    # were a held buffer sealed into again, the bytes delivered later would be corrupt: the
    # receiver would fail to decrypt them and the digest would not match
    async def main():
        ca = await _send_and_check(hold=True)
        assert ca._spare is None

    asyncio.run(main())


def test_credit_and_a_reset_for_a_stream_with_pending_data_leave_the_connection_open():
    """The honest case of issue 46's finding 3: a node resets one call channel of a member while
    the member has data waiting for credit on it; the member's connection stays."""
    from lattica.transports.mux import FRAME_HEADER, T_WINDOW

    async def go():
        ca, cb, wa = _pair(hold=False)
        s = await ca.open_stream()
        s.write(os.urandom(1 << 20))  # (more than the window: the rest waits for credit)
        assert s._pending
        frame = FRAME_HEADER.pack(0, T_WINDOW, 8, s.stream_id, 4096)  # credit and RST together
        cb._mux._tail += frame  # (as the peer's mux would queue it)
        cb._flush()
        await asyncio.sleep(0)
        assert not ca.is_closed, "the whole connection was torn down"
        s2 = await ca.open_stream()  # (and it still carries new streams)
        assert s2.stream_id != s.stream_id
        ca.close()
        cb.close()

    asyncio.run(go())


class _PausableWriter:
    """A writer that records what it is sent and whether reading is paused (an asyncio socket)."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.paused = False

    def write(self, data) -> None:
        self.out += data

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass

    abort = close

    def is_closing(self) -> bool:
        return False


def test_opens_before_the_gate_wait_unread_and_then_go_as_the_gate_allows():
    """A connection made with ``hold_opens`` parses none of the peer's SYNs before its owner
    gives a gate (they came with the handshake, before adoption), stops reading meanwhile, and
    then lets them through as far as the gate allows."""
    from lattica.transports.mux import F_RST, F_SYN, FRAME_HEADER, T_PING, T_WINDOW

    async def main():
        ka, kb = KeyPair.generate(), KeyPair.generate()
        w = _PausableWriter()
        conn = MuxedConnection(
            w,
            transport="tcp",
            direction="inbound",
            local_peer=ka.peer_id,
            remote_peer=kb.peer_id,
            local_addr=_ADDR,
            remote_addr=_ADDR,
            session=None,
            keepalive_interval=0,
            hold_opens=True,
        )
        opened = []
        conn.data_received(b"".join(FRAME_HEADER.pack(0, T_WINDOW, F_SYN | F_RST, 2 * i + 1, 0) for i in range(100)))
        assert conn._mux.held and not w.paused, "held (no gate yet), still read: a bare dial must see its peer close"
        conn.data_received(FRAME_HEADER.pack(0, T_PING, 0, 0, 7) * 100_000)  # (1.2 MB more behind the held SYN)
        assert w.paused, "past a bound, an ungated connection's socket waits unread"
        grants = [10, 0]
        conn.meter_opens(lambda n: (grants.pop(0), 0.05) if grants else (0, 0.05))
        conn.set_stream_handler(opened.append)
        await asyncio.sleep(0.01)
        assert len(opened) == 10 and w.paused, len(opened)
        grants[:] = [90]
        await asyncio.sleep(0.1)
        assert len(opened) == 100 and not w.paused and not conn._mux.held
        conn.abort("done")

    asyncio.run(main())


def test_opens_handed_over_already_opened_pass_the_gate_without_more_bytes():
    """A libp2p listener's first frames can come right behind its answer to our lazy muxer
    proposal, opened before the connection took them (``receive_plain``): its stream opens, held
    for the gate, are taken although no byte follows them (rust-libp2p then waits for us)."""
    from lattica.transports.mux import Mux  # (the peer's side: a bare mux writing a SYN)

    async def run() -> list:
        k = KeyPair.generate()
        conn = MuxedConnection(
            _PausableWriter(),
            transport="tcp",
            direction="outbound",
            local_peer=k.peer_id,
            remote_peer=KeyPair.generate().peer_id,
            local_addr=_ADDR,
            remote_addr=_ADDR,
            session=None,
            keepalive_interval=0,
            hold_opens=True,
        )
        opened: list = []
        conn.set_stream_handler(opened.append)
        conn.meter_opens(lambda asked: (asked, 0.0))
        await asyncio.sleep(0)
        peer = Mux(False)
        peer.open_stream()
        conn.receive_plain(bytes(peer.data_to_send()))
        for _ in range(10):
            await asyncio.sleep(0)
        conn.abort("done")
        return opened

    assert len(asyncio.run(run())) == 1
