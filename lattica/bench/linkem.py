"""An emulated long link for benchmarks: round-trip time, rate cap, loss and jitter, both ways.

This kernel has no ``netem``, so the delay is done in user space: two TUN devices, one left in
this namespace (``near``) and one moved into a fresh namespace (``far``), and a forwarder process
that reads each packet from one and writes it to the other once the link would have delivered it.
Both devices carry the kernel's offloads (a virtio-net header, TSO): TCP hands the forwarder
segments of up to 64 KiB, so one Python loop carries several Gbit/s. A lossy profile turns the
offloads off, so that loss hits one MTU-sized packet at a time as on a real link (the emulator
then carries less; docs/benchmarks.md has both figures).

    with EmulatedLink("continent") as link:        # root only; see ``available()``
        ServerProcess([f"/ip4/{link.far_ip}/tcp/0"], wrap=link.wrap)   # a node on the far side

:class:`DelayLine` is the link itself, sans-IO (packets and a clock in, packets out); the rest is
glue. Profiles: ``lan`` 0.5 ms, ``region`` 10 ms, ``continent`` 150 ms with 0.1 % loss (RTT).

The forwarder also runs on its own between two named devices that it moves into given namespaces
and leaves unaddressed (the NAT lab puts a long link on a site's uplink this way, see
tests/natlab/lab.py); :func:`tun_pair_argv` builds its command line::

    python -m lattica.bench.linkem --tun wan@nl-s1r --tun t1@nl-inet --rtt 0.15 --loss 0.001
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import json
import os
import random
import select
import struct
import subprocess
import sys
import time
from dataclasses import dataclass

__all__ = ["Profile", "PROFILES", "DelayLine", "EmulatedLink", "available", "profile", "tun_pair_argv"]


@dataclass(frozen=True)
class Profile:
    """One link: ``rtt`` s (split evenly both ways), ``rate`` bytes/s each way (None: as fast as
    the emulator goes), ``loss`` per packet, ``jitter`` s (added uniformly in [0, jitter] to each
    packet's delay, never reordering)."""

    rtt: float
    rate: float | None = None
    loss: float = 0.0
    jitter: float = 0.0


PROFILES = {
    "lan": Profile(rtt=0.0005),
    "region": Profile(rtt=0.010),
    "continent": Profile(rtt=0.150, loss=0.001),
}


def profile(link: str | Profile) -> Profile:
    """``link`` as a Profile (a name from PROFILES, or a Profile as is)."""
    if isinstance(link, Profile):
        return link
    try:
        return PROFILES[link]
    except KeyError:
        raise ValueError(f"unknown link profile {link!r}; choose from {sorted(PROFILES)}") from None


class DelayLine:
    """One direction of a link. ``push(now, packet)`` puts a packet on it (False: dropped, by loss
    or because ``limit`` bytes are already on the line); ``due(now)`` takes what has arrived, in
    order; ``next_at()`` is when the next packet arrives (None: the line is empty)."""

    def __init__(
        self,
        delay: float,
        rate: float | None = None,
        loss: float = 0.0,
        jitter: float = 0.0,
        limit: int = 128 << 20,
        rng: random.Random | None = None,
    ) -> None:
        self.delay, self.rate, self.loss, self.jitter, self.limit = delay, rate, loss, jitter, limit
        self._rng = rng or random.Random()
        self._line: collections.deque[tuple[float, bytes]] = collections.deque()
        self._free_at = 0.0  # when the sender side finishes serializing what it holds (rate cap)
        self._last = 0.0  # the latest arrival time handed out: later packets never arrive before it
        self.bytes = 0  # on the line now
        self.sent = self.delivered = self.lost = self.overflow = 0  # packets

    def push(self, now: float, packet: bytes) -> bool:
        self.sent += 1
        if self.bytes + len(packet) > self.limit:
            self.overflow += 1
            return False
        if self.loss and self._rng.random() < self.loss:
            self.lost += 1
            return False
        leave = now
        if self.rate:
            leave = max(now, self._free_at) + len(packet) / self.rate
            self._free_at = leave
        arrive = leave + self.delay + (self._rng.random() * self.jitter if self.jitter else 0.0)
        self._last = arrive = max(arrive, self._last)
        self._line.append((arrive, packet))
        self.bytes += len(packet)
        return True

    def due(self, now: float) -> list[bytes]:
        out = []
        line = self._line
        while line and line[0][0] <= now:
            packet = line.popleft()[1]
            self.bytes -= len(packet)
            out.append(packet)
        self.delivered += len(out)
        return out

    def next_at(self) -> float | None:
        return self._line[0][0] if self._line else None


# -- the glue: TUN devices, the forwarder process, the far namespace -------------------------------

_TUNSETIFF, _TUNSETOFFLOAD = 0x400454CA, 0x400454D0
_IFF_TUN, _IFF_NO_PI, _IFF_VNET_HDR = 0x0001, 0x1000, 0x4000
_TUN_F_CSUM, _TUN_F_TSO4, _TUN_F_TSO6 = 1, 2, 4
_MAX_PACKET = 65536 + 64  # a TSO segment plus its virtio-net header
_BATCH = 64  # packets read from one device before looking at the other


def available() -> tuple[bool, str]:
    """Whether links can be emulated here (and if not, why)."""
    if sys.platform != "linux":
        return False, "link emulation needs Linux (network namespaces, TUN devices)"
    if os.geteuid() != 0:
        return False, "link emulation needs root (network namespaces, TUN devices)"
    if not os.path.exists("/dev/net/tun"):
        return False, "no /dev/net/tun"
    if subprocess.run(["ip", "-V"], capture_output=True).returncode:
        return False, "no `ip` command (iproute2)"
    return True, ""


def _tun(name: str, offload: bool) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    flags = _IFF_TUN | _IFF_NO_PI | (_IFF_VNET_HDR if offload else 0)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), flags))
    if offload:
        fcntl.ioctl(fd, _TUNSETOFFLOAD, _TUN_F_CSUM | _TUN_F_TSO4 | _TUN_F_TSO6)
    return fd


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def _forward(near: int, far: int, lines: dict[int, DelayLine], stop: int) -> None:
    """Move packets between the devices through their delay lines until ``stop`` is readable."""
    other = {near: far, far: near}
    clock = time.monotonic
    while True:
        wake = [t for t in (lines[near].next_at(), lines[far].next_at()) if t is not None]
        timeout = max(0.0, min(wake) - clock()) if wake else None
        ready, _, _ = select.select([near, far, stop], [], [], timeout)
        if stop in ready:
            return
        now = clock()
        for fd in ready:
            line = lines[fd]
            for _ in range(_BATCH):
                try:
                    line.push(now, os.read(fd, _MAX_PACKET))
                except BlockingIOError:
                    break
        now = clock()
        for src, line in lines.items():
            for packet in line.due(now):
                try:
                    os.write(other[src], packet)
                except OSError:  # (the device's queue is full: the packet is lost, as on a link)
                    pass


