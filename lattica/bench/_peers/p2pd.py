"""go-libp2p 0.32 for the interop tests and ``lattica bench libp2p``: the ``p2pd`` daemon from the hivemind 1.1.12 wheel,
driven over its control socket (uvarint-delimited protobuf ``Request``/``Response``, as
go-libp2p-daemon's p2pd.proto defines them). Never started with ``-b`` (which dials public
bootstrap peers): it listens and dials on 127.0.0.1 only.

With ``dht_server`` the daemon runs go-libp2p-kad-dht v0.25.1 in server mode on ``/ipfs/kad/1.0.0``
and the ``dht_*`` methods drive it; its default validators accept only ``/pk/`` and ``/ipns/``
records.

With ``-pubsub`` in ``flags`` it runs go-libp2p-pubsub v0.10 GossipSub (``/meshsub/1.1.0``, every
message signed, StrictSign) and the ``ps_*`` methods drive it."""

from __future__ import annotations

import asyncio
import contextlib
import math
import pathlib
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

from lattica._identity import PeerId
from lattica._multiaddr import Multiaddr
from lattica._protobuf import decode_fields, decode_repeated, encode_fields, uvarint

LISTEN = ("/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1")
IDENTIFY, CONNECT, STREAM_OPEN, STREAM_HANDLER, DHT, DISCONNECT, PUBSUB = 0, 1, 2, 3, 4, 7, 8
# PSRequest.Type (p2pd.proto)
PS_GET_TOPICS, PS_LIST_PEERS, PS_PUBLISH, PS_SUBSCRIBE = 0, 1, 2, 3
# DHTRequest.Type (p2pd.proto)
FIND_PEER, FIND_PROVIDERS, GET_CLOSEST_PEERS, GET_VALUE, PUT_VALUE, PROVIDE = 0, 2, 3, 5, 7, 8
# DHTResponse.Type: a streamed answer is BEGIN (inside the Response), VALUEs, then END
DHT_BEGIN, DHT_VALUE, DHT_END = 0, 1, 2
# Seconds we wait beyond the timeout sent to the daemon, so that its own deadline (an error, or the
# end of a stream) is what the caller sees, not ours.
_GRACE = 2.0


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

    def __init__(
        self,
        binary: pathlib.Path,
        workdir: pathlib.Path,
        listen: tuple[str, ...] = LISTEN,
        dht_server: bool = False,
        flags: tuple[str, ...] = (),
        popen: Callable[..., subprocess.Popen] = subprocess.Popen,
    ) -> None:
        """``popen``: what runs it (a NAT lab's, to run it in a network namespace). ``listen``: its host's addresses (a bench listens on one transport only: go dials a
        peer's QUIC addresses first once identify told it of them). ``dht_server``: run the DHT
        with ``-dhtServer``; ``-dht`` would be ModeAuto, which stays a client while AutoNAT sees
        no public address, i.e. always on 127.0.0.1. ``flags``: more of p2pd's options (never
        ``-b``)."""
        if "-b" in flags or any(f.startswith("-b=") for f in flags):
            raise ValueError("p2pd runs here without -b: it would dial the public bootstrap peers")
        self.control = workdir / "p2pd.sock"
        self.proc = popen(
            [
                str(binary),
                "-q",
                "-listen",
                f"/unix{self.control}",
                "-hostAddrs",
                ",".join(listen),
                *(["-dhtServer"] if dht_server else []),
                *flags,
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

    async def _dht(self, fields: list, timeout: float) -> tuple[dict, asyncio.StreamReader, asyncio.StreamWriter]:
        """Send a DHTRequest of ``fields`` (type first), with ``timeout`` rounded up to whole
        seconds (the daemon's unit; 0 would mean its 60 s default)."""
        req = encode_fields([*fields, (7, max(1, math.ceil(timeout)))])
        return await self._request([(1, DHT), (5, req)])

    async def _dht_single(self, fields: list, timeout: float) -> dict[int, int | bytes]:
        """A DHT request answered by one DHTResponse inside the Response (empty for PUT_VALUE and
        PROVIDE, which answer a bare OK)."""
        async with asyncio.timeout(timeout + _GRACE):
            resp, _, writer = await self._dht(fields, timeout)
        writer.close()
        raw = resp.get(5)
        return decode_fields(raw) if isinstance(raw, bytes) else {}

    async def _dht_stream(self, fields: list, timeout: float) -> list[dict[int, int | bytes]]:
        """A DHT request answered by a stream: Response{dht: BEGIN}, then delimited bare
        DHTResponses up to one of type END. The VALUE items, decoded."""
        items: list[dict[int, int | bytes]] = []
        async with asyncio.timeout(timeout + _GRACE):
            resp, reader, writer = await self._dht(fields, timeout)
            try:
                begin = decode_fields(_field(resp, 5))
                if begin.get(1, DHT_BEGIN) != DHT_BEGIN:
                    raise RuntimeError(f"p2pd: a stream began with DHTResponse type {begin.get(1)!r}")
                while True:
                    item = decode_fields(await read_delimited(reader))
                    if item.get(1) == DHT_END:
                        return items
                    if item.get(1) == DHT_VALUE:
                        items.append(item)
            finally:
                writer.close()

    async def dht_find_peer(self, peer: PeerId, timeout: float = 10) -> list[Multiaddr]:
        """``peer``'s addresses as the daemon's DHT finds them (from its peerstore when it is
        connected to ``peer``, else by a lookup)."""
        return _addrs(_field(await self._dht_single([(1, FIND_PEER), (2, peer.to_bytes())], timeout), 2))

    async def dht_closest_peers(self, key: bytes, timeout: float = 10) -> list[PeerId]:
        """The peers a GetClosestPeers lookup for ``key`` ends with (``key`` is hashed by go:
        a peer id's bytes to look up that peer, or any key)."""
        items = await self._dht_stream([(1, GET_CLOSEST_PEERS), (4, key)], timeout)
        return [PeerId.from_bytes(_field(i, 3)) for i in items]

    async def dht_provide(self, cid: bytes, timeout: float = 10) -> None:
        """Announce the daemon as a provider of ``cid`` (binary CID; go stores and sends
        ADD_PROVIDER under the CID's multihash). Refused while its routing table is empty."""
        await self._dht_single([(1, PROVIDE), (3, cid)], timeout)

    async def dht_find_providers(
        self, cid: bytes, count: int = 20, timeout: float = 10
    ) -> list[tuple[PeerId, list[Multiaddr]]]:
        """Up to ``count`` providers of ``cid`` (binary CID), each with the addresses go gave."""
        items = await self._dht_stream([(1, FIND_PROVIDERS), (3, cid), (6, count)], timeout)
        infos = [_field(i, 2) for i in items]
        return [(PeerId.from_bytes(_field(decode_fields(info), 1)), _addrs(info)) for info in infos]

    async def dht_put_value(self, key: bytes, value: bytes, timeout: float = 10) -> None:
        """Store ``value`` under ``key`` locally and on the closest peers (go validates the
        record first: by default only ``/pk/`` and ``/ipns/`` keys are accepted)."""
        await self._dht_single([(1, PUT_VALUE), (4, key), (5, value)], timeout)

    async def dht_get_value(self, key: bytes, timeout: float = 10) -> bytes:
        """The best value go finds for ``key`` (its own store and a lookup)."""
        return _field(await self._dht_single([(1, GET_VALUE), (4, key)], timeout), 3)

    async def ps_publish(self, topic: str, data: bytes) -> None:
        """Publish ``data`` on ``topic`` (the daemon signs it)."""
        req = encode_fields([(1, PS_PUBLISH), (2, topic.encode()), (3, data)])
        _, _, writer = await self._request([(1, PUBSUB), (8, req)])
        writer.close()

    async def ps_peers(self, topic: str) -> list[PeerId]:
        """The peers the daemon's router knows subscribed to ``topic``."""
        req = encode_fields([(1, PS_LIST_PEERS), (2, topic.encode())])
        resp, _, writer = await self._request([(1, PUBSUB), (8, req)])
        writer.close()
        raw = resp.get(7)  # PSResponse{topics = 1, peerIDs = 2} in this daemon's p2pd.proto
        return [PeerId.from_bytes(p) for p in decode_repeated(raw, 2)] if isinstance(raw, bytes) else []

    async def ps_subscribe(self, topic: str) -> Subscription:
        """Join ``topic``; the messages the daemon delivers from then on are read from the result."""
        req = encode_fields([(1, PS_SUBSCRIBE), (2, topic.encode())])
        _, reader, writer = await self._request([(1, PUBSUB), (8, req)])
        return Subscription(reader, writer)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Subscription:
    """A topic the daemon joined for us: its messages as ``(author, seqno, data)``, ``close()``
    leaves it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def next(self, timeout: float = 10) -> tuple[PeerId, bytes, bytes]:
        async with asyncio.timeout(timeout):
            m = decode_fields(await read_delimited(self._reader))
        return PeerId.from_bytes(_field(m, 1)), _field(m, 3), _field(m, 2) if 2 in m else b""

    def close(self) -> None:
        self._writer.close()


def _field(message: dict[int, int | bytes], number: int) -> bytes:
    """The bytes field ``number`` of a decoded message; RuntimeError if the daemon left it out."""
    value = message.get(number)
    if not isinstance(value, bytes):
        raise RuntimeError(f"p2pd: answer without field {number}: {message!r}")
    return value


def _addrs(peer_info: bytes) -> list[Multiaddr]:
    """The addresses of a PeerInfo{id=1, addrs=2} (ones our multiaddr table cannot read are left
    out)."""
    out = []
    for raw in decode_repeated(peer_info, 2):
        with contextlib.suppress(ValueError):
            out.append(Multiaddr.from_bytes(raw))
    return out


def _unix_addr(path: pathlib.Path) -> bytes:
    """The binary multiaddr ``/unix/<path>`` (code 400, a length-prefixed path), which our
    multiaddr table does not carry."""
    raw = str(path).encode()
    return uvarint(400) + uvarint(len(raw)) + raw


@contextlib.contextmanager
def daemon(
    binary: pathlib.Path, listen: tuple[str, ...] = LISTEN, dht_server: bool = False, flags: tuple[str, ...] = ()
) -> Iterator[Daemon]:
    """A p2pd listening on ``listen`` (127.0.0.1), a DHT server if ``dht_server``, with more
    ``flags``, stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="p2pd-") as tmp:
        d = Daemon(binary, pathlib.Path(tmp), listen, dht_server, flags)
        try:
            yield d
        finally:
            d.stop()
