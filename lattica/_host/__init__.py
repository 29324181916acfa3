"""The host: the part of a node that lives on its event loop.

- ``host.py``: :class:`Host`, which owns listeners, identify, the address book and stream
  dispatch, and starts the runtime and the system services;
- ``connections.py``: the connection table (adopt, primary connection per peer, idle close,
  protection);
- ``dialer.py``: dialing by PeerId (address book, then the DHT), racing transports, relayed ->
  direct upgrades, relay hops and spliced sockets;
- ``transports.py``: the transports the node listens and dials with.

It may import the runtime, the services, the NAT manager and everything below them; only the
``Node`` facade (``lattica/_node.py``) imports it.
"""

from lattica._host.host import Host, StreamProtocolHandler, check_protocol_name, encode_protocol

__all__ = ["Host", "StreamProtocolHandler", "check_protocol_name", "encode_protocol"]
