"""The dashboard over real sockets: its pages and data, the token off loopback, the Host check on
loopback, bounded live channels and readers that stop reading, malformed and oversized requests,
and the whole mesh (node processes, a supervisor, a node killed) as one node's dashboard sees it."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest

import lattica
from helpers import wait_for
from lattica._identity import PeerId
from lattica._node import Node
from lattica.actors.dashboard.config import DashboardConfig
from lattica.actors.membership import membership_ref
from lattica.errors import DashboardError
from lattica.mesh.process import ServerProcess
from lattica.mesh.supervised import supervised_mesh

pytestmark = pytest.mark.timeout(120)

TCP = "/ip4/127.0.0.1/tcp/0"


def _get(url, headers=None, timeout=10):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _raw(port, data, timeout=10):
    """Send ``data`` as it is; the status line of the answer ('' if the server closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        got = b""
        while b"\r\n" not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        return got.split(b"\r\n", 1)[0].decode(errors="replace")


def test_pages_data_and_metrics_on_loopback():
    with Node([TCP], dashboard="127.0.0.1:0") as node:
        url = node.dashboard_url
        assert url.startswith("http://127.0.0.1:") and "token" not in url  # loopback: no token needed
        status, headers, body = _get(url)
        assert status == 200 and b"Lattica mesh" in body
        assert (
            "default-src 'self'" in headers["Content-Security-Policy"]
            and headers["X-Content-Type-Options"] == "nosniff"
        )
        assert _get(url + "app.js")[0] == 200 and _get(url + "style.css")[0] == 200
        me = json.loads(_get(url + "api/node")[2])
        assert me["peer_id"] == str(node.peer_id)
        names = {a["name"] for a in me["actors"]}
        assert {"spawner", "dht", "dashboard"} <= names
        pic = json.loads(_get(url + "api/mesh")[2])
        assert (
            pic["self"] == str(node.peer_id)
            and pic["nodes"][0]["self"]
            and pic["nodes"][0]["report"]["peer_id"] == str(node.peer_id)
        )
        status, headers, metrics = _get(url + "metrics")
        text = metrics.decode()
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        assert "# TYPE lattica_call_latency_seconds histogram" in text and 'lattica_actors{peer_id="' in text
        assert 'le="+Inf"' in text and "lattica_dht_routing_table_peers" in text


def test_only_get_and_only_loopback_host_names_on_a_loopback_bind():
    with Node([TCP], dashboard="127.0.0.1:0") as node:
        port = urlsplit(node.dashboard_url).port
        assert (
            _raw(port, b"POST /api/node HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}").split()[1] == "405"
        )
        # a page elsewhere that rebinds its own name to 127.0.0.1 sends its name as Host: refused
        assert _raw(port, b"GET /api/mesh HTTP/1.1\r\nHost: evil.example:8265\r\n\r\n").split()[1] == "403"
        assert _raw(port, b"GET /api/mesh HTTP/1.1\r\nHost: localhost\r\n\r\n").split()[1] == "200"
        assert _raw(port, b"GET /nothing HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").split()[1] == "404"


def test_off_loopback_every_request_for_data_needs_the_token():
    with Node([TCP], dashboard="0.0.0.0:0") as node:
        url = node.dashboard_url
        token = dict(p.split("=", 1) for p in urlsplit(url).query.split("&"))["token"]
        assert len(token) >= 24
        base = f"http://127.0.0.1:{urlsplit(url).port}/"
        for path in ("api/mesh", "api/node", "api/live", "metrics"):
            assert _get(base + path)[0] == 401, path
        for path in ("", "app.js", "style.css"):  # the page itself holds no data (its script asks with the token)
            assert _get(base + path)[0] == 200, path
        assert _get(base + "api/node?token=" + "x" * len(token))[0] == 401
        assert _get(base + "api/node?token=" + token)[0] == 200
        assert _get(base + "metrics", headers={"Authorization": f"Bearer {token}"})[0] == 200
    with pytest.raises(ValueError, match="at least 16"):
        DashboardConfig(bind="0.0.0.0:0", token="short")


def test_a_taken_address_and_a_malformed_one_are_clear_errors():
    with pytest.raises(ValueError, match="HOST:PORT"):
        Node([TCP], dashboard="8265")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(DashboardError, match="cannot listen"):
            Node([TCP], dashboard=f"127.0.0.1:{s.getsockname()[1]}").start()


@lattica.actor
class Idle:
    async def ping(self) -> int:
        return 1


def test_live_channels_are_bounded_and_a_reader_that_stops_reading_costs_one_picture():
    cfg = DashboardConfig(bind="127.0.0.1:0", every=0.05, max_channels=2)
    with Node([TCP], dashboard=cfg) as node:
        port = urlsplit(node.dashboard_url).port

        async def crowd():  # ~100 KB pictures: a reader that stops fills the socket buffers in seconds
            return [Idle.options(name=f"idle-with-a-long-name-{i:04d}").remote() for i in range(600)]

        node.run(crowd(), timeout=30)
        request = b"GET /api/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        stalled = []
        for _ in range(2):  # two pages that never read what they are sent
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(request)
            stalled.append(s)
        watch = node._host.services.dashboard.watch
        assert wait_for(lambda: watch.watchers == 2, timeout=10)
        assert _raw(port, request).split()[1] == "503"  # a third is refused
        # pictures keep coming; the stalled readers skip them instead of queueing them
        assert wait_for(lambda: all(w.skipped > 5 for w in list(watch._watchers)), timeout=30)
        assert _get(node.dashboard_url + "api/node")[0] == 200  # the node serves on meanwhile
        stalled.pop().close()
        assert wait_for(lambda: watch.watchers <= 1, timeout=40)  # its slot is freed
        status, headers, _ = _get_live_status(port)
        assert status == "200" and headers.get("content-type", "").startswith("text/event-stream")
        for s in stalled:
            s.close()


def _get_live_status(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /api/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(4096)
        head = got.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in head[1:] if ": " in line)
        return head[0].split()[1], headers, None


def test_malformed_and_oversized_requests_get_an_error_and_the_node_serves_on():
    with Node([TCP], dashboard="127.0.0.1:0") as node:
        port = urlsplit(node.dashboard_url).port
        assert _raw(port, b"\x16\x03\x01garbage\r\n\r\n").split()[1] == "400"
        assert _raw(port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n").split()[
            1
        ] in ("400", "431")
        assert _raw(port, b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").split()[1] in (
            "400",
            "414",
        )
        assert _get(node.dashboard_url + "api/node")[0] == 200


def _picture(url):
    return json.loads(_get(url + "api/mesh")[2])


def _by_node(pic):
    return {n["peer_id"]: n for n in pic["nodes"]}


def test_one_nodes_dashboard_shows_the_mesh_and_a_killed_node_with_its_children_restarted(tmp_path):
    with supervised_mesh(children=4, processes=3, dashboard="127.0.0.1:0") as (here, procs, sup, refs):
        url = here.dashboard_url
        pic = _picture(url)
        nodes = _by_node(pic)
        assert set(nodes) == {str(here.peer_id), *(p.peer_id for p in procs)}
        assert all(n["state"] == "alive" and n["report"] for n in nodes.values()), [
            n.get("error") for n in nodes.values()
        ]
        keepers = [
            (pid, a["name"])
            for pid, n in nodes.items()
            for a in n["report"]["actors"]
            if a["class"].endswith(".Keeper")
        ]
        assert len(keepers) == 4 and all(pid != str(here.peer_id) for pid, _ in keepers)
        [tree] = nodes[str(here.peer_id)]["report"]["supervisors"]
        assert [c["id"] for c in tree["children"]] == [f"keeper-{i}" for i in range(4)]
        # every path a node reports is one of its peers, direct on loopback
        assert all(p["path"] == "direct" for n in nodes.values() for p in n["report"]["peers"])
        # ... measured by the kernel (TCP_INFO): a round trip and bytes both ways
        tcp = [p for n in nodes.values() for p in n["report"]["peers"] if p["transport"] == "tcp"]
        assert tcp and all(0 < p["rtt_ms"] < 1000 and p["bytes_sent"] > 0 and p["bytes_received"] > 0 for p in tcp), tcp

        victim = next(p for p in procs if any(c["node"] == p.peer_id for c in tree["children"]))
        moved = [c["id"] for c in tree["children"] if c["node"] == victim.peer_id]
        os.kill(victim.pid, signal.SIGKILL)

        def settled():
            pic = _picture(url)
            n = _by_node(pic)
            [t] = n[str(here.peer_id)]["report"]["supervisors"]
            children = {c["id"]: c for c in t["children"]}
            return (
                pic
                if (
                    n[victim.peer_id]["state"] in ("dead", "suspect")
                    and n[victim.peer_id]["report"] is None
                    and all(
                        children[i]["node"] not in (None, victim.peer_id) and children[i]["restarts"] >= 1
                        for i in moved
                    )
                )
                else None
            )

        pic = wait_for(settled, timeout=40)
        assert pic, _picture(url)
        pic = wait_for(
            lambda: (lambda p: p if {"restart", "death"} <= {e["kind"] for e in p["events"]} else None)(_picture(url)),
            timeout=20,
        )
        assert pic, _picture(url)["events"]


def _cli(*args, timeout=90):
    return subprocess.run([sys.executable, "-m", "lattica.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_lattica_status_through_a_member_and_through_a_dashboard():
    with supervised_mesh(children=2, processes=2, dashboard="127.0.0.1:0") as (here, procs, sup, refs):
        r = _cli("status", "--bootstrap", str(here.addrs[0]))
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("mesh: 3 nodes up, 0 down or left")  # (the asking node is listed, not counted)
        for p in procs:
            assert p.peer_id[-8:] in r.stdout
        assert "keeper-0" in r.stdout and "keeper-1" in r.stdout and "SUPERVISORS" in r.stdout and "PATHS" in r.stdout
        # the mesh's paths only: 3 nodes, each with a path to the 2 others (the asking node's are not counted or listed)
        assert "; 6 direct paths, 0 relayed" in r.stdout.splitlines()[0], r.stdout.splitlines()[0]
        [asking] = [line.split()[0] for line in r.stdout.splitlines() if "(asking)" in line]
        assert sum(asking in line for line in r.stdout.split("PATHS", 1)[1].splitlines()) == 0
        r = _cli("status", "--dashboard", here.dashboard_url, "--json")
        assert r.returncode == 0, r.stderr
        # (the node that asked first may still be listed: a connected member, until it is found gone)
        assert {n["peer_id"] for n in json.loads(r.stdout)["nodes"]} >= {str(here.peer_id), *(p.peer_id for p in procs)}


def test_cli_mistakes_are_one_line_with_a_non_zero_status():
    r = _cli("ping", "/ip4/1.2.3/tcp/1/p2p/x")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert (
        r.stderr.strip().count("\n") == 0
        and r.stderr.startswith("lattica ping: ")
        and "/ip4/1.2.3.4/tcp/4001" in r.stderr
    )
    r = _cli("status")
    assert (
        r.returncode == 2
        and r.stderr.strip()
        == "lattica status: give --bootstrap ADDR (any node of the mesh) or --dashboard URL (a node's dashboard)"
    )
    r = _cli("status", "--dashboard", "http://127.0.0.1:9/")
    assert r.returncode == 2 and "cannot reach the dashboard" in r.stderr and "Traceback" not in r.stderr
    r = _cli("--log", "debug", "ping", "/ip4/1.2.3/tcp/1/p2p/x")
    assert r.returncode != 0 and "Traceback" in r.stderr  # asked for


def test_no_head_node_kill_the_node_you_watch_and_open_anothers_dashboard():
    """Every process serves a dashboard; the one watched is killed; another's shows the same mesh,
    with the killed node down. The other two met only through it: they reach each other at the
    addresses membership gossip carries."""
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(ServerProcess([TCP], "--dashboard", "127.0.0.1:0"))]
        procs += [
            stack.enter_context(ServerProcess([TCP], "--dashboard", "127.0.0.1:0", "--connect", procs[0].addr("tcp")))
            for _ in range(2)
        ]
        everyone = {p.peer_id for p in procs}
        assert wait_for(
            lambda: {n["peer_id"] for n in _picture(procs[0].dashboard)["nodes"] if n["report"]} == everyone, timeout=30
        )
        with Node([TCP], membership=False) as here:  # (asks the second for its view, without making it call the third)
            here.connect(procs[1].addr("tcp"))

            async def view():
                return await here.host.runtime.call(
                    membership_ref(PeerId.from_string(procs[1].peer_id)), "view", (), {}, timeout=5
                )

            assert wait_for(
                lambda: {r["peer_id"] for r in here.run(view(), timeout=10) if r["state"] == "alive"} >= everyone,
                timeout=30,
            )
        os.kill(procs[0].pid, signal.SIGKILL)
        with pytest.raises(OSError):
            urllib.request.urlopen(procs[0].dashboard + "api/mesh", timeout=2)

        def same_mesh_without_it():
            pic = _picture(procs[1].dashboard)
            nodes = _by_node(pic)
            if set(nodes) != everyone or nodes[procs[0].peer_id]["state"] != "dead":
                return None
            return all(nodes[p.peer_id]["state"] == "alive" and nodes[p.peer_id]["report"] for p in procs[1:])

        assert wait_for(same_mesh_without_it, timeout=40), [
            (n["peer_id"][-6:], n["state"], n.get("error")) for n in _picture(procs[1].dashboard)["nodes"]
        ]


def _lying(node, answers):
    """``node``'s dashboard actor answers ``report`` with each of ``answers`` in turn (the last
    one from then on): a hostile member."""
    svc = node._host.services.dashboard
    queue = list(answers)

    async def report():
        return queue.pop(0) if len(queue) > 1 else queue[0]

    svc.report = report


def test_a_hostile_members_reports_cannot_break_flood_or_inject_into_the_watchers_picture():
    with Node([TCP], dashboard="127.0.0.1:0") as watcher, Node([TCP]) as evil:
        watcher.connect(evil.addrs[0])
        assert wait_for(lambda: len(watcher.nodes()) == 2, timeout=10)
        big = {
            "supervisors": [{"name": "S" * 1_000_000, "children": [{"id": f"c{i}", "restarts": 0} for i in range(500)]}]
        }
        bumped = {
            "supervisors": [{"name": "S" * 1_000_000, "children": [{"id": f"c{i}", "restarts": 1} for i in range(500)]}]
        }
        _lying(
            evil,
            [
                big,
                bumped,
                [1, 2],
                {"actors": [{"name": [1]}], "peers": 7},
                {"actor_count": "<meta http-equiv=refresh content=0;url=//x>"},
            ],
        )
        url = watcher.dashboard_url
        sizes = []
        for expect in ("ok", "ok", "malformed", "ok", "ok"):
            status, _, body = _get(url + "api/mesh")
            assert status == 200
            sizes.append(len(body))
            node = _by_node(json.loads(body))[str(evil.peer_id)]
            if expect == "malformed":
                assert node["report"] is None and node["error"] == "its report is malformed"
            else:
                assert node["report"] is not None
        pic = json.loads(_get(url + "api/mesh")[2])
        assert max(sizes) < 1_000_000, sizes  # (500 restarts of a child named by a megabyte: cut)
        restarts = [e for e in pic["events"] if e["kind"] == "restart"]
        assert len(restarts) == 500 and all(len(e["text"]) <= 300 for e in pic["events"])
        node = _by_node(pic)[str(evil.peer_id)]
        assert node["report"]["actor_count"] is None and node["report"]["peers"] == []
        assert _get(url + "api/node")[0] == 200  # the watcher serves on


def test_slow_and_idle_connections_are_closed_and_the_node_keeps_working():
    with Node([TCP], dashboard="127.0.0.1:0") as node, Node([TCP]) as other:
        port = urlsplit(node.dashboard_url).port
        slow = []
        for _ in range(300):  # more than the cap; each sends half a request and stops
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"GET /api/node HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: ")
                slow.append(s)
            except OSError:
                pass
        server = node._host.services.dashboard.server
        assert len(server._runner.server.connections) <= 128
        other.connect(node.addrs[0])  # the node's own sockets are not starved
        assert other.ping(node.peer_id) > 0

        def all_closed():
            closed = 0
            for s in slow:
                s.settimeout(0.01)
                try:
                    closed += s.recv(1) == b""
                except TimeoutError:
                    pass
                except OSError:
                    closed += 1
            return closed == len(slow)

        assert wait_for(all_closed, timeout=20)
        assert _get(node.dashboard_url + "api/node")[0] == 200
        for s in slow:
            s.close()


def test_the_dashboard_benchmark_prints_its_figures():
    r = _cli("bench", "dashboard", "--json", "--duration", "1", "--runs", "1", timeout=180)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["case"] for row in rows] == [
        "picture, 4 nodes, 6 children",
        "picture, 200 nodes, 5000 actors (simulated)",
        "Table 1 128 B async, node serving 3 pages vs none",
        "buffers per actor (500 actors)",
    ]
    assert (
        rows[0]["bytes"] > 1000 and rows[0]["p50_ms"] > 0 and rows[1]["bytes"] > 1_000_000 and rows[1]["encode_ms"] > 0
    )
    assert rows[2]["qps_without"] > 0 and rows[2]["qps_with"] > 0 and 0 < rows[2]["ratio"]
    assert 0 < rows[3]["output_ring_empty_bytes"] < rows[3]["output_ring_full_bytes"] and rows[3]["series_bytes"] > 0


def test_the_grafana_dashboard_asks_only_for_metrics_a_node_exposes():
    """docs/grafana/lattica.json: every metric its panels query is one a node's /metrics (a relay,
    so its counters too) has, with the labels the queries group by."""
    import re

    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "grafana", "lattica.json")) as f:
        board = json.load(f)
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    with Node([TCP], dashboard="127.0.0.1:0", relay=True) as node, Node([TCP]) as other:
        other.connect(node.addrs[0])  # (a connection, so connections have samples)
        other.ping(node.peer_id)
        text = _get(node.dashboard_url + "metrics")[2].decode()
    exposed = set(re.findall(r"^# TYPE (\w+) ", text, re.M))
    for expr in exprs:
        for name in re.findall(r"\b(lattica_\w+)", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert base in exposed, (name, expr)
        for label in re.findall(r"by \(([\w, ]+)\)", expr):
            for lab in (x.strip() for x in label.split(",")):
                assert lab == "le" or re.search(rf'\b{lab}="', text), (lab, expr)
