"""Relayed connections: a Noise-secured, multiplexed Connection inside one stream through a relay.

Dialing ``/<relay addr>/p2p/<relay>/p2p-circuit/p2p/<peer>`` opens a ``hop`` stream to the relay
and asks it to connect us to ``<peer>``; the relay opens a ``stop`` stream to the peer (who holds a
reservation with it) and, once both accept, copies bytes between the two streams. The two ends then
run the same Noise XX handshake and mux as over TCP, end to end: the relay sees only ciphertext and
cannot forge traffic; each end authenticates the other's PeerId itself.

When both ends reach the relay over TCP they may ask it to *splice* instead: the relay answers
with a one-time token for each end, each end opens a fresh TCP connection to the relay presenting
its token, and the relay pairs the two sockets and copies raw bytes (``transports/splice.py``).
Noise then runs end to end on that socket; the relay no longer decrypts and re-encrypts each hop.
If the spliced socket cannot be set up, the dialer falls back to the in-stream circuit.

Wire messages (one length-prefixed codec map each way before the raw bytes start) are built and
checked here; the relay side lives in ``actors/nat/relay.py``.

libp2p's circuit relay v2 (``transports/circuit_v2.py``) works the same way with protobuf
messages; its circuits carry a libp2p connection, upgraded like a TCP socket
(``transports/upgrade.py``). We dial through a libp2p relay with it, and accept the circuits it
brings us on ``/libp2p/circuit/relay/0.2.0/stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from lattica._framing import read_delimited, read_message, write_delimited, write_message
from lattica._identity import KeyPair, PeerId
from lattica._multiaddr import Multiaddr
from lattica.errors import HandshakeError, LatticaError, MultiaddrError, ProtocolError, RelayRefused, Timeout
from lattica.logging import get_logger
from lattica.transports import circuit_v2 as v2
from lattica.transports.base import Connection, ConnectionHandler, Listener, Stream, Transport
from lattica.transports.mux import MuxConfig
from lattica.transports.muxed import MuxedConnection
from lattica.transports.noise import NoiseHandshake
from lattica.transports.splice import TOKEN_LEN, SpliceUnreachable
from lattica.transports.upgrade import Libp2pUpgrade, Up

log = get_logger("lattica.circuit")

__all__ = ["CircuitTransport", "HOP", "STOP", "split_circuit", "circuit_addr"]

HOP = "/lattica/relay/hop/1"  # source -> relay: "connect me to this peer"
STOP = "/lattica/relay/stop/1"  # relay -> reserved peer: "this peer wants to connect to you"
MAX_MESSAGE = 4096
_READ_CHUNK = 1 << 20
_HIGH_WATER = 1 << 20  # bytes queued on the relay stream before the inner connection pauses

_SPLICE_BACKOFF = 300.0  # seconds without splicing through a relay after a spliced socket failed there

# a hop stream to the relay, the connection it is on, and whether it speaks circuit relay v2
OpenHop = Callable[[PeerId, list[Multiaddr]], Awaitable[tuple[Stream, Connection, bool]]]
# the relay's TCP listener to open a spliced socket to, for circuits negotiated on this connection
# to the relay; None: this node cannot splice there
SpliceAddr = Callable[[Connection], "Multiaddr | None"]
# (relay's TCP address, token, expected peer, Noise initiator, circuit address) -> connection
SpliceDial = Callable[[Multiaddr, bytes, PeerId, bool, Multiaddr], Awaitable[Connection]]


def split_circuit(addr: Multiaddr) -> tuple[list[Multiaddr], PeerId, PeerId | None]:
    """``(relay addresses, relay PeerId, target PeerId or None)`` of a circuit address."""
    parts = list(addr)
    try:
        cut = [n for n, _ in parts].index("p2p-circuit")
    except ValueError:
        raise MultiaddrError(f"{addr} is not a circuit address") from None
    relay_part = parts[:cut]
    if not relay_part or relay_part[-1][0] != "p2p":
        raise MultiaddrError(f"{addr}: the relay must be named by /p2p/<id> before /p2p-circuit")
    relay = PeerId.from_string(relay_part[-1][1])  # type: ignore[arg-type]
    rest = parts[cut + 1 :]
    if len(rest) > 1 or (rest and rest[0][0] != "p2p"):
        raise MultiaddrError(f"{addr}: only /p2p/<id> may follow /p2p-circuit")
    target = PeerId.from_string(rest[0][1]) if rest else None  # type: ignore[arg-type]
    relay_addrs = [Multiaddr._from_parts(tuple(relay_part[:-1]))] if len(relay_part) > 1 else []
    return relay_addrs, relay, target


def circuit_addr(relay_addr: Multiaddr, relay: PeerId) -> Multiaddr:
    """The address others dial to reach us through ``relay`` at ``relay_addr``."""
    return relay_addr.with_peer_id(relay).encapsulate("/p2p-circuit")


# -- wire messages (shared with the relay) ------------------------------------------------------


def limit_wire(duration: float | None, data: int | None) -> dict:
    return {"duration": duration, "bytes": data}


def parse_connect(msg: Any) -> PeerId:
    """The peer named by a hop or stop ``connect`` request; raises ProtocolError."""
    if type(msg) is not dict or msg.get("type") != "connect" or type(msg.get("peer")) is not bytes:
        raise ProtocolError("a relay request is {type: 'connect', peer: <PeerId bytes>}")
    try:
        return PeerId.from_bytes(msg["peer"])
    except LatticaError as e:
        raise ProtocolError(f"relay request names no valid peer: {e}") from None


def splice_token(msg: dict) -> bytes | None:
    """The splice token a relay message carries, if it carries a well-formed one."""
    token = msg.get("splice")
    return token if type(token) is bytes and len(token) == TOKEN_LEN else None


def refusal(code: str, why: str) -> dict:
    return {"ok": False, "code": code, "error": why[:300]}


def check_answer(msg: Any, who: str) -> dict:
    """A relay answer that says ok; raises RelayRefused with the relay's reason otherwise."""
    if type(msg) is not dict or type(msg.get("ok")) is not bool:
        raise ProtocolError(f"{who} sent a malformed relay answer")
    if not msg["ok"]:
        code, why = msg.get("code"), msg.get("error")
        raise RelayRefused(
            f"{who} refused the circuit: {code if type(code) is str else '?'}: {why if type(why) is str else ''}"
        )
    return msg


