"""Two aioquic-level QUIC connections joined in memory (no sockets, a clock we move), for tests
of transports/quic/_aioquic.py: ours on one or both ends, aioquic's own on the other when the test
plays a peer that behaves in ways ours never would."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aioquic.quic.connection import QuicConnection

from lattica._identity import KeyPair
from lattica.transports.quic import _aioquic
from lattica.transports.quic.tlscert import generate_certificate

CLIENT = ("127.0.0.1", 40001)
SERVER = ("127.0.0.1", 40002)


def configuration(
    is_client: bool, *, datagram: int = 1350, max_data: int = 32 << 20, max_stream_data: int = 8 << 20
) -> Any:
    cert = generate_certificate(KeyPair.generate())
    return _aioquic.make_configuration(
        is_client=is_client,
        certificate=cert.certificate,
        private_key=cert.private_key,
        alpn=("libp2p",),
        idle_timeout=60.0,
        max_data=max_data,
        max_stream_data=max_stream_data,
        max_datagram_size=datagram,
        congestion_control="cubic",
        cid_length=8,
    )


def ours(is_client: bool, odcid: bytes | None = None, **kw: Any) -> _aioquic.LatticaQuicConnection:
    return _aioquic.LatticaQuicConnection(
        configuration=configuration(is_client, **kw), max_streams=256, original_destination_connection_id=odcid
    )


def theirs(is_client: bool, odcid: bytes | None = None, **kw: Any) -> QuicConnection:
    return QuicConnection(configuration=configuration(is_client, **kw), original_destination_connection_id=odcid)


class Pair:
    """``client`` and ``server`` after a completed handshake; ``pump()`` moves datagrams both
    ways until nothing more is sent (``drop(sender, datagram)`` may discard some)."""

    def __init__(self, client: QuicConnection, make_server: Callable[[bytes], QuicConnection]) -> None:
        self.now = 1000.0
        self.client = client
        client.connect(SERVER, now=self.now)
        first = client.datagrams_to_send(self.now)
        dcid, _, _ = _aioquic.long_header(first[0][0])
        self.server = make_server(dcid)
        for data, _ in first:
            self.server.receive_datagram(data, CLIENT, self.now)
        self.pump()
        assert client._handshake_complete and self.server._handshake_complete
        self.events()

    def pump(self, rounds: int = 10_000, drop: Callable[[QuicConnection, bytes], bool] | None = None) -> list[int]:
        """Exchange datagrams until quiet; returns the sizes of the datagrams sent."""
        sizes = []
        for _ in range(rounds):
            moved = False
            for src, dst, origin in ((self.client, self.server, CLIENT), (self.server, self.client, SERVER)):
                for data, _ in src.datagrams_to_send(self.now):
                    moved = True
                    sizes.append(len(data))
                    if drop is None or not drop(src, data):
                        dst.receive_datagram(data, origin, self.now)
            self.now += 0.0005
            for c in (self.client, self.server):
                t = c.get_timer()
                if t is not None and t <= self.now:
                    c.handle_timer(self.now)
            if not moved:
                break
        return sizes

    def events(self) -> dict[str, list[Any]]:
        """Every event each side has queued, by side."""
        out: dict[str, list[Any]] = {"client": [], "server": []}
        for name, c in (("client", self.client), ("server", self.server)):
            while (ev := c.next_event()) is not None:
                out[name].append(ev)
        return out
