"""Multiaddr: self-describing network addresses (``/ip4/1.2.3.4/tcp/4001/p2p/12D3KooW...``).

Supports the protocols Lattica dials and advertises: ip4, ip6, dns, dns4, dns6, tcp, udp, quic-v1,
p2p, p2p-circuit and memory (the in-process transport). Text and binary forms follow the
multiformats spec, so addresses round-trip with other libp2p implementations.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

from lattica import _iptext as iptext
from lattica._identity import PeerId
from lattica._protobuf import read_uvarint, uvarint
from lattica.errors import InvalidPeerId, MultiaddrError

__all__ = ["Multiaddr"]


@dataclass(slots=True)
class _Proto:
    name: str
    code: int
    size: int  # bits; 0 = no value, -1 = length-prefixed


_PROTOCOLS = [
    _Proto("ip4", 0x04, 32),
    _Proto("tcp", 0x06, 16),
    _Proto("udp", 0x0111, 16),
    _Proto("dns", 0x35, -1),
    _Proto("dns4", 0x36, -1),
    _Proto("dns6", 0x37, -1),
    _Proto("ip6", 0x29, 128),
    _Proto("quic", 0x01CC, 0),  # draft-29 QUIC: read in peers' addresses, never dialed
    _Proto("quic-v1", 0x01CD, 0),
    _Proto("p2p", 0x01A5, -1),
    _Proto("p2p-circuit", 0x0122, 0),
    _Proto("memory", 0x0309, 64),
]
_BY_NAME = {p.name: p for p in _PROTOCOLS}
_BY_NAME["ipfs"] = _BY_NAME["p2p"]  # legacy alias, accepted on input
_BY_CODE = {p.code: p for p in _PROTOCOLS}
_MAX_TEXT = 1024
_PARSED: dict[bytes, Multiaddr] = {}  # binary form -> parsed multiaddr, recently seen
_PARSED_MAX = 4096


def _value_to_bytes(proto: _Proto, value: str) -> bytes:
    try:
        if proto.name in ("ip4", "ip6"):
            raw = iptext.pack(value)
            if len(raw) != (4 if proto.name == "ip4" else 16):
                raise ValueError(f"not an IPv{proto.name[-1]} address")
            return raw
        if proto.name in ("tcp", "udp"):
            port = int(value, 10)
            if not 0 <= port <= 65535:
                raise ValueError("port out of range")
            return port.to_bytes(2, "big")
        if proto.name == "memory":
            return int(value, 10).to_bytes(8, "big")
        if proto.name == "p2p":
            return PeerId.from_string(value).to_bytes()
        if proto.name.startswith("dns"):
            if not value or len(value) > 253:
                raise ValueError("bad DNS name length")
            return value.encode("idna")
    except (ValueError, InvalidPeerId, UnicodeError, OverflowError) as e:
        raise MultiaddrError(f"invalid /{proto.name} value {value!r}: {e}") from None
    raise MultiaddrError(f"/{proto.name} takes no value")


def _value_to_text(proto: _Proto, raw: bytes) -> str:
    try:
        if proto.name in ("ip4", "ip6"):
            if len(raw) != (4 if proto.name == "ip4" else 16):
                raise ValueError(f"an IPv{proto.name[-1]} address of {len(raw)} bytes")
            return iptext.unpack(raw)
        if proto.name in ("tcp", "udp", "memory"):
            return str(int.from_bytes(raw, "big"))
        if proto.name == "p2p":
            return str(PeerId.from_bytes(raw))
        if proto.name.startswith("dns"):
            return raw.decode("idna")
    except (ValueError, InvalidPeerId, UnicodeError) as e:
        raise MultiaddrError(f"invalid binary /{proto.name} value: {e}") from None
    raise MultiaddrError(f"/{proto.name} takes no value")


class Multiaddr:
    """An immutable, hashable multiaddr; build with ``Multiaddr("/ip4/...")``."""

    __slots__ = ("_parts", "_text", "_bytes")
    _parts: tuple[tuple[str, str | None], ...]
    _text: str
    _bytes: bytes | None

    def __init__(self, text: str | Multiaddr) -> None:
        self._bytes = None
        if isinstance(text, Multiaddr):
            self._parts, self._text, self._bytes = text._parts, text._text, text._bytes
            return
        if not isinstance(text, str) or not text.startswith("/") or len(text) > _MAX_TEXT:
            raise MultiaddrError(f"a multiaddr is text starting with '/': {text!r}")
        tokens = text.strip("/").split("/")
        parts: list[tuple[str, str | None]] = []
        i = 0
        while i < len(tokens):
            name = tokens[i]
            proto = _BY_NAME.get(name)
            if proto is None:
                raise MultiaddrError(f"unknown multiaddr protocol {name!r} in {text!r}")
            if proto.size == 0:
                parts.append((proto.name, None))
                i += 1
                continue
            if i + 1 >= len(tokens):
                raise MultiaddrError(f"/{name} needs a value in {text!r}")
            value = tokens[i + 1]
            # canonicalise (e.g. ip6 compression, PeerId re-encoding) by a round-trip
            parts.append((proto.name, _value_to_text(proto, _value_to_bytes(proto, value))))
            i += 2
        if not parts:
            raise MultiaddrError("empty multiaddr")
        self._parts = tuple(parts)
        self._text = "".join(f"/{n}" if v is None else f"/{n}/{v}" for n, v in parts)

    @classmethod
    def _from_parts(cls, parts: tuple[tuple[str, str | None], ...]) -> Multiaddr:
        self = object.__new__(cls)
        self._bytes = None
        self._parts = parts
        self._text = "".join(f"/{n}" if v is None else f"/{n}/{v}" for n, v in parts)
        return self

    @classmethod
    def from_bytes(cls, data: bytes) -> Multiaddr:
        """Parse the binary form (varint protocol codes, fixed or length-prefixed values).
        Multiaddrs are immutable, so recently parsed ones are shared (peers repeat addresses)."""
        data = bytes(data)
        hit = _PARSED.get(data)
        if hit is not None:
            return hit
        addr = cls._parse_bytes(data)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[data] = addr
        return addr

    @classmethod
    def _parse_bytes(cls, data: bytes) -> Multiaddr:
        parts: list[tuple[str, str | None]] = []
        pos = 0
        if len(data) > _MAX_TEXT:
            raise MultiaddrError("binary multiaddr too long")
        try:
            while pos < len(data):
                code, pos = read_uvarint(data, pos)
                proto = _BY_CODE.get(code)
                if proto is None:
                    raise MultiaddrError(f"unknown multiaddr protocol code {code:#x}")
                if proto.size == 0:
                    parts.append((proto.name, None))
                    continue
                if proto.size > 0:
                    n = proto.size // 8
                else:
                    n, pos = read_uvarint(data, pos)
                if pos + n > len(data):
                    raise MultiaddrError("truncated binary multiaddr")
                parts.append((proto.name, _value_to_text(proto, data[pos : pos + n])))
                pos += n
        except ValueError as e:
            raise MultiaddrError(f"malformed binary multiaddr: {e}") from None
        if not parts:
            raise MultiaddrError("empty multiaddr")
        return cls._from_parts(tuple(parts))

    def to_bytes(self) -> bytes:
        if self._bytes is None:
            self._bytes = self._encode()
        return self._bytes

    def _encode(self) -> bytes:
        out = bytearray()
        for name, value in self._parts:
            proto = _BY_NAME[name]
            out += uvarint(proto.code)
            if value is None:
                continue
            raw = _value_to_bytes(proto, value)
            if proto.size < 0:
                out += uvarint(len(raw))
            out += raw
        return bytes(out)

    # -- inspection -------------------------------------------------------------------------------

    def protocols(self) -> list[str]:
        return [n for n, _ in self._parts]

    def __iter__(self) -> Iterator[tuple[str, str | None]]:
        return iter(self._parts)

    def value_for(self, name: str) -> str | None:
        """The value of the first component named ``name``, or None."""
        for n, v in self._parts:
            if n == name:
                return v
        return None

    @property
    def peer_id(self) -> PeerId | None:
        """The final ``/p2p/<id>`` (the peer this address reaches), or None."""
        if self._parts[-1][0] == "p2p":
            return PeerId.from_string(cast(str, self._parts[-1][1]))  # /p2p takes a value
        return None

    def with_peer_id(self, peer_id: PeerId) -> Multiaddr:
        """This address ending in ``/p2p/<peer_id>`` (replacing a final /p2p if present)."""
        return Multiaddr._from_parts(self.without_peer_id()._parts + (("p2p", str(peer_id)),))

    def without_peer_id(self) -> Multiaddr:
        if self._parts[-1][0] == "p2p" and len(self._parts) > 1:
            return Multiaddr._from_parts(self._parts[:-1])
        return self

    def encapsulate(self, other: Multiaddr | str) -> Multiaddr:
        return Multiaddr._from_parts(self._parts + Multiaddr(other)._parts)

    @property
    def is_circuit(self) -> bool:
        return any(n == "p2p-circuit" for n, _ in self._parts)

    def host_port(self) -> tuple[str, int]:
        """(host, port) of an ``/ip4|ip6|dns*/.../tcp|udp/N`` address."""
        if len(self._parts) < 2 or self._parts[1][0] not in ("tcp", "udp"):
            raise MultiaddrError(f"{self} has no host/port")
        host_proto, host = self._parts[0]
        if host_proto not in ("ip4", "ip6", "dns", "dns4", "dns6"):
            raise MultiaddrError(f"{self} does not start with an IP or DNS component")
        # ip4/ip6/dns* and tcp/udp all take a value
        return cast(str, host), int(cast(str, self._parts[1][1]))

    @classmethod
    def from_host_port(cls, host: str, port: int, proto: str = "tcp") -> Multiaddr:
        """Build ``/ip4|ip6/<host>/tcp|udp/<port>[/quic-v1]`` (proto: "tcp", "udp" or "quic-v1")."""
        try:
            fam = "ip6" if iptext.version(host) == 6 else "ip4"
        except ValueError:
            fam = "dns"
        if proto == "quic-v1":
            return cls(f"/{fam}/{host}/udp/{port}/quic-v1")
        return cls(f"/{fam}/{host}/{proto}/{port}")

    @classmethod
    def from_sockaddr(cls, sockaddr: tuple, proto: str = "tcp") -> Multiaddr:
        """Address of a socket's ``getsockname()``/``getpeername()`` (IPv4 or IPv6 tuple)."""
        return cls.from_host_port(sockaddr[0], sockaddr[1], proto)

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"Multiaddr({self._text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Multiaddr) and other._parts == self._parts

    def __hash__(self) -> int:
        return hash(self._text)  # canonical text, one to one with the parts; str caches its hash
