"""Issue 46, finding 1: a stranger's DHT answers cannot aim our dials. Real nodes on this
machine's LAN address (loopback is exempt from per-destination budgets: a machine's own): a
stranger answers every lookup with 40 made-up peers x 8 addresses of a victim host; an honest
member's lookup through it must not open hundreds of connections to the victim."""

from __future__ import annotations

import socket
import threading
import time

import pytest

import lattica
from lattica._interfaces import interface_ips, is_loopback_ip
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(60)


def _lan_ip():
    for ip in interface_ips(4):
        if ":" not in ip and not is_loopback_ip(ip):
            return ip
    return None


class Victim:
    """Eight listening sockets on one host counting the connections made to them (and saying
    nothing: a dial to them waits for its handshake until it gives up)."""

    def __init__(self, ip: str, ports: int = 8) -> None:
        self.socks = []
        for _ in range(ports):
            s = socket.socket()
            s.bind((ip, 0))
            s.listen(512)
            s.settimeout(0.2)
            self.socks.append(s)
        self.accepted = 0
        self.held = []
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def addrs(self):
        return [f"/ip4/{s.getsockname()[0]}/tcp/{s.getsockname()[1]}" for s in self.socks]

    def _run(self):
        while not self.stop:
            for s in self.socks:
                try:
                    c, _ = s.accept()
                except (TimeoutError, OSError):
                    continue
                self.accepted += 1
                self.held.append(c)

    def close(self):
        self.stop = True
        self.thread.join()
        for c in self.held + self.socks:
            c.close()


def test_a_strangers_lookup_answers_cannot_aim_an_honest_nodes_dials():
    ip = _lan_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address (loopback is exempt from per-destination budgets)")
    victim = Victim(ip)
    fakes = [[lattica.KeyPair.generate().peer_id, [lattica.Multiaddr(a) for a in victim.addrs]] for _ in range(40)]
    listen = [f"/ip4/{ip}/tcp/0"]
    try:
        with (
            lattica.Node(listen, mesh=MeshKey.generate(), membership=False) as evil,
            lattica.Node(listen, mesh=MeshKey.generate(), membership=False) as honest,
        ):

            async def closer(target):  # every answer: 40 made-up peers, all at the victim
                return fakes

            async def value(kid):
                return [[], fakes]

            dht = evil._host.runtime.actors["dht"]
            dht.bound["find_node"], dht.bound["find_value"] = closer, value
            honest.connect(evil.addrs[0])
            t0 = time.monotonic()
            for key in ("bank", "ledger", "weights"):  # three honest lookups through it
                try:
                    lattica.dht.get(key, node=honest).result(timeout=8)
                except (lattica.errors.LatticaError, TimeoutError):
                    pass
            took = time.monotonic() - t0
            time.sleep(0.5)
            # 8 dials at once to the victim's IP, then one per 5 s (about 3 more here), not 320 a lookup
            assert victim.accepted <= 8 + took / 5 + 2, (victim.accepted, took)
            assert honest.ping(evil.peer_id) > 0  # (the honest node itself is fine)
    finally:
        victim.close()
