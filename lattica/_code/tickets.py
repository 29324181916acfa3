"""Tickets: the signed name of a code package, and which modules travel under which ticket.

A ``Ticket`` is what travels in a spawn: the package's CID signed by the node that sent it, with
the mesh certificates that say who that node is. The registries say, for this process, which
ticket a module's classes travel with: modules of packages loaded here (``NAMESPACE_PREFIX``...)
and the modules this process ships itself. Light on purpose: the codec consults it for every
actor class it writes, and a starting node loads it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lattica._identity import KeyPair, PeerId, verify_signature
from lattica.errors import CodeError, InvalidPeerId, LatticaError

__all__ = ["MAX_BYTES", "NAMESPACE_PREFIX", "Ticket", "known_ticket", "ticket_of"]

MAX_BYTES = 32 << 20  # source bytes a code package may hold (the packer and every receiver check)
NAMESPACE_PREFIX = "_lattica_code_"  # the top-level module name of every loaded package starts so
_DOMAIN = b"lattica code package v1\x00"
LOADED: dict[str, Ticket] = {}  # namespace prefix -> the ticket its package came with
SHIPPED: dict[str, Ticket] = {}  # module name -> the ticket this process ships it under


def ticket_of(module_name: str) -> Ticket | None:
    """The ticket of the package a module was loaded from (None: not from a package)."""
    return LOADED.get(module_name.partition(".")[0]) if module_name.startswith(NAMESPACE_PREFIX) else None


def known_ticket(cls: type) -> Ticket | None:
    """The ticket a class travels with, if one was made (synchronous: for encoding a class)."""
    return ticket_of(cls.__module__) or SHIPPED.get(cls.__module__)


@dataclass(frozen=True)
class Ticket:
    """A package's CID, signed by the node that sent it, with the mesh certificates that say who
    that node is: a node that receives a spawn (or a supervisor's restart of it) checks who sent
    the code, not who forwarded it."""

    cid: str
    sender: PeerId
    signature: bytes
    certificates: tuple[bytes, ...] = ()

    @staticmethod
    def signed_part(cid: str) -> bytes:
        return _DOMAIN + cid.encode()

    @classmethod
    def issue(cls, cid: str, keypair: KeyPair, certificates: Iterable[bytes]) -> Ticket:
        return cls(cid, keypair.peer_id, keypair.sign(cls.signed_part(cid)), tuple(certificates))

    def verify(self) -> bool:
        public = self.sender.public_key()
        return public is not None and verify_signature(public, self.signature, self.signed_part(self.cid))

    def claims_admin(self) -> bool:
        """Whether the sender presents an administrator's certificate (unverified: for placement
        to guess which nodes take the code; each node checks the ticket itself)."""
        from lattica.trust import Certificate  # (trust imports identity; kept out of the codec's path)

        for raw in self.certificates:
            try:
                if Certificate.from_bytes(raw).admin:
                    return True
            except LatticaError:
                continue
        return False

    def to_wire(self) -> list:
        return [self.cid, self.sender.to_bytes(), self.signature, list(self.certificates)]

    @classmethod
    def from_wire(cls, raw: Any) -> Ticket:
        if (
            type(raw) is not list
            or len(raw) != 4
            or type(raw[0]) is not str
            or len(raw[0]) > 128
            or type(raw[1]) is not bytes
            or type(raw[2]) is not bytes
            or len(raw[2]) > 128
            or type(raw[3]) is not list
            or len(raw[3]) > 4
            or not all(type(c) is bytes and len(c) <= 1024 for c in raw[3])
        ):
            raise CodeError("malformed code ticket")
        try:
            sender = PeerId.from_bytes(raw[1])
        except InvalidPeerId:
            raise CodeError("malformed code ticket (sender)") from None
        return cls(raw[0], sender, raw[2], tuple(raw[3]))
