"""This machine's network interface addresses, to turn a wildcard listen address into dialable ones.

Listening on ``/ip4/0.0.0.0/tcp/4001`` accepts connections on every interface, but ``0.0.0.0`` is
no address a peer can dial; what we advertise instead is the same port at each interface address
(``ifaddr`` reads them portably). IPv6 link-local addresses are left out: they need a zone to dial.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from typing import Any

from lattica import _iptext as iptext
from lattica._multiaddr import Multiaddr
from lattica.errors import LatticaError

__all__ = [
    "interface_ips",
    "expand",
    "is_loopback",
    "is_loopback_ip",
    "host_key",
    "addr_host_key",
    "is_lan",
    "ip_of",
    "is_private",
    "is_private_ip",
    "on_local_network",
]

# Addresses no stranger on the internet can reach us at (RFC 1918, CGNAT, link-local, loopback,
# IPv6 unique-local), and ones that are no peer's address at all (unspecified, "this network",
# benchmarking, IETF-reserved, multicast, broadcast). Spelled out: ``ipaddress``'s is_private also
# covers the documentation ranges, which the NAT lab uses as its internet.
_PRIVATE_NETS = tuple(
    iptext.network(a, int(p))
    for a, p in (
        n.split("/")
        for n in (
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",
            "169.254.0.0/16",
            "127.0.0.0/8",
            "0.0.0.0/8",
            "192.0.0.0/24",
            "198.18.0.0/15",
            "224.0.0.0/4",
            "240.0.0.0/4",
            "fc00::/7",
            "fe80::/10",
            "::1/128",
            "::/128",
            "ff00::/8",
        )
    )
)
_NAT64 = iptext.network("64:ff9b::", 96)
_LINK_LOCAL6 = iptext.network("fe80::", 10)
_LOCAL_NAMES = ("localhost", ".localhost", ".local")
_NETWORKS_TTL = 10.0  # s: interfaces come and go (VPNs, Wi-Fi); re-read them this often
_networks: tuple[float, list] = (-_NETWORKS_TTL, [])


def _adapters() -> Iterable[Any]:
    import ifaddr  # here, not at import: a node listening on one address never reads interfaces

    return ifaddr.get_adapters()


def interface_ips(version: int) -> list[str]:
    """Addresses of this machine's interfaces for IP ``version`` (4 or 6), loopback included."""
    out: list[str] = []
    for adapter in _adapters():
        for ip in adapter.ips:
            if version == 4 and ip.is_IPv4:
                addr = ip.ip
            elif version == 6 and ip.is_IPv6:
                addr = ip.ip[0]
                try:
                    if iptext.in_network(6, iptext.to_int(addr)[1], _LINK_LOCAL6):
                        continue
                except ValueError:
                    continue
            else:
                continue
            if addr not in out:
                out.append(addr)
    return out


def expand(addr: Multiaddr) -> list[Multiaddr]:
    """``addr`` itself, or, for a wildcard host (0.0.0.0 or ::), one address per interface."""
    parts = list(addr)
    if not parts or (parts[0] != ("ip4", "0.0.0.0") and parts[0] != ("ip6", "::")):
        return [addr]
    name = parts[0][0]
    ips = interface_ips(4 if name == "ip4" else 6)
    return [Multiaddr._from_parts(((name, ip), *parts[1:])) for ip in ips] or [addr]


def host_key(ip: str) -> str:
    """What counts as one host when limiting per address: an IPv4 address, or an IPv6 address's
    /64 (one host or LAN usually holds a whole /64, so its addresses are free to it)."""
    if ":" not in ip:
        return ip
    try:
        first = iptext.network(ip, 64)[1]
    except ValueError:
        return ip
    return iptext.unpack(first.to_bytes(16, "big")) + "/64"


def addr_host_key(addr: Multiaddr) -> str:
    """The host a peer's address is at, as limits per address count it (``host_key`` of its IP;
    an address with none, e.g. a relayed connection's, is its own key)."""
    try:
        return host_key(str(addr.host_port()[0]))
    except LatticaError:
        return str(addr)


