"""The dashboard's parts without sockets: the Prometheus text format, the config's checks, a
watcher keeping only the newest picture, the event log's diff of two pictures, the terminal text."""

import asyncio
import math

import pytest

from lattica._metrics import Family, Histogram, render
from lattica.actors.dashboard.config import DashboardConfig, dashboard_config, is_loopback, split_bind
from lattica.actors.dashboard.mesh import MeshWatch, _Watcher
from lattica.actors.dashboard.text import render as render_text


def test_histograms_are_cumulative_with_sum_count_and_inf():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 7.0):
        h.observe(v)
    text = render([Family("x_seconds", "histogram", "what\nit is", [({"a": 'q"\\'}, h)])])
    lines = text.splitlines()
    assert lines[0] == "# HELP x_seconds what\\nit is" and lines[1] == "# TYPE x_seconds histogram"
    assert 'x_seconds_bucket{a="q\\"\\\\",le="0.1"} 2' in lines  # (le: upper bound inclusive)
    assert 'x_seconds_bucket{a="q\\"\\\\",le="1.0"} 3' in lines
    assert 'x_seconds_bucket{a="q\\"\\\\",le="+Inf"} 4' in lines
    assert 'x_seconds_count{a="q\\"\\\\"} 4' in lines and any(
        line.startswith("x_seconds_sum") and "7.65" in line for line in lines
    )
    assert render([Family("g", "gauge", "g").add(math.inf), Family("c", "counter", "c").add(True, k="v")]).splitlines()[
        2::3
    ] == ["g +Inf", 'c{k="v"} 1']
    with pytest.raises(ValueError):
        Histogram((1.0, 0.5))


