"""Tests of the NAT lab itself (``lab.py``), with plain sockets inside the namespaces.

Each host namespace runs one small "socket agent" (``python -c AGENT`` via ``ip netns exec``)
that takes JSON commands on stdin (bind, send, receive, TCP connect/accept) and answers on
stdout, so the test drives every socket from here without starting a Python per packet."""

import json
import os
import subprocess
import sys
import time

import pytest

from .lab import KINDS, Lab, LabError, _alive

AGENT = r"""
import json, select, socket, sys, time
socks = {}
def keep(s):
    socks[s.fileno()] = s
    return {"sock": s.fileno(), "port": s.getsockname()[1]}
def recv(s, wait, tag=None, first=False):
    got, deadline = [], time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0 and not (first and got):
        if select.select([s], [], [], left)[0]:
            data, addr = s.recvfrom(2048)
            if tag is None or data.decode() == tag:
                got.append([data.decode(), addr[0], addr[1]])
    return got
for line in sys.stdin:
    req = json.loads(line)
    op = req.pop("op")
    try:
        if op == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("0.0.0.0", req.get("port", 0)))
            res = keep(s)
        elif op == "send":
            socks[req["sock"]].sendto(req["data"].encode(), tuple(req["to"]))
            res = {}
        elif op == "recv":  # datagrams arriving within `wait` s (only the first if `first`)
            res = {"got": recv(socks[req["sock"]], req["wait"], first=req.get("first", False))}
        elif op == "observe":  # wait for datagram `tag`, answer with the observed "ip:port"
            got = recv(socks[req["sock"]], req["wait"], tag=req["tag"], first=True)
            for _, ip, port in got:
                socks[req["sock"]].sendto(f"{ip}:{port}".encode(), (ip, port))
            res = {"got": got}
        elif op == "tcp_listen":
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", req["port"]))
            s.listen(8)
            res = keep(s)
        elif op == "tcp_accept":
            s = socks[req["sock"]]
            s.settimeout(req["wait"])
            c, addr = s.accept()
            c.close()
            res = {"peer": list(addr)}
        elif op == "tcp_connect":
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", req.get("port", 0)))
            s.settimeout(req["wait"])
            try:
                s.connect(tuple(req["to"]))
                res = {"result": "connected"}
            except socket.timeout:
                res = {"result": "timeout"}
            except OSError as e:
                res = {"result": type(e).__name__}
            s.close()
        else:
            res = {"error": f"unknown op {op}"}
    except Exception as e:
        res = {"error": repr(e)}
    print(json.dumps(res), flush=True)
"""


class Agent:
    """The socket agent of one host; ``agent(op, **args)`` returns the agent's answer."""

    def __init__(self, lab, host):
        self.host = host
        self.proc = lab.popen(
            host,
            [sys.executable, "-I", "-S", "-u", "-c", AGENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __call__(self, op, **args):
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"agent in {self.host.ns} died (exit {self.proc.poll()})")
        res = json.loads(line)
        if "error" in res:
            raise RuntimeError(f"agent in {self.host.ns}: {op} {args}: {res['error']}")
        return res


# What a third party can send to a site host's mapped address after the host sent one datagram
# to relay:7000 (and got the answer): the contacted endpoint itself, the same address from
# another port (relay:7001), another address (other:7000).
REACHABLE = {
    "public": {"contacted", "same-addr", "other-addr"},
    "firewall": {"contacted"},
    "full_cone": {"contacted", "same-addr", "other-addr"},
    "address_restricted": {"contacted", "same-addr"},
    "port_restricted": {"contacted"},
    "port_remap": {"contacted"},
    "symmetric": {"contacted"},
}
PRESERVES_PORT = {"public", "firewall", "full_cone", "address_restricted", "port_restricted"}
PREFIX = "nlt"


def _leftovers(prefix):
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix + "-")]


pytestmark = pytest.mark.usefixtures("need_lab")  # (tests/natlab/conftest.py)


@pytest.fixture(scope="module")
def net():
    """One lab for the module: relay + other (public hosts) and one site per kind, each host
    with its socket agent; relay listens on UDP 7000/7001 and TCP 8000, other on UDP 7000."""
    with Lab(prefix=PREFIX) as lab:
        relay, other = lab.public_host("relay"), lab.public_host("other")
        n = type("Net", (), {})()
        n.lab, n.relay, n.other = lab, relay, other
        n.sites = {kind: lab.add_site(kind) for kind in KINDS}
        n.agent = {h.name: Agent(lab, h) for h in [relay, other] + [s.host for s in n.sites.values()]}
        n.relay_udp = {p: n.agent["relay"]("udp", port=p)["sock"] for p in (7000, 7001)}
        n.other_udp = n.agent["other"]("udp", port=7000)["sock"]
        n.relay_tcp = n.agent["relay"]("tcp_listen", port=8000)["sock"]
        yield n
    assert _leftovers(PREFIX) == [], "lab teardown left namespaces behind"


def _observe(net, server, sock, client, csock, to, tag):
    """``client`` sends ``tag`` from ``csock`` to ``to``; returns the (ip, port) that ``server``
    observed, after checking that the server's answer got back to the client."""
    client("send", sock=csock, to=to, data=tag)
    got = net.agent[server]("observe", sock=sock, tag=tag, wait=3)["got"]
    assert got, f"{tag}: nothing arrived at {server}"
    _, ip, port = got[0]
    answer = client("recv", sock=csock, wait=3, first=True)["got"]
    assert answer and answer[0][0] == f"{ip}:{port}", f"{tag}: answer from {server} lost: {answer}"
    return ip, port