def is_loopback_ip(ip: str) -> bool:
    """Whether ``ip`` is this machine's loopback (127/8, ::1, or 127/8 mapped into IPv6)."""
    return ip.startswith(("127.", "::ffff:127.")) or ip == "::1"


def is_loopback(addr: Multiaddr) -> bool:
    """Whether ``addr`` is on this machine's loopback (127/8 or ::1)."""
    parts = list(addr)
    return bool(parts) and parts[0][0] in ("ip4", "ip6") and is_loopback_ip(str(parts[0][1]))


def is_lan(addr: Multiaddr) -> bool:
    """Whether ``addr`` is an IP address other hosts on the network could reach (not loopback,
    not an in-memory or relayed address)."""
    parts = list(addr)
    return bool(parts) and parts[0][0] in ("ip4", "ip6") and not addr.is_circuit and not is_loopback(addr)


def ip_of(addr: Multiaddr) -> str | None:
    """The IP address of a direct ``/ip4|ip6/...`` address, else None."""
    parts = list(addr.without_peer_id())
    if not parts or parts[0][0] not in ("ip4", "ip6") or addr.is_circuit:
        return None
    return str(parts[0][1])


@functools.lru_cache(maxsize=4096)  # pure, and asked for the same few addresses over and over
def is_private_ip(ip: str) -> bool:
    """Whether ``ip`` is no public unicast address: private (RFC 1918, CGNAT 100.64/10,
    link-local, loopback, IPv6 ULA), unspecified, reserved or multicast; IPv4 addresses inside IPv6
    (mapped, NAT64, 6to4) are judged as the IPv4 address they carry."""
    try:
        v, n = iptext.to_int(ip)
    except ValueError:
        return False
    if v == 6:
        if n >> 32 == 0xFFFF:  # mapped, ::ffff:a.b.c.d
            v, n = 4, n & 0xFFFFFFFF
        elif n >> 112 == 0x2002:  # 6to4, 2002:AABB:CCDD::/48
            v, n = 4, (n >> 80) & 0xFFFFFFFF
        elif iptext.in_network(6, n, _NAT64):
            v, n = 4, n & 0xFFFFFFFF
    return any(iptext.in_network(v, n, net) for net in _PRIVATE_NETS)


@functools.lru_cache(maxsize=4096)
def is_private(addr: Multiaddr) -> bool:
    """Whether ``addr`` is a direct address at a private IP (see :func:`is_private_ip`) or at a
    name that means this machine or its LAN (``localhost``, ``*.local``); relayed addresses and
    other names are not."""
    parts = list(addr)
    if not parts or addr.is_circuit:
        return False
    kind, value = parts[0][0], str(parts[0][1])
    if kind in ("ip4", "ip6"):
        return is_private_ip(value)
    if kind in ("dns", "dns4", "dns6", "dnsaddr"):
        name = value.lower().rstrip(".")
        return name == _LOCAL_NAMES[0] or name.endswith(_LOCAL_NAMES[1:])
    return False


def _local_networks() -> list:
    global _networks
    now = time.monotonic()
    if now - _networks[0] >= _NETWORKS_TTL:
        nets = []
        for adapter in _adapters():
            for ip in adapter.ips:
                addr = ip.ip if ip.is_IPv4 else ip.ip[0]
                try:
                    nets.append(iptext.network(addr, ip.network_prefix))
                except ValueError:
                    continue
        _networks = (now, nets)
    return _networks[1]


def on_local_network(addr: Multiaddr) -> bool:
    """Whether dialing ``addr`` can work from here as far as addressing goes: a public or non-IP
    address, or a private one inside a subnet of one of our interfaces. A peer's private address
    elsewhere (its own LAN behind its NAT) is black-holed or answered by a stranger."""
    if not is_private(addr):
        return True
    try:
        v, n = iptext.to_int(str(list(addr)[0][1]))
    except ValueError:
        return False
    return any(iptext.in_network(v, n, net) for net in _local_networks())
