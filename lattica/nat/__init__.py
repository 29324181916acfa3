"""NAT traversal's sans-IO core and the node's NAT manager: the hole punch's plan and messages
(``_holepunch``, DCUtR-style), reachability and the mapping type from AutoNAT, and relay
reservations (``_manager``). Their services, one actor each, are in ``lattica.actors.nat``; the
relayed connection itself is ``lattica.transports.circuit``."""

from lattica.nat._manager import NatStatus

__all__ = ["NatStatus"]