@pytest.mark.parametrize("kind", KINDS)
def test_udp_mapping(net, kind):
    """Outbound UDP reaches the public hosts from the site's public address; the source port is
    kept (or not) and the mapping is endpoint-independent (or not) as the kind says."""
    site = net.sites[kind]
    client = net.agent[site.host.name]
    i = KINDS.index(kind)
    for local_port in (41000 + i, 25000 + i):  # 25000+: inside port_remap's own port range
        c = client("udp", port=local_port)["sock"]
        dests = [
            ("relay", net.relay_udp[7000], (net.relay.ip, 7000)),
            ("relay", net.relay_udp[7001], (net.relay.ip, 7001)),
            ("other", net.other_udp, (net.other.ip, 7000)),
        ]
        seen = [
            _observe(net, srv, sock, client, c, to, f"map-{kind}-{local_port}-{n}")
            for n, (srv, sock, to) in enumerate(dests)
        ]
        assert {ip for ip, _ in seen} == {site.public_ip}
        ports = [port for _, port in seen]
        if kind in PRESERVES_PORT:
            assert ports == [local_port] * 3
        elif kind == "port_remap":
            assert len(set(ports)) == 1 and ports[0] != local_port, ports
        else:  # symmetric: a new (random) port per destination, even for another port of relay
            assert len(set(ports)) == 3 and local_port not in ports, ports


@pytest.mark.parametrize("kind", KINDS)
def test_udp_filtering(net, kind):
    """Who may send to the host's mapped address after it contacted relay:7000; unsolicited
    packets are dropped at the router without disturbing the mapping for later destinations."""
    site = net.sites[kind]
    client = net.agent[site.host.name]
    c = client("udp", port=42000 + KINDS.index(kind))["sock"]
    mapped = _observe(net, "relay", net.relay_udp[7000], client, c, (net.relay.ip, 7000), f"filt-{kind}")
    net.agent["relay"]("send", sock=net.relay_udp[7001], to=mapped, data="same-addr")
    net.agent["other"]("send", sock=net.other_udp, to=mapped, data="other-addr")
    net.agent["relay"]("send", sock=net.relay_udp[7000], to=mapped, data="contacted")
    got = client("recv", sock=c, wait=0.3)["got"]
    assert {data for data, _, _ in got} == REACHABLE[kind]
    # The dropped probe from other:7000 must not have created a conntrack entry on the router
    # that would push the host's mapping towards other:7000 onto another port.
    ip, port = _observe(net, "other", net.other_udp, client, c, (net.other.ip, 7000), f"filt-{kind}-later")
    assert ip == site.public_ip
    if kind == "symmetric":
        assert port != mapped[1]
    else:
        assert port == mapped[1], "mapping moved after an unsolicited packet"


@pytest.mark.parametrize("kind", KINDS)
def test_tcp(net, kind):
    """Outbound TCP works from the public address; an unsolicited inbound connection is
    silently dropped (the connect times out, no RST) unless the host is public."""
    site = net.sites[kind]
    client = net.agent[site.host.name]
    i = KINDS.index(kind)
    assert client("tcp_connect", to=[net.relay.ip, 8000], port=43000 + i, wait=3)["result"] == "connected"
    peer = net.agent["relay"]("tcp_accept", sock=net.relay_tcp, wait=3)["peer"]
    assert peer[0] == site.public_ip
    client("tcp_listen", port=44000 + i)
    expect = "connected" if kind == "public" else "timeout"
    assert net.agent["other"]("tcp_connect", to=[site.public_ip, 44000 + i], wait=0.4)["result"] == expect


def test_private_addresses_unreachable(net):
    """A public host cannot reach a site's private address directly."""
    site = net.sites["full_cone"]
    client = net.agent[site.host.name]
    c = client("udp", port=45000)["sock"]
    net.agent["other"]("send", sock=net.other_udp, to=[site.host.ip, 45000], data="direct")
    assert client("recv", sock=c, wait=0.2)["got"] == []


def test_prefix_lock(net):
    """A second lab with a live lab's prefix waits for it instead of deleting its namespaces."""
    with pytest.raises(LabError, match="in use"):
        Lab(prefix=PREFIX, lock_timeout=0.2).start()
    assert len(_leftovers(PREFIX)) == 1 + 2 + 1 + 2 * (len(KINDS) - 1)  # inet, relay+other, sites


def test_teardown_after_failure_and_crash():
    prefix = "nlu"
    # A failing test body: namespaces and the processes in them are gone afterwards.
    with pytest.raises(ZeroDivisionError):
        with Lab(prefix=prefix) as lab:
            site = lab.add_site("symmetric")
            sleeper = lab.popen(site.host, ["sleep", "600"])
            lab.public_host()
            1 / 0
    assert sleeper.poll() is not None
    assert _leftovers(prefix) == []

    # A crashed run (process killed without cleanup) leaves namespaces and a process inside;
    # the next lab with the same prefix removes them when it starts.
    crash = (
        "import os, subprocess, sys\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})\n"
        "from natlab.lab import Lab\n"
        f"lab = Lab(prefix={prefix!r}).start()\n"
        "s = lab.add_site('full_cone')\n"
        "p = lab.popen(s.host, ['sleep', '600'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(p.pid, flush=True)\n"
        "os._exit(3)\n"
    )
    r = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr
    orphan = int(r.stdout.split()[0])
    assert len(_leftovers(prefix)) == 3  # inet, s1r, s1h
    with Lab(prefix=prefix) as lab:
        assert _leftovers(prefix) == [f"{prefix}-inet"]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _alive(orphan):
            time.sleep(0.05)
        assert not _alive(orphan)
    assert _leftovers(prefix) == []