def _limits(limit: v2.Limit | None) -> tuple[int, int] | None:
    """A libp2p relay's limit as a connection's ``relay_limit`` (None: it set none)."""
    return (limit.duration, limit.data) if limit is not None and (limit.duration or limit.data) else None


# -- the byte pipe under a relayed MuxedConnection -----------------------------------------------


class _StreamPipe:
    """Lets a MuxedConnection write into a relay stream (the ByteWriter interface)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.conn: MuxedConnection | None = None
        self._closing = False
        self._draining = False
        self.sent = self.received = 0  # bytes through the circuit (the dashboard's figures)

    def bytes_counted(self) -> tuple[int, int]:
        return self.sent, self.received

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        self.sent += len(data)
        try:
            self.stream.write(bytes(data) if isinstance(data, memoryview) else data)
        except LatticaError as e:
            self._lost(e)
            return
        if not self._draining and self.stream.write_buffer_size() > _HIGH_WATER and self.conn is not None:
            self._draining = True
            self.conn.pause_writing()
            asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            await self.stream.drain()
        except LatticaError as e:
            self._lost(e)
            return
        finally:
            self._draining = False
        if self.conn is not None:
            self.conn.resume_writing()

    def _lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.conn.connection_lost(exc)

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            asyncio.get_running_loop().create_task(self._close())

    async def _close(self) -> None:
        try:
            await asyncio.wait_for(self.stream.close(), 2.0)
        except (TimeoutError, LatticaError):
            self.stream.reset()

    def abort(self) -> None:
        self._closing = True
        self.stream.reset()

    def is_closing(self) -> bool:
        return self._closing

    def get_write_buffer_size(self) -> int:
        return self.stream.write_buffer_size()


class _SpliceFailed(LatticaError):
    """The spliced socket could not be set up (the in-stream circuit may still work)."""


class _CircuitListener(Listener):
    def __init__(self) -> None:
        self.addrs = []

    async def close(self) -> None:
        return None


class CircuitTransport(Transport):
    """Dials ``/p2p-circuit`` addresses through relays and accepts circuits relays bring to us."""

    name = "relay"

    def __init__(
        self,
        keypair: KeyPair,
        open_hop: OpenHop,
        *,
        splice: SpliceDial | None = None,
        splice_addr: SpliceAddr | None = None,
        mux_config: MuxConfig | None = None,
        handshake_timeout: float = 10.0,
        keepalive_interval: float = 15.0,
        keepalive_timeout: float = 45.0,
    ) -> None:
        super().__init__(keypair)
        self._open_hop = open_hop
        self._splice = splice
        self._splice_addr = splice_addr
        self._no_splice: dict[PeerId, float] = {}  # relay -> until when its spliced sockets are not tried
        self.mux_config = mux_config or MuxConfig()
        self.handshake_timeout = handshake_timeout
        self.keepalive_interval = keepalive_interval
        self.keepalive_timeout = keepalive_timeout
        self._readers: set[asyncio.Task] = set()

    def handles(self, addr: Multiaddr) -> bool:
        return addr.is_circuit

    async def listen(self, addr: Multiaddr, on_connection: ConnectionHandler) -> Listener:
        raise MultiaddrError("relayed addresses come from reservations, not from listening")

    async def dial(self, addr: Multiaddr, peer_id: PeerId | None = None) -> Connection:
        relay_addrs, relay, target = split_circuit(addr)
        if peer_id is not None and target is not None and target != peer_id:
            raise MultiaddrError(f"address {addr} names {target}, not the requested {peer_id}")
        target = peer_id or target
        if target is None:
            raise MultiaddrError(f"{addr} does not say which peer to reach through the relay")
        if target == relay:
            raise MultiaddrError("a relay cannot relay a circuit to itself")
        remote = addr.without_peer_id()
        if self._splice is not None:
            try:
                return await self._through(relay, relay_addrs, target, remote, splice=True)
            except _SpliceFailed as e:
                log.info("spliced circuit failed; relaying in-stream", relay=str(relay), reason=str(e))
        return await self._through(relay, relay_addrs, target, remote, splice=False)

    def _splice_to(self, relay_conn: Connection) -> Multiaddr | None:
        """Where to open a spliced socket for a circuit negotiated on ``relay_conn`` (None: don't)."""
        if self._splice is None or self._splice_addr is None:
            return None
        until = self._no_splice.get(relay_conn.remote_peer)
        if until is not None:
            if time.monotonic() < until:
                return None
            del self._no_splice[relay_conn.remote_peer]
        return self._splice_addr(relay_conn)

    def _splice_failed(self, relay: PeerId) -> None:
        """``relay``'s TCP listener is unreachable from here: circuits through it stay in-stream
        for a while instead of paying for the attempt each time."""
        self._no_splice[relay] = time.monotonic() + _SPLICE_BACKOFF

    async def _through(
        self, relay: PeerId, relay_addrs: list[Multiaddr], target: PeerId, remote: Multiaddr, *, splice: bool
    ) -> Connection:
        stream, relay_conn, libp2p = await self._open_hop(relay, relay_addrs)
        if libp2p:
            return await self._through_v2(stream, relay_conn, target, remote)
        splice_addr = self._splice_to(relay_conn) if splice else None
        splice = splice_addr is not None
        async with self._setting_up(stream, target, relay):
            request: dict[str, Any] = {"type": "connect", "peer": target.to_bytes()}
            if splice:
                request["splice"] = True
            write_message(stream, request)
            await stream.drain()
            answer = check_answer(await read_message(stream, MAX_MESSAGE), f"relay {relay.short()}")
            token = splice_token(answer) if splice else None
            if token is None:  # (a target that reserved with circuit relay v2 speaks libp2p's stack)
                libp2p = answer.get("libp2p") is True
                return await self._secure(stream, True, target, remote, relay_conn, libp2p=libp2p)
        stream.reset()  # the circuit moves to its own socket; this stream has done its job
        try:
            return await self._splice(splice_addr, token, target, True, remote)  # type: ignore[arg-type, misc]
        except SpliceUnreachable as e:
            self._splice_failed(relay)
            raise _SpliceFailed(str(e)) from None
        except LatticaError as e:
            raise _SpliceFailed(str(e)) from None

    @contextlib.asynccontextmanager
    async def _setting_up(self, stream: Stream, target: PeerId, relay: PeerId) -> AsyncIterator[None]:
        """A circuit's setup on ``stream``, within the handshake timeout; the stream is reset if
        it fails."""
        try:
            async with asyncio.timeout(self.handshake_timeout):
                yield
        except TimeoutError:
            stream.reset()
            raise Timeout(f"circuit to {target} through {relay} took longer than {self.handshake_timeout} s") from None
        except BaseException:
            stream.reset()
            raise

    async def _through_v2(
        self, stream: Stream, relay_conn: Connection, target: PeerId, remote: Multiaddr
    ) -> Connection:
        """CONNECT through a libp2p relay (circuit relay v2), then the libp2p upgrade end to end."""
        relay = relay_conn.remote_peer
        async with self._setting_up(stream, target, relay):
            write_delimited(stream, v2.encode_hop(v2.HopMessage(v2.HopType.CONNECT, v2.RelayPeer(target))))
            await stream.drain()
            answer = v2.decode_hop(await read_delimited(stream, v2.MAX_MESSAGE))
            if answer.type != v2.HopType.STATUS:
                raise ProtocolError(f"relay {relay.short()} answered CONNECT with {answer.type.name}")
            if answer.status != v2.Status.OK:
                status = answer.status.name if answer.status is not None else "no status"
                raise RelayRefused(f"libp2p relay {relay.short()} refused the circuit to {target}: {status}")
            conn = await self._secure(stream, True, target, remote, relay_conn, libp2p=True)
        conn.relay_limit = _limits(answer.limit)
        return conn

    async def accept_v2(self, stream: Stream, relay_conn: Connection, on_connection: ConnectionHandler) -> None:
        """Serve a circuit relay v2 ``stop`` stream from a libp2p relay we hold a reservation with."""
        relay = relay_conn.remote_peer
        try:
            async with asyncio.timeout(self.handshake_timeout):
                msg = v2.decode_stop(await read_delimited(stream, v2.MAX_MESSAGE))
                if msg.type != v2.StopType.CONNECT or msg.peer is None:
                    write_delimited(
                        stream,
                        v2.encode_stop(v2.StopMessage(v2.StopType.STATUS, status=v2.Status.UNEXPECTED_MESSAGE)),
                    )
                    raise ProtocolError("a stop stream must open with CONNECT naming the peer")
                write_delimited(stream, v2.encode_stop(v2.StopMessage(v2.StopType.STATUS, status=v2.Status.OK)))
                remote = relay_conn.remote_addr.with_peer_id(relay).encapsulate("/p2p-circuit")
                conn = await self._secure(stream, False, msg.peer.peer, remote, relay_conn, libp2p=True)
        except (TimeoutError, LatticaError) as e:
            log.info("relayed connection failed", relay=str(relay), reason=str(e) or "timeout")
            stream.reset()
            return
        conn.relay_limit = _limits(msg.limit)
        self._hand_over(conn, on_connection)

    async def accept(self, stream: Stream, relay_conn: Connection, on_connection: ConnectionHandler) -> None:
        """Serve a ``stop`` stream from a relay we hold a reservation with."""
        relay = relay_conn.remote_peer
        try:
            async with asyncio.timeout(self.handshake_timeout):
                msg = await read_message(stream, MAX_MESSAGE)
                src = parse_connect(msg)
                splice_addr = self._splice_to(relay_conn) if "splice" in msg else None
                token = splice_token(msg) if splice_addr is not None else None
                write_message(stream, {"ok": True, "splice": True} if token else {"ok": True})
                await stream.drain()
                remote = relay_conn.remote_addr.with_peer_id(relay).encapsulate("/p2p-circuit")
                if token is not None:
                    await stream.close()  # the circuit moves to its own socket
                    conn = await self._splice(splice_addr, token, src, False, remote)  # type: ignore[arg-type, misc]
                else:
                    conn = await self._secure(stream, False, src, remote, relay_conn)
        except (TimeoutError, LatticaError) as e:
            log.info("relayed connection failed", relay=str(relay), reason=str(e) or "timeout")
            stream.reset()
            if isinstance(e, SpliceUnreachable):
                self._splice_failed(relay)
            return
        self._hand_over(conn, on_connection)

    async def _secure(
        self,
        stream: Stream,
        initiator: bool,
        expected: PeerId,
        remote_addr: Multiaddr,
        carrier: Connection,
        *,
        libp2p: bool = False,
    ) -> MuxedConnection:
        """Noise XX end to end through the relay, then the mux; ``expected`` must answer.
        ``carrier``: our connection to the relay, which ``stream`` is on. ``libp2p``: the
        standard libp2p upgrade (a circuit relay v2 circuit), else our own handshake."""
        if libp2p:
            hs, plain, cipher, upgrade = await self._upgrade(stream, initiator, expected)
        else:
            hs = await self._handshake(stream, initiator, expected, remote_addr)
            plain, cipher, upgrade = b"", hs.leftover, None
        assert hs.session is not None and hs.remote_peer is not None
        pipe = _StreamPipe(stream)
        conn = MuxedConnection(
            pipe,
            transport="relay",
            direction="outbound" if initiator else "inbound",
            local_peer=self.keypair.peer_id,
            remote_peer=hs.remote_peer,
            local_addr=remote_addr,
            remote_addr=remote_addr,
            session=hs.session,
            mux_config=self.mux_config,
            keepalive_interval=self.keepalive_interval,
            keepalive_timeout=self.keepalive_timeout,
        )
        pipe.conn = conn
        conn.carrier = carrier
        conn.libp2p = libp2p
        conn.early_data = hs.remote_early_data
        conn.said_early = hs.remote_early_data is not None
        self._track(conn)
        if plain:
            conn.receive_plain(plain)
        if cipher:
            conn.data_received(cipher)
        task = asyncio.get_running_loop().create_task(self._read(stream, conn, pipe, upgrade))
        self._readers.add(task)
        task.add_done_callback(self._readers.discard)
        return conn

    async def _handshake(
        self, stream: Stream, initiator: bool, expected: PeerId, remote_addr: Multiaddr
    ) -> NoiseHandshake:
        """Our own Noise handshake (AES-GCM, identify as early data) over the relay stream."""
        make = self.early_data
        hs = NoiseHandshake(self.keypair, initiator, expected, early_data=(lambda: make(remote_addr)) if make else None)
        out = hs.start()
        if out:
            stream.write(out)
        while not hs.complete:
            data = await stream.read(MAX_MESSAGE)
            if not data:
                raise HandshakeError("relay stream ended during the handshake")
            out = hs.receive(data)
            if out:
                stream.write(out)
        return hs

    async def _upgrade(
        self, stream: Stream, initiator: bool, expected: PeerId
    ) -> tuple[NoiseHandshake, bytes, bytes, Libp2pUpgrade | None]:
        """libp2p's upgrade over the relay stream until the connection may be made: the
        handshake, the mux bytes already opened and not, and the upgrade while a lazy muxer
        proposal still waits for its answer (else None)."""
        upgrade = Libp2pUpgrade(self.keypair, initiator, expected)
        upgrade.start()
        while True:
            out = upgrade.data_to_send()
            if out:
                stream.write(out)
            event = upgrade.next_event()
            if isinstance(event, Up):
                mux = upgrade.next_event()
                if mux is None:
                    return event.handshake, b"", b"", upgrade
                assert not isinstance(mux, Up)
                return event.handshake, mux.plain, mux.cipher, None
            data = await stream.read(MAX_MESSAGE)
            if not data:
                raise HandshakeError("relay stream ended during the handshake")
            upgrade.receive_data(data)

    @staticmethod
    async def _read(stream: Stream, conn: MuxedConnection, pipe: _StreamPipe, upgrade: Libp2pUpgrade | None) -> None:
        """Feed the relay stream's bytes to the connection (through the upgrade first while the
        muxer proposal's answer is still due)."""
        try:
            while not conn.is_closed:
                data = await stream.read(_READ_CHUNK)
                if not data:
                    conn.connection_lost(None)
                    return
                pipe.received += len(data)
                if upgrade is None:
                    conn.data_received(data)
                    continue
                upgrade.receive_data(data)
                out = upgrade.data_to_send()
                if out:
                    stream.write(out)
                mux = upgrade.next_event()
                if mux is not None:
                    assert not isinstance(mux, Up)
                    upgrade = None
                    if mux.plain:
                        conn.receive_plain(mux.plain)
                    if mux.cipher:
                        conn.data_received(mux.cipher)
        except LatticaError as e:
            conn.connection_lost(e)

    async def close(self) -> None:
        await super().close()
        for task in list(self._readers):
            task.cancel()
