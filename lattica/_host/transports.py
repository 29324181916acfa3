"""The transports one node listens and dials with: TCP from the start, QUIC (and aioquic's
import) and in-memory only once an address needs them, the relay circuit transport added by the
host."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica.transports.base import Connection, Transport
from lattica.transports.tcp import TcpTransport

__all__ = ["Transports"]


class Transports:
    """The node's transports, in the order they are tried for an address."""

    def __init__(self, keypair: KeyPair, options: dict[str, dict[str, Any]], memory_network: Any = None) -> None:
        self.keypair = keypair
        self.options = options  # per transport name: keyword arguments for its constructor
        self._memory_network = memory_network
        # given to every transport (Transport.early_data, Transport.early_push)
        self.early_data: Callable[[Multiaddr], bytes | None] | None = None
        self.early_push: Callable[[Connection], None] | None = None
        self.dialed_in: Callable[[str, str], None] | None = None  # (Transport.dialed_in)
        self.all: list[Transport] = []
        self.add(TcpTransport(keypair, **options.get("tcp", {})))
        self._lazy_quic = self._lazy_memory = True
        if memory_network is not None:
            self._add_memory()

    def add(self, transport: Transport) -> None:
        transport.early_data, transport.early_push = self.early_data, self.early_push
        transport.dialed_in = self.dialed_in
        transport.hold_opens = True  # (the host meters every connection's opens: Connections.add)
        transport.narrow_windows = True  # (and widens a connection's windows once its peer is a member)
        self.all.append(transport)

    def set_early(
        self, data: Callable[[Multiaddr], bytes | None] | None, push: Callable[[Connection], None] | None
    ) -> None:
        """How every transport, of now and added later, says who we are before its handshake ends
        (``Transport.early_data`` and ``Transport.early_push``; None: not early)."""
        self.early_data, self.early_push = data, push
        for t in self.all:
            t.early_data, t.early_push = data, push

    def set_dialed_in(self, fn: Callable[[str, str], None] | None) -> None:
        """What every transport, of now and added later, tells of each dial reaching a listener
        (``Transport.dialed_in``)."""
        self.dialed_in = fn
        for t in self.all:
            t.dialed_in = fn

    def for_addr(self, addr: Multiaddr) -> Transport | None:
        """The transport that listens on / dials ``addr``, or None."""
        for t in self.all:
            if t.handles(addr):
                return t
        protocols = addr.without_peer_id().protocols()
        if self._lazy_quic and protocols[-1:] == ["quic-v1"]:
            self._lazy_quic = False
            # imported here: aioquic loads only on a node that uses QUIC (it costs start-up time)
            from lattica.transports.quic import QuicTransport

            self.add(QuicTransport(self.keypair, **self.options.get("quic", {})))
            return self.for_addr(addr)
        if self._lazy_memory and protocols == ["memory"]:
            self._add_memory()
            return self.for_addr(addr)
        return None

    def _add_memory(self) -> None:
        from lattica.transports.memory import MemoryTransport  # (tests and simulations use it)

        self._lazy_memory = False
        opts = dict(self.options.get("memory", {}))
        if self._memory_network is not None:
            opts.setdefault("network", self._memory_network)
        self.add(MemoryTransport(self.keypair, **opts))

    def listening(self, name: str) -> Any:
        """The transport called ``name`` if it listens (hole punching dials and sends from the
        listening port), else None."""
        return next((t for t in self.all if t.name == name and t.listening), None)

    def named(self, name: str) -> Any:
        """The transport called ``name``, listening or not, else None."""
        return next((t for t in self.all if t.name == name), None)