def _profile_args(pr: Profile) -> list[str]:
    return ["--rtt", repr(pr.rtt), "--rate", repr(pr.rate or 0.0), "--loss", repr(pr.loss), "--jitter", repr(pr.jitter)]


def tun_pair_argv(a: str, b: str, link: str | Profile, python: str = sys.executable) -> list[str]:
    """The command line of a forwarder between two TUN devices ``a`` and ``b``, each
    ``NAME@NAMESPACE`` (or ``NAME``: left where the forwarder runs): it creates both, moves and
    renames each into place, leaves them down and unaddressed, prints ``ready`` and forwards
    through ``link`` until its stdin closes (then prints its counters as one JSON line: ``up`` is
    ``a`` to ``b``). Runs this file, not the package: no ``import lattica`` at start-up."""
    return [python, "-u", os.path.abspath(__file__), "--tun", a, "--tun", b, *_profile_args(profile(link))]


def _place(spec: str, tmp: str) -> None:
    """Move the fresh device ``tmp`` to ``spec``'s namespace (if any) under ``spec``'s name."""
    name, _, ns = spec.partition("@")
    if ns:
        _ip("link", "set", "dev", tmp, "netns", ns)
        _ip("-n", ns, "link", "set", "dev", tmp, "name", name)
    else:
        _ip("link", "set", "dev", tmp, "name", name)