def test_config_checks_its_address_and_token():
    assert split_bind("127.0.0.1:8265") == ("127.0.0.1", 8265) and split_bind("[::1]:0") == ("::1", 0)
    for bad in ("8265", "host:", ":80", "h:99999", "h:x"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            split_bind(bad)
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost") and not is_loopback("0.0.0.0")
    assert dashboard_config(True).bind == "127.0.0.1:8265" and dashboard_config(None) is None
    with pytest.raises(ValueError):
        dashboard_config(8265)
    with pytest.raises(ValueError):
        DashboardConfig(max_channels=0)


def test_a_watcher_that_does_not_keep_up_holds_only_the_newest_picture():
    async def run():
        class Fake:
            latest = None
            _watchers: set = set()

        w = _Watcher(Fake())
        for i in range(100):
            w.offer({"n": i})
        assert w.skipped == 99
        assert (await w.next()) == {"n": 99}
        w.close()
        assert (await w.next()) is None

    asyncio.run(run())


def _node(pid, state="alive", restarts=0, child_node="B", path="relayed", actor_state="running"):
    return {
        "peer_id": pid,
        "state": state,
        "report": {
            "supervisors": [{"name": "sup", "children": [{"id": "c1", "node": child_node, "restarts": restarts}]}],
            "peers": [{"peer_id": "Z", "path": path}],
            "actors": [{"name": "w", "state": actor_state}],
        },
    }


def test_the_event_log_says_what_changed_between_two_pictures():
    watch = MeshWatch.__new__(MeshWatch)
    MeshWatch.__init__(watch, rt=None, report=None)
    watch._log_changes([_node("A"), _node("B")])
    assert list(watch.events) == []  # the first picture is the baseline
    watch._log_changes(
        [
            _node("A", restarts=1, child_node="C", path="direct", actor_state="failed"),
            _node("B", state="dead"),
            _node("C"),
        ]
    )
    kinds = sorted(e["kind"] for e in watch.events)
    assert kinds == ["death", "failure", "holepunch", "join", "lost", "restart"], list(watch.events)
    [lost] = [e for e in watch.events if e["kind"] == "lost"]
    assert (
        lost["node"] == "B"
        and lost["actors"] == ["w"]
        and "actor w (None) was lost with node …B (dead), no supervisor restarts them" == lost["text"]
    )
    watch._log_changes([_node("A", restarts=1, child_node="C", path="direct", actor_state="failed")])
    kinds = [e["kind"] for e in watch.events]
    assert kinds[-2:] == ["death", "lost"] and "gone from the view" in watch.events[-2]["text"]


def test_only_unsupervised_actors_are_lost_with_their_node_and_failed_starts_are_events():
    watch = MeshWatch.__new__(MeshWatch)
    MeshWatch.__init__(watch, rt=None, report=None)

    def node(pid, state="alive", ended=()):
        return {
            "peer_id": pid,
            "state": state,
            "report": None
            if state == "dead"
            else {
                "supervisors": [{"name": "sup", "children": [{"id": "k", "node": "B", "actor": "kept"}]}]
                if pid == "A"
                else [],
                "actors": [
                    {"name": "kept", "state": "running"},
                    {"name": "alone", "state": "running"},
                    {"name": "spawner", "state": "running", "system": True},
                ]
                if pid == "B"
                else [],
                "ended": list(ended),
            },
        }

    watch._log_changes([node("A"), node("B")])
    watch._log_changes(
        [
            node("A", ended=[{"name": "x", "state": "failed", "reason": "failed to start: ValueError", "ended": 5.0}]),
            node("B", "dead"),
        ]
    )
    lost = [e["actors"] for e in watch.events if e["kind"] == "lost"]
    assert lost == [["alone"]], list(watch.events)  # (a supervised child is restarted; a system actor is the node's)
    [failed] = [e for e in watch.events if e["kind"] == "failure"]
    assert failed["actor"] == "x" and "failed to start: ValueError" in failed["text"]
    watch._log_changes(
        [
            node("A", ended=[{"name": "x", "state": "failed", "reason": "failed to start: ValueError", "ended": 5.0}]),
            node("B", "dead"),
        ]
    )
    assert sum(e["kind"] == "failure" for e in watch.events) == 1  # (once)


def test_the_terminal_text_has_every_table():
    pic = {
        "nodes": [
            {
                "peer_id": "12D3KooWaaaaaaaaAAAA",
                "state": "alive",
                "self": True,
                "cpu": 4,
                "memory": 2 << 30,
                "gpus": 0,
                "labels": {"zone": "a"},
                "load": {"actors": 1},
                "report": {
                    "nat": {"reachability": "public"},
                    "actor_count": 3,
                    "actors": [
                        {
                            "name": "w",
                            "class": "app.W",
                            "state": "running",
                            "mailbox": 0,
                            "calls": 5,
                            "errors": 1,
                            "system": False,
                            "last_error": {"type": "ValueError", "message": "bad input", "method": "f", "time": 1.0},
                        }
                    ],
                    "ended": [
                        {"name": "gone", "class": "app.G", "state": "failed", "reason": "failed to start: OSError"}
                    ],
                    "supervisors": [
                        {
                            "name": "sup",
                            "strategy": "one_for_one",
                            "children": [{"id": "c", "class": "app.W", "node": None, "restarts": 2}],
                        }
                    ],
                    "peers": [
                        {
                            "peer_id": "12D3KooWbbbbbbbbBBBB",
                            "path": "relayed",
                            "transport": "quic",
                            "direction": "inbound",
                        }
                    ],
                },
            },
            {"peer_id": "12D3KooWbbbbbbbbBBBB", "state": "dead", "report": None},
        ]
    }
    text = render_text(pic)
    assert text.startswith("mesh: 1 nodes up, 1 down or left; 1 actors; 0 direct paths, 1 relayed")
    assert "…aaaaAAAA (this)" in text and "2.0 GiB" in text and "zone=a" in text and "public" in text
    assert "app.W" in text and "not running  restarts 2" in text and "relayed  quic" in text
    assert "ValueError: bad input" in text and "FAILED LATELY" in text and "failed to start: OSError" in text
    assert "1 actor" in text and "{" not in text  # (the load in words)


def test_a_members_report_is_checked_and_cut_before_anything_uses_it():
    from lattica.actors.dashboard.clean import MAX_TEXT, clean_member, clean_report

    assert clean_report([1, 2]) is None and clean_report("x") is None and clean_report(7) is None
    junk = {
        "peer_id": "p\x1b[2J",
        "actors": [
            {"name": ["not", "text"], "calls": "<b id=pwned>", "mailbox": float("nan"), "errors": True},
            "not a row",
        ]
        * 3,
        "supervisors": [{"name": "S" * 1_000_000, "children": [{"id": "c", "restarts": float("inf")}] * 10_000}],
        "peers": 7,
        "nat": [1],
        "labels": {"k": "v\x07", 3: "x"},
        "content": {"transfers": "no"},
        "pubsub": {"topics": [{"topic": 5}]},
        "dht": {"table": "<b>"},
        "unknown": {"deep": [[[[1]]]]},
    }
    rep = clean_report(junk)
    assert rep["peer_id"] == "p [2J" and rep["peers"] == [] and rep["nat"] is None and rep["labels"] == {"k": "v "}
    assert (
        rep["actors"]
        == [
            {
                "name": None,
                "class": None,
                "state": None,
                "system": False,
                "mailbox": None,
                "running": None,
                "calls": None,
                "errors": None,
                "failure": None,
                "code": None,
                "job": None,
                "last_error": None,
                "output": None,
                "started": None,
            }
        ]
        * 3
    )
    [sup] = rep["supervisors"]
    assert len(sup["name"]) == MAX_TEXT and len(sup["children"]) == 500 and sup["children"][0]["restarts"] is None
    assert rep["dht"] == {"table": None, "records": None, "rejected": None} and "unknown" not in rep
    assert rep["content"]["transfers"] == [] and rep["pubsub"]["topics"] == [{"topic": None, "mesh": None}]
    import json

    json.dumps(rep, allow_nan=False)  # (nothing a JSON parser in a browser would refuse)
    assert (
        clean_report({"peer_id": "a\u202eb\u2028c\u2066d"})["peer_id"] == "a b c d"
    )  # (no reordering or breaking what follows)
    assert clean_member({"peer_id": 5}) is None
    row = clean_member(
        {"peer_id": "x", "state": "alive\x1b]52;c;Zm9v\x07", "cpu": True, "labels": ["a"], "load": {"actors": -1e309}}
    )
    assert (
        "\x1b" not in row["state"]
        and "\x07" not in row["state"]
        and row["cpu"] is None
        and row["labels"] == {}
        and row["load"]["actors"] is None
    )


def test_the_terminal_text_carries_no_control_characters_whatever_the_picture():
    evil = "\x1b[2J\x1b]0;owned\x07\x1b]52;c;Zm9v\x07"
    pic = {
        "nodes": [
            {
                "peer_id": "12D3KooW" + evil,
                "state": evil,
                "labels": {"zone": evil},
                "error": 5,
                "report": {
                    "actors": [{"name": evil, "class": evil, "state": evil}],
                    "nat": [1],
                    "supervisors": [{"name": evil, "children": "ab"}],
                    "peers": [{"peer_id": evil, "path": evil}] * 500,
                },
            },
            "not a node",
            {"peer_id": "z", "labels": ["x"], "state": "dead", "error": 3},
        ]
    }
    out = render_text(pic)
    assert not any(ch in out for ch in "\x1b\x07\x9b")
    assert "... and 300 more" in out  # (paths capped)
    assert render_text([1, 2]).startswith("mesh: 0 nodes up") and render_text({"nodes": "x"}).startswith(
        "mesh: 0 nodes up"
    )


def test_a_node_lost_with_thousands_of_actors_or_failures_is_a_few_events():
    watch = MeshWatch.__new__(MeshWatch)
    MeshWatch.__init__(watch, rt=None, report=None)
    many = [{"name": f"w{i}", "class": "app.W", "state": "running"} for i in range(1000)]
    ended = [{"name": f"f{i}", "state": "failed", "reason": "boom", "ended": float(i)} for i in range(64)]
    watch._log_changes(
        [
            {"peer_id": "A", "state": "alive", "report": {"actors": many}},
            {"peer_id": "B", "state": "alive", "report": {}},
        ]
    )
    watch._log_changes(
        [
            {"peer_id": "A", "state": "dead", "report": None},
            {"peer_id": "B", "state": "alive", "report": {"ended": ended}},
        ]
    )
    kinds = [e["kind"] for e in watch.events]
    assert kinds.count("lost") == 1 and kinds.count("failure") == 6 and "death" in kinds, kinds
    [lost] = [e for e in watch.events if e["kind"] == "lost"]
    assert (
        lost["count"] == 1000
        and lost["text"].startswith("1000 actors were lost with node …A (dead)")
        and "and 995 more" in lost["text"]
    )
    assert watch.events[-1]["text"] == "… and 59 more actors failed on …B"
