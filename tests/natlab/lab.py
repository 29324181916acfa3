"""A NAT lab built from Linux network namespaces, veth pairs and nftables.

Topology (every box is a network namespace named ``<prefix>-<role>``)::

                      <prefix>-inet   (bridge br0, 198.51.100.1/24, routes firewall subnets)
          ______________/   |    \\_______________________________
         /                  |                                     \\
    <prefix>-relay     <prefix>-s1r (router)                  <prefix>-s3h (kind "public":
    198.51.100.10      wan 198.51.100.101                      198.51.100.103, no router)
    (public hosts:      lan 10.1.0.1/24
     .10, .11, ...)         |
                       <prefix>-s1h (host 10.1.0.2, default route via the router)

* The internet is one L2 segment (a bridge in ``<prefix>-inet``) holding every public
  address of 198.51.100.0/24 (by default; ``Lab(internet=...)`` picks another /24);
  ``198.51.100.1`` is also a router for the public subnets behind ``firewall`` sites
  (203.0.113.4i/30).
* Each site of a NAT kind is a router namespace (``wan`` towards the internet, ``lan`` towards
  its host) whose nftables ruleset (table ``ip natlab``) implements the kind, see
  :func:`router_ruleset` and ``docs/nat-lab.md``.
* Every router drops unsolicited inbound packets in its ``input`` chain (policy drop) so they
  never create a conntrack entry; an accepted one (even answered with ICMP port unreachable)
  would be confirmed and shift the next NAT mapping for that port to another port.
* A site or public host added with ``link=`` (a ``lattica.bench.linkem`` profile, e.g.
  ``"continent"``) is not on the bridge: its ``wan`` is a TUN device (its address as a /32,
  peer 198.51.100.1) whose other end ``t<n>`` is in ``<prefix>-inet`` (a /32 route to that
  address, proxy ARP on br0 for the bridge's hosts), and a forwarder process between the two
  delays every packet by the profile (``rtt`` per round trip across that one uplink; two linked
  sites talking to each other add up both).

Usage::

    ok, why = Lab.available()          # skip the test with ``why`` unless ok
    with Lab(prefix="nl") as lab:
        relay = lab.public_host()       # Host(name="relay", ns="nl-relay", ip="198.51.100.10")
        site = lab.add_site("symmetric")
        far = lab.add_site("full_cone", link="continent")   # 150 ms RTT to everything else
        lab.run(site.host, [sys.executable, "-c", "..."])      # CompletedProcess
        proc = lab.popen(relay, [sys.executable, "-u", "server.py"])  # killed at close

Teardown (``close``/``__exit__``) kills every process inside the lab's namespaces and deletes
the namespaces (their veths and nftables rules go with them).  ``start`` first removes
leftovers of a crashed earlier run with the same prefix.  A lab holds an exclusive lock on
``/run/lock/natlab-<prefix>.lock`` for its lifetime, so two labs with the same prefix wait for
each other instead of deleting each other's namespaces.
"""

from __future__ import annotations

import atexit
import fcntl
import importlib.util
import ipaddress
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .test_matrix import Proc

__all__ = ["Lab", "LabError", "Host", "Site", "KINDS", "router_ruleset", "TwoRelays"]

#: Site kinds (arguments of ``Lab.add_site``).
KINDS = (
    "public",  # host directly on the internet, no router
    "firewall",  # stateful firewall, public host address, no NAT
    "full_cone",  # EIM mapping, endpoint-independent filtering
    "address_restricted",  # EIM mapping, address-dependent filtering
    "port_restricted",  # EIM mapping, address-and-port-dependent filtering (plain masquerade)
    "port_remap",  # like port_restricted but never keeps the host's source port
    "symmetric",  # address-and-port-dependent mapping with random ports
)

