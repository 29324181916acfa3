"""The transports one node listens and dials with: TCP and in-memory from the start, QUIC (and
aioquic's import) only once an address needs it, the relay circuit transport added by the host."""

from __future__ import annotations

from typing import Any

from lattica.identity import KeyPair
from lattica.multiaddr import Multiaddr
from lattica.transports.base import Transport
from lattica.transports.memory import MemoryTransport
from lattica.transports.tcp import TcpTransport

__all__ = ["Transports"]


class Transports:
    """The node's transports, in the order they are tried for an address."""

    def __init__(self, keypair: KeyPair, options: dict[str, dict[str, Any]], memory_network: Any = None) -> None:
        self.keypair = keypair
        self.options = options  # per transport name: keyword arguments for its constructor
        memory_opts = dict(options.get("memory", {}))
        if memory_network is not None:
            memory_opts.setdefault("network", memory_network)
        self.all: list[Transport] = [TcpTransport(keypair, **options.get("tcp", {})), MemoryTransport(keypair, **memory_opts)]
        self._lazy_quic = True

    def add(self, transport: Transport) -> None:
        self.all.append(transport)

    def for_addr(self, addr: Multiaddr) -> Transport | None:
        """The transport that listens on / dials ``addr``, or None."""
        for t in self.all:
            if t.handles(addr):
                return t
        if self._lazy_quic and addr.without_peer_id().protocols()[-1:] == ["quic-v1"]:
            self._lazy_quic = False
            # imported here: aioquic loads only on a node that uses QUIC (it costs start-up time)
            from lattica.transports.quic import QuicTransport

            self.all.append(QuicTransport(self.keypair, **self.options.get("quic", {})))
            return self.for_addr(addr)
        return None

    def listening(self, name: str) -> Any:
        """The transport called ``name`` if it listens (hole punching dials and sends from the
        listening port), else None."""
        return next((t for t in self.all if t.name == name and t.listening), None)

    def named(self, name: str) -> Any:
        """The transport called ``name``, listening or not, else None."""
        return next((t for t in self.all if t.name == name), None)
