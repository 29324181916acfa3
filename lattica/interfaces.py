"""This machine's network interface addresses, to turn a wildcard listen address into dialable ones.

Listening on ``/ip4/0.0.0.0/tcp/4001`` accepts connections on every interface, but ``0.0.0.0`` is
no address a peer can dial; what we advertise instead is the same port at each interface address
(``ifaddr`` reads them portably). IPv6 link-local addresses are left out: they need a zone to dial.
"""

from __future__ import annotations

import ipaddress

import ifaddr

from lattica.multiaddr import Multiaddr

__all__ = ["interface_ips", "expand", "is_loopback", "is_lan"]


def interface_ips(version: int) -> list[str]:
    """Addresses of this machine's interfaces for IP ``version`` (4 or 6), loopback included."""
    out: list[str] = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if version == 4 and ip.is_IPv4:
                addr = ip.ip
            elif version == 6 and ip.is_IPv6:
                addr = ip.ip[0]
                if ipaddress.ip_address(addr).is_link_local:
                    continue
            else:
                continue
            if addr not in out:
                out.append(addr)  # type: ignore[arg-type]
    return out


def expand(addr: Multiaddr) -> list[Multiaddr]:
    """``addr`` itself, or, for a wildcard host (0.0.0.0 or ::), one address per interface."""
    parts = list(addr)
    if not parts or (parts[0] != ("ip4", "0.0.0.0") and parts[0] != ("ip6", "::")):
        return [addr]
    name = parts[0][0]
    ips = interface_ips(4 if name == "ip4" else 6)
    return [Multiaddr._from_parts(((name, ip), *parts[1:])) for ip in ips] or [addr]


def is_loopback(addr: Multiaddr) -> bool:
    """Whether ``addr`` is on this machine's loopback (127/8 or ::1)."""
    parts = list(addr)
    return bool(parts) and parts[0][0] in ("ip4", "ip6") and (str(parts[0][1]).startswith("127.") or parts[0][1] == "::1")


def is_lan(addr: Multiaddr) -> bool:
    """Whether ``addr`` is an IP address other hosts on the network could reach (not loopback,
    not an in-memory or relayed address)."""
    parts = list(addr)
    return bool(parts) and parts[0][0] in ("ip4", "ip6") and not addr.is_circuit and not is_loopback(addr)