INTERNET = ipaddress.ip_network("198.51.100.0/24")
FIREWALL_NET = ipaddress.ip_network("203.0.113.0/24")  # split into one /30 per firewall site
FIRST_PUBLIC_HOST = 10  # 198.51.100.10 .. .99
MAX_PUBLIC_HOSTS = 90
FIRST_SITE = 100  # site i: router (or public host) 198.51.100.(100 + i)
MAX_SITES = 60  # 203.0.113.0/24 holds 63 /30s; 100 + 60 < 255
REMAP_PORTS = "20000-29999"  # port_remap maps source ports into this range...
REMAP_PORTS_ALT = "30000-39999"  # ...or into this one when the source port is in the first
CONE_TIMEOUT = 120  # s a cone mapping lives after its last outbound packet (= Linux UDP stream timeout)
_UDP_TIMEOUT_SYSCTLS = ("nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream")


@dataclass(frozen=True)
class Host:
    """A namespace with one address: ``ip`` is what its own sockets bind to (private for a host
    behind a NAT, public for a public host; for a router it is the ``wan`` address)."""

    name: str
    ns: str
    ip: str


@dataclass(frozen=True)
class Site:
    """One site: ``host`` (always) behind ``router`` (``None`` for kind ``public``).
    ``public_ip`` is the source address that internet hosts observe for ``host``."""

    index: int
    kind: str
    host: Host
    router: Host | None
    public_ip: str


class LabError(RuntimeError):
    pass


