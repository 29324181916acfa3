"""QUIC transport (aioquic): TLS 1.3 with libp2p certificates, one UDP socket per address family.

Why one socket: hole punching needs our outbound QUIC packets to leave from the port we listen
on, so that a NAT mapping created by the dial is the one the peer was told about. Each UDP socket
is an ``Endpoint`` (``endpoint.py``) that routes datagrams to connections by destination connection ID; a dial
uses the listening endpoint of its address family when there is one.

Authentication follows the libp2p TLS spec (see ``tlscert.py``): both sides present a
self-signed certificate whose extension carries their Ed25519 host key; after aioquic reports
HandshakeCompleted we verify the peer's certificate ourselves. A dialer whose check fails
closes the connection before its TLS Finished is ever sent, so the listener never completes
the handshake. An inbound connection is handed to ``on_connection`` only once verified.

aioquic is sans-IO: we feed it datagrams and timer ticks and send what ``datagrams_to_send``
returns, once per batch of received datagrams. Everything that touches aioquic's private API
lives in ``_aioquic.py``.

The package follows aioquic's own split of its asyncio adapter; each module imports only those
above it:

- ``wire``: constants (ALPN, versions, error codes, socket and batch sizes), UDP address helpers;
- ``stream``: ``QuicStream``, one QUIC stream as a Lattica ``Stream``;
- ``connection``: ``QuicConn``, one aioquic ``QuicConnection`` driven as a ``Connection``;
- ``endpoint``: ``Endpoint`` (one UDP socket, datagrams routed by connection ID) and
  ``QuicListener``;
- ``transport``: ``QuicTransport`` (listen, dial, and hole-punch packet spraying).
"""

from lattica.transports.quic.connection import QuicConn
from lattica.transports.quic.endpoint import QuicListener
from lattica.transports.quic.stream import QuicStream
from lattica.transports.quic.transport import QuicTransport
from lattica.transports.quic.wire import ALPN

__all__ = ["QuicTransport", "QuicConn", "QuicStream", "QuicListener", "ALPN"]
