"""IP addresses as text, bytes and integers, with the socket module's parser.

What Lattica needs of IP addresses on every start (multiaddr encoding, which addresses are
private, which networks are ours) is a few masks and comparisons; the ``ipaddress`` module that
would do it costs ~1.6 ms and ~250 KiB resident to import, so it is left to the code that needs
more (QUIC). Text is parsed strictly (``inet_pton``: no leading zeros, no short forms) and written
as the kernel writes it (IPv4 inside IPv6 dotted, as ``ipaddress`` does from Python 3.13 on).
"""

from __future__ import annotations

import socket

__all__ = ["pack", "unpack", "version", "to_int", "network", "in_network"]


def pack(text: str) -> bytes:
    """The 4 or 16 bytes of an IPv4 or IPv6 address in text (an IPv6 zone, ``%eth0``, is
    dropped); ValueError if it is neither."""
    try:
        if ":" in text:
            return socket.inet_pton(socket.AF_INET6, text.split("%", 1)[0])
        return socket.inet_pton(socket.AF_INET, text)
    except (OSError, UnicodeError):
        raise ValueError(f"{text!r} is not an IP address") from None


def unpack(raw: bytes) -> str:
    """The text of a 4- or 16-byte address."""
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw)
    if len(raw) == 16:
        return socket.inet_ntop(socket.AF_INET6, raw)
    raise ValueError(f"an IP address is 4 or 16 bytes, not {len(raw)}")


def version(text: str) -> int:
    """4 or 6; ValueError if ``text`` is no IP address."""
    return 4 if len(pack(text)) == 4 else 6


def to_int(text: str) -> tuple[int, int]:
    """``(version, address as an integer)``."""
    raw = pack(text)
    return (4 if len(raw) == 4 else 6), int.from_bytes(raw, "big")


def network(text: str, prefix: int) -> tuple[int, int, int]:
    """The network ``text/prefix`` (host bits cleared): ``(version, first address, prefix)``."""
    v, n = to_int(text)
    bits = 32 if v == 4 else 128
    if not 0 <= prefix <= bits:
        raise ValueError(f"/{prefix} is no IPv{v} prefix")
    return v, n >> (bits - prefix) << (bits - prefix), prefix


def in_network(v: int, n: int, net: tuple[int, int, int]) -> bool:
    """Whether address ``n`` of IP version ``v`` lies in ``net`` (as :func:`network` gives it)."""
    nv, first, prefix = net
    shift = (32 if v == 4 else 128) - prefix
    return v == nv and n >> shift == first >> shift