def _serve(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m lattica.bench.linkem")
    p.add_argument("--ns", help="the far namespace (it gets the far device, addressed 10.77.N.2)")
    p.add_argument("--near", help="name of the device left in this namespace")
    p.add_argument("--net", help="the /30's third octet: 10.77.N.1 near, .2 far")
    p.add_argument(
        "--tun",
        action="append",
        default=[],
        metavar="NAME[@NS]",
        help="twice, instead of --ns/--near/--net: the two ends, each moved into NS (default: "
        "this namespace) as NAME; no addresses, the devices stay down",
    )
    p.add_argument("--rtt", type=float, required=True)
    p.add_argument("--rate", type=float, default=0.0)
    p.add_argument("--loss", type=float, default=0.0)
    p.add_argument("--jitter", type=float, default=0.0)
    a = p.parse_args(argv)
    offload = a.loss == 0.0
    if a.tun:
        if len(a.tun) != 2 or a.ns or a.near or a.net:
            p.error("--tun twice, and then no --ns/--near/--net")
        tmp = [f"lkt{os.getpid() % 1_000_000}{s}" for s in "ab"]  # (unique here until renamed)
        near, far = _tun(tmp[0], offload), _tun(tmp[1], offload)
        _place(a.tun[0], tmp[0])
        _place(a.tun[1], tmp[1])
    else:
        if not (a.ns and a.near and a.net):
            p.error("--ns, --near and --net (or --tun twice)")
        near_ip, far_ip = f"10.77.{a.net}.1", f"10.77.{a.net}.2"
        near, far = _tun(a.near, offload), _tun(a.near + "f", offload)
        _ip("link", "set", a.near + "f", "netns", a.ns)
        _ip("addr", "add", near_ip, "peer", far_ip, "dev", a.near)
        _ip("link", "set", a.near, "up")
        _ip("-n", a.ns, "addr", "add", far_ip, "peer", near_ip, "dev", a.near + "f")
        _ip("-n", a.ns, "link", "set", a.near + "f", "up")
        _ip("-n", a.ns, "link", "set", "lo", "up")
    one_way = dict(delay=a.rtt / 2, rate=a.rate or None, loss=a.loss, jitter=a.jitter)
    lines = {near: DelayLine(**one_way), far: DelayLine(**one_way)}
    print("ready", flush=True)
    _forward(near, far, lines, sys.stdin.fileno())
    out = {
        ("up" if fd == near else "down"): dict(
            sent=line.sent, delivered=line.delivered, lost=line.lost, overflow=line.overflow
        )
        for fd, line in lines.items()
    }
    print(json.dumps(out), flush=True)


class EmulatedLink:
    """A far namespace reached from this one over an emulated link (see the module docstring);
    ``far_ip`` is the far side's address, ``wrap`` the argv prefix that runs a command there."""

    def __init__(self, profile: str | Profile, rate: float | None = None) -> None:
        self.profile = PROFILES[profile] if isinstance(profile, str) else profile
        if rate is not None:
            self.profile = Profile(self.profile.rtt, rate, self.profile.loss, self.profile.jitter)
        tag = os.getpid() % 100_000
        self.ns = f"lkem{tag}"
        self._dev = f"lk{tag}"
        self._net = str(tag % 250 + 1)
        self.near_ip, self.far_ip = f"10.77.{self._net}.1", f"10.77.{self._net}.2"
        self.wrap = ["ip", "netns", "exec", self.ns]
        self._proc: subprocess.Popen | None = None
        self.counters: dict[
            str, dict[str, int]
        ] = {}  # once closed: packets sent, delivered, lost, overflow, "up" and "down"

    def __enter__(self) -> EmulatedLink:
        ok, why = available()
        if not ok:
            raise RuntimeError(why)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)  # (a leftover of a crashed run)
        _ip("netns", "add", self.ns)
        pr = self.profile
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lattica.bench.linkem",
                "--ns",
                self.ns,
                "--near",
                self._dev,
                "--net",
                self._net,
                *_profile_args(pr),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self._proc.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            self.__exit__()
            raise RuntimeError("the link emulator did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            try:
                self._proc.stdin.close()  # type: ignore[union-attr]
                report = self._proc.stdout.read().strip()  # type: ignore[union-attr]
                self.counters = json.loads(report) if report else {}
                self._proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        subprocess.run(["ip", "link", "del", self._dev], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


if __name__ == "__main__":
    _serve(sys.argv[1:])