def _alive(pid: int) -> bool:
    """Running (a zombie no longer holds its namespace; reaping it is its parent's job)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def _ns_of(where) -> str:
    return where if isinstance(where, str) else where.ns


def router_ruleset(kind: str, wan_ip: str, cone_timeout: int = CONE_TIMEOUT) -> str:
    """The nftables ruleset (``table ip natlab``) of a router of ``kind``; interfaces are
    ``wan`` (internet) and ``lan`` (the site's host).  ``cone_timeout``: seconds a cone
    mapping (full_cone, address_restricted) lives after its last outbound packet."""
    if kind not in KINDS or kind == "public":
        raise ValueError(f"no router for kind {kind!r}")
    cone_key = {
        "full_cone": ("meta l4proto . th sport", "meta l4proto . th dport", "inet_proto . inet_service"),
        "address_restricted": (
            "meta l4proto . ip daddr . th sport",
            "meta l4proto . ip saddr . th dport",
            "inet_proto . ipv4_addr . inet_service",
        ),
    }.get(kind)
    lines = [
        "table ip natlab {",
        # Unsolicited packets to the router itself are dropped *before* conntrack confirms them.
        "  chain input {",
        "    type filter hook input priority filter; policy drop;",
        '    iif "lo" accept',
        '    iifname "lan" accept',
        "    ct state established,related accept",
        "  }",
        "  chain forward {",
        "    type filter hook forward priority filter; policy drop;",
        "    ct state established,related accept",
        '    iifname "lan" oifname "wan" accept',
    ]
    if cone_key:
        lines.append('    iifname "wan" oifname "lan" ct status dnat accept')
    lines.append("  }")
    if kind != "firewall":
        lines += [
            "  chain postrouting {",
            "    type nat hook postrouting priority srcnat; policy accept;",
        ]
        if kind == "symmetric":
            lines.append('    oifname "wan" masquerade fully-random')
        elif kind == "port_remap":
            lines += [
                f'    oifname "wan" meta l4proto {{ tcp, udp }} th sport {REMAP_PORTS} '
                f"snat ip to {wan_ip}:{REMAP_PORTS_ALT}",
                f'    oifname "wan" meta l4proto {{ tcp, udp }} snat ip to {wan_ip}:{REMAP_PORTS}',
                f'    oifname "wan" snat ip to {wan_ip}',
            ]
        else:
            lines.append('    oifname "wan" masquerade')
        lines.append("  }")
    if cone_key:
        learn_key, lookup_key, key_type = cone_key
        lines += [
            # cone mappings: <key> -> internal address . port, refreshed by every outbound packet
            "  map cone {",
            f"    type {key_type} : ipv4_addr . inet_service",
            "    flags dynamic, timeout",
            f"    timeout {cone_timeout}s",
            "  }",
            # runs after srcnat, so th sport is the mapped (public) port
            "  chain learn {",
            "    type filter hook postrouting priority srcnat + 10; policy accept;",
            f'    oifname "wan" meta l4proto {{ tcp, udp }} ct direction original '
            f"update @cone {{ {learn_key} : ct original ip saddr . ct original proto-src }}",
            f'    oifname "wan" meta l4proto {{ tcp, udp }} ct direction reply '
            f"update @cone {{ {learn_key} : ct reply ip saddr . ct reply proto-src }}",
            "  }",
            # a new inbound flow that hits a mapping is forwarded to the mapped host port
            "  chain prerouting {",
            "    type nat hook prerouting priority dstnat; policy accept;",
            f'    iifname "wan" ip daddr {wan_ip} meta l4proto {{ tcp, udp }} '
            f"dnat ip addr . port to {lookup_key} map @cone",
            "  }",
        ]
    lines.append("}")
    return "\n".join(lines) + "\n"


def linkem():
    """lattica/bench/linkem.py of this checkout, loaded on its own: it needs nothing else of
    lattica, so a lab does not import the package (nor depend on it importing cleanly)."""
    mod = sys.modules.get("_natlab_linkem")
    if mod is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lattica", "bench", "linkem.py")
        spec = importlib.util.spec_from_file_location("_natlab_linkem", os.path.normpath(path))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_natlab_linkem"] = mod  # (before running it: its dataclasses look themselves up there)
        spec.loader.exec_module(mod)
    return mod


def _sysctl(path: str, value) -> str:
    return f"echo {value} > /proc/sys/{path.replace('.', '/')}"


# Written first in every namespace: no IPv6 (no DAD/RS noise, no second address family).
_NS_PREAMBLE = [
    _sysctl("net.ipv6.conf.all.disable_ipv6", 1),
    _sysctl("net.ipv6.conf.default.disable_ipv6", 1),
    "ip link set lo up",
]


class Lab:
    """A throw-away internet of network namespaces; see the module docstring."""

    KINDS = KINDS
    _available: tuple[bool, str] | None = None

    def __init__(
        self,
        prefix: str = "nl",
        *,
        lock_timeout: float = 300.0,
        internet: str = str(INTERNET),
        firewall_net: str = str(FIREWALL_NET),
    ):
        """``internet`` and ``firewall_net``: the public /24s (by default documentation ranges; a
        test with a peer that refuses to dial those, as go-libp2p's AutoNAT does, picks others:
        the lab's namespaces are never connected to the machine's own network)."""
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", prefix):
            raise ValueError("prefix must be 1-8 lowercase letters/digits, starting with a letter")
        self.net = ipaddress.ip_network(internet)
        self.firewall_net = ipaddress.ip_network(firewall_net)
        if self.net.prefixlen != 24 or self.firewall_net.prefixlen != 24 or self.net.overlaps(self.firewall_net):
            raise ValueError("internet and firewall_net are two distinct IPv4 /24s")
        self.gateway = str(self.net[1])
        self.prefix = prefix
        self.lock_timeout = lock_timeout
        self.internet = f"{prefix}-inet"
        self.sites: list[Site] = []
        self.public_hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._ports = 0  # counter for the inet-side device names: veths i1, i2, ..., TUNs t3, ...
        self._links: dict[str, subprocess.Popen] = {}  # namespace -> the forwarder of its linked uplink
        #: once closed: each linked uplink's forwarder counters, by namespace (``up``: towards the
        #: internet; ``down``: towards the site), see lattica.bench.linkem
        self.link_counters: dict[str, dict] = {}
        self._lock = None
        self._started = False

    # ----------------------------------------------------------------- availability

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """``(True, "")`` if labs can run here, else ``(False, reason)``; probes once per process
        (root, ``ip``, ``nft``, and a scratch namespace that loads a NAT + dynamic-map ruleset)."""
        if cls._available is None:
            cls._available = cls._probe()
        return cls._available

    @staticmethod
    def _probe() -> tuple[bool, str]:
        if not sys.platform.startswith("linux"):
            return False, "NAT lab needs Linux network namespaces"
        if os.geteuid() != 0:
            return False, "NAT lab needs root (network namespaces, nftables)"
        for tool, pkg in (("ip", "iproute2"), ("nft", "nftables")):
            if shutil.which(tool) is None:
                return False, f"NAT lab needs the `{tool}` command (apt-get install {pkg})"
        ns = f"natlabprobe{os.getpid()}"
        try:
            r = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True)
            if r.returncode:
                return False, f"cannot create a network namespace: {r.stderr.strip()}"
            r = subprocess.run(
                ["ip", "netns", "exec", ns, "nft", "-f", "-"],
                input=router_ruleset("full_cone", "198.51.100.200")
                + router_ruleset("symmetric", "198.51.100.200").replace("table ip natlab", "table ip natlab2"),
                capture_output=True,
                text=True,
            )
            if r.returncode:
                return False, f"nftables NAT/dynamic maps unusable here: {r.stderr.strip()[:300]}"
        except OSError as exc:
            return False, f"NAT lab probe failed: {exc}"
        finally:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        return True, ""

    # ----------------------------------------------------------------- life cycle

    def __enter__(self) -> Lab:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> Lab:
        """Take the prefix lock, remove leftovers of an earlier run, build the internet."""
        if self._started:
            return self
        ok, why = self.available()
        if not ok:
            raise LabError(why)
        self._acquire_lock()
        self._started = True
        atexit.register(self.close)
        try:
            self.cleanup(self.prefix)
            self._add_ns(
                self.internet,
                [
                    _sysctl("net.ipv4.ip_forward", 1),
                    _sysctl("net.ipv4.conf.all.send_redirects", 0),
                    _sysctl("net.ipv4.conf.default.send_redirects", 0),
                    "ip link add br0 type bridge",
                    f"ip addr add {self.gateway}/{self.net.prefixlen} dev br0",
                    "ip link set br0 up",
                    # bridged frames must not go through this namespace's IP hooks
                    "echo 0 > /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || true",
                ],
            )
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Kill the lab's processes and delete its namespaces; safe to call twice."""
        if not self._started:
            return
        self._started = False
        atexit.unregister(self.close)
        try:
            forwarders = set(self._links.values())
            for p in self._procs:
                if p.poll() is None and p not in forwarders:
                    p.kill()
            for ns, p in self._links.items():  # (after the nodes: they report what they carried)
                try:
                    out = p.communicate(timeout=5)[0].strip()  # (closes its stdin: it stops, and reports)
                    self.link_counters[ns] = json.loads(out) if out else {}
                except (OSError, ValueError, subprocess.TimeoutExpired):
                    p.kill()
            self._links.clear()
            for p in self._procs:
                if p.poll() is None:
                    p.kill()
            for p in self._procs:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            self._procs.clear()
            left = self.cleanup(self.prefix, wanted=self._namespaces)
            if left:
                raise LabError(f"namespaces left behind: {left}")
        finally:
            self._namespaces.clear()
            self._release_lock()

    @classmethod
    def cleanup(cls, prefix: str, wanted=()) -> list[str]:
        """Delete every namespace named ``<prefix>-*`` (plus ``wanted``), after killing the
        processes inside; returns the names that could not be deleted.  Only safe while holding
        the prefix lock (``start`` and ``close`` do)."""
        for _ in range(3):
            names = set(wanted) | {n for n in cls._list_ns() if n.startswith(prefix + "-")}
            names &= set(cls._list_ns())
            if not names:
                return []
            pids = set()
            for n in names:
                r = subprocess.run(["ip", "netns", "pids", n], capture_output=True, text=True)
                pids |= {int(x) for x in r.stdout.split()}
            pids.discard(os.getpid())
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while pids and time.monotonic() < deadline:
                pids = {p for p in pids if _alive(p)}
                if pids:
                    time.sleep(0.05)
            subprocess.run(
                ["ip", "-force", "-batch", "-"],
                input="".join(f"netns del {n}\n" for n in sorted(names)),
                capture_output=True,
                text=True,
            )
        return sorted(n for n in cls._list_ns() if n.startswith(prefix + "-") or n in set(wanted))

    @staticmethod
    def _list_ns() -> list[str]:
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]

    def _acquire_lock(self) -> None:
        d = "/run/lock" if os.path.isdir("/run/lock") else "/run"
        f = open(os.path.join(d, f"natlab-{self.prefix}.lock"), "a+")
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    f.seek(0)
                    holder = f.read().strip()
                    f.close()
                    raise LabError(f"lab prefix {self.prefix!r} is in use (lock held by pid {holder})") from None
                time.sleep(0.2)
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._lock = f

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing drops the flock
            self._lock = None

    # ----------------------------------------------------------------- building

    def _require_started(self) -> None:
        if not self._started:
            raise LabError("lab not started (use `with Lab() as lab:` or lab.start())")

    def _add_ns(self, ns: str, script: list[str], nft: str | None = None) -> None:
        r = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True)
        if r.returncode:
            raise LabError(f"ip netns add {ns}: {r.stderr.strip()}")
        self._namespaces.append(ns)
        self._sh(ns, _NS_PREAMBLE + script)
        if nft:
            self.nft(ns, nft)

    def _sh(self, ns: str, script: list[str]) -> None:
        r = subprocess.run(["ip", "netns", "exec", ns, "sh", "-ec", "\n".join(script)], capture_output=True, text=True)
        if r.returncode:
            raise LabError(f"setting up {ns} failed: {r.stderr.strip()}\nscript:\n" + "\n".join(script))

    def _uplink(self, ip: str) -> list[str]:
        """Commands (run inside a namespace) that plug it into the internet bridge as ``wan``."""
        self._ports += 1
        port = f"i{self._ports}"
        return [
            f"ip link add wan type veth peer name {port} netns {self.internet}",
            f"ip -n {self.internet} link set {port} master br0 up",
            f"ip addr add {ip}/{self.net.prefixlen} dev wan",
            "ip link set wan up",
            f"ip route add default via {self.gateway}",
        ]

    def _linked_uplink(self, ns: str, ip: str, link) -> None:
        """Plug ``ns`` into the internet as ``wan`` across an emulated ``link`` (see the module
        docstring): a TUN pair ``wan`` (in ``ns``) / ``t<n>`` (in the internet namespace) and
        the forwarder between them, which ``close`` stops."""
        if not os.path.exists("/dev/net/tun"):
            raise LabError("a linked uplink needs /dev/net/tun")
        lk = linkem()
        pr = lk.profile(link if isinstance(link, str) else lk.Profile(link.rtt, link.rate, link.loss, link.jitter))
        self._ports += 1
        port = f"t{self._ports}"
        if not self._links:  # the first one: the bridge's hosts reach linked addresses by proxy ARP
            self._sh(
                self.internet,
                [
                    _sysctl("net.ipv4.conf.br0.proxy_arp", 1),
                    # (answer at once: by default a proxied ARP reply waits up to 0.8 s, so a host's
                    # first packet to a linked site would)
                    "echo 0 > /proc/sys/net/ipv4/neigh/br0/proxy_delay",
                ],
            )
        fwd = self.popen(
            self.internet,
            lk.tun_pair_argv(f"wan@{ns}", port, pr),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._links[ns] = fwd
        ready = select.select([fwd.stdout], [], [], 10)[0] and fwd.stdout.readline().strip()
        if ready != "ready":
            raise LabError(f"the link forwarder for {ns} did not start (exit {fwd.poll()})")
        self._sh(self.internet, [f"ip link set {port} up", f"ip route add {ip}/32 dev {port}"])
        self._sh(
            ns,
            [
                f"ip addr add {ip}/32 peer {self.gateway} dev wan",
                "ip link set wan up",
                f"ip route add default via {self.gateway}",
            ],
        )

    def public_host(self, name: str = "relay", *, link=None) -> Host:
        """The public host ``name`` (created on first use): directly on the internet, or across
        an emulated ``link`` (a lattica.bench.linkem Profile or profile name, see ``add_site``)."""
        self._require_started()
        if name in self.public_hosts:
            return self.public_hosts[name]
        if not re.fullmatch(r"[a-z][a-z0-9]{0,11}", name) or name == "inet" or re.fullmatch(r"s\d+[rh]", name):
            raise ValueError(f"bad public host name {name!r}")
        if len(self.public_hosts) >= MAX_PUBLIC_HOSTS:
            raise LabError("too many public hosts")
        ip = str(self.net[FIRST_PUBLIC_HOST + len(self.public_hosts)])
        host = Host(name, f"{self.prefix}-{name}", ip)
        self._add_ns(host.ns, self._uplink(ip) if link is None else [])
        if link is not None:
            self._linked_uplink(host.ns, ip, link)
        self.public_hosts[name] = host
        return host

    def add_site(self, kind: str, *, lan: str | None = None, udp_timeout: int | None = None, link=None) -> Site:
        """Add a site of ``kind`` (see ``KINDS``) and return it.

        ``lan``: the site's private subnet (default ``10.<index>.0.0/24``; sites may share one,
        like two homes both on 192.168.1.0/24); router gets .1, host .2.  Ignored for
        ``public`` and ``firewall`` (their host has a public address).
        ``udp_timeout``: seconds for the router's conntrack UDP timeouts (Linux defaults are
        30 s unreplied, 120 s once replied) and for the cone maps, to test keepalives against
        short-lived mappings.
        ``link``: a ``lattica.bench.linkem`` Profile or profile name (``"lan"``, ``"region"``,
        ``"continent"``): the site's uplink (router, or the host of a ``public`` site) crosses
        an emulated link of that round-trip time, loss and rate instead of plugging into the
        bridge, so every packet between the site and anything else takes it (between two linked
        sites, both links)."""
        self._require_started()
        if kind not in KINDS:
            raise ValueError(f"unknown site kind {kind!r}; choose from {KINDS}")
        index = len(self.sites) + 1
        if index > MAX_SITES:
            raise LabError(f"at most {MAX_SITES} sites")
        wan_ip = str(self.net[FIRST_SITE + index])
        host_ns, router_ns = f"{self.prefix}-s{index}h", f"{self.prefix}-s{index}r"
        if kind == "public":
            host = Host(f"s{index}", host_ns, wan_ip)
            self._add_ns(host_ns, self._uplink(wan_ip) if link is None else [])
            if link is not None:
                self._linked_uplink(host_ns, wan_ip, link)
            site = Site(index, kind, host, None, wan_ip)
            self.sites.append(site)
            return site

        if kind == "firewall":
            net = list(self.firewall_net.subnets(new_prefix=30))[index]
        else:
            net = ipaddress.ip_network(lan or f"10.{index}.0.0/24")
            if net.prefixlen > 30 or net.version != 4:
                raise ValueError(f"bad lan {lan!r}")
        router_lan, host_ip = str(net[1]), str(net[2])
        router = Host(f"s{index}r", router_ns, wan_ip)
        host = Host(f"s{index}", host_ns, host_ip)
        timeouts = [_sysctl(f"net.netfilter.{s}", udp_timeout) for s in _UDP_TIMEOUT_SYSCTLS] if udp_timeout else []
        self._add_ns(
            router_ns,
            [_sysctl("net.ipv4.ip_forward", 1)] + (self._uplink(wan_ip) if link is None else []) + timeouts,
            nft=router_ruleset(kind, wan_ip, udp_timeout or CONE_TIMEOUT),
        )
        if link is not None:
            self._linked_uplink(router_ns, wan_ip, link)
        if kind == "firewall":  # (once the router's address is reachable: on the bridge, or by its link)
            self._sh(self.internet, [f"ip route add {net} via {wan_ip}"])
        # the LAN veth is created from the host side (the router namespace exists by now)
        self._add_ns(
            host_ns,
            [
                f"ip link add eth0 type veth peer name lan netns {router_ns}",
                f"ip -n {router_ns} addr add {router_lan}/{net.prefixlen} dev lan",
                f"ip -n {router_ns} link set lan up",
                f"ip addr add {host_ip}/{net.prefixlen} dev eth0",
                "ip link set eth0 up",
                f"ip route add default via {router_lan}",
            ],
        )
        site = Site(index, kind, host, router, host_ip if kind == "firewall" else wan_ip)
        self.sites.append(site)
        return site

    # ----------------------------------------------------------------- running things

    def popen(self, where, argv, **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside ``where`` (a Host, or a namespace name); the process is killed
        at ``close``.  ``kwargs`` go to ``subprocess.Popen``."""
        self._require_started()
        p = subprocess.Popen(["ip", "netns", "exec", _ns_of(where), *argv], **kwargs)
        self._procs.append(p)
        return p

    def run(self, where, argv, *, timeout: float = 60, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` inside ``where`` to completion (text output captured by default)."""
        self._require_started()
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(["ip", "netns", "exec", _ns_of(where), *argv], timeout=timeout, check=check, **kwargs)

    def limit_upload(self, host: Host, mbit: float) -> None:
        """Cap what ``host`` sends to ``mbit`` Mbit/s (a token bucket on its one link, as a home or
        a rack's uplink would): on loopback every node is CPU-bound instead, and what a swarm
        saves the publisher's uplink does not show."""
        dev = "wan" if ipaddress.ip_address(host.ip) in self.net else "eth0"  # (a public host's, or behind a router)
        burst = max(int(mbit * 1e6 / 8 / 250), 16 << 10)  # 4 ms of data, and at least 16 KiB
        self._sh(host.ns, [f"tc qdisc replace dev {dev} root tbf rate {mbit}mbit burst {burst} latency 100ms"])

    def nft(self, where, script: str) -> None:
        """Load nftables ``script`` inside ``where`` (e.g. to tweak a router's rules)."""
        argv = ["ip", "netns", "exec", _ns_of(where), "nft", "-f", "-"]
        r = subprocess.run(argv, input=script, capture_output=True, text=True)
        if r.returncode:
            raise LabError(f"nft in {_ns_of(where)} failed: {r.stderr.strip()}\n{script}")

    def ruleset(self, where) -> str:
        """``nft list ruleset`` of ``where`` (debugging; shows the cone maps' live entries)."""
        return self.run(where, ["nft", "list", "ruleset"]).stdout

    def conntrack(self, where) -> str:
        """The conntrack table of ``where`` (``/proc/net/nf_conntrack``), for debugging."""
        return self.run(where, ["cat", "/proc/net/nf_conntrack"], check=False).stdout


class TwoRelays:
    """The two public relay/bootstrap nodes the node tests share (two observers at different IPs:
    a node behind a NAT learns its mapping type), set up in one place instead of in each test."""

    def __init__(self, lab: Lab) -> None:
        """Add the hosts ``relay`` and ``relaytwo`` (the lab's first public hosts); nothing runs
        until ``start``, so a test can build its sites first."""
        self.lab = lab
        self.hosts = [lab.public_host("relay"), lab.public_host("relaytwo")]
        self.procs: list[Proc] = []

    def start(self, *args: str) -> TwoRelays:
        """A relay node (peer.py ``--relay`` plus ``args``) on each host, the second bootstrapping
        from the first."""
        from .test_matrix import Proc  # (test_matrix imports this module: at the top, a cycle)

        first = Proc(self.lab, self.hosts[0], ["--relay", *args])
        self.procs = [first, Proc(self.lab, self.hosts[1], ["--relay", *args, "--bootstrap", first.addrs[0]])]
        return self

    @property
    def addrs(self) -> list[str]:
        """Each relay's first address: what a node bootstraps from."""
        return [p.addrs[0] for p in self.procs]

    @property
    def boot(self) -> list[str]:
        """peer.py's arguments to bootstrap from both relays (``--bootstrap <addr>`` each)."""
        return [x for a in self.addrs for x in ("--bootstrap", a)]
