"""Placement from a membership view: labels, free resources, spread and pack."""

from __future__ import annotations

import pytest

from lattica._placement import Spawnable, candidates, free, runs
from lattica.errors import PlacementError


def node(pid, cpu=4, memory=8e9, gpus=0, state="alive", labels=None, actors=0, reserved=None):
    return {
        "peer_id": pid,
        "state": state,
        "cpu": cpu,
        "memory": memory,
        "gpus": gpus,
        "labels": labels or {},
        "load": {"actors": actors, "reserved": reserved or {}},
    }


VIEW = [
    node("a", cpu=8, actors=5, reserved={"cpu": 6}),  # 2 cpu free
    node("b", cpu=4, actors=1, labels={"zone": "x"}),  # 4 free
    node("c", cpu=16, gpus=2, actors=3, reserved={"cpu": 4, "gpus": 1}),  # 12 free, 1 gpu free
    node("d", cpu=64, state="dead"),
    node("e", cpu=4, state="suspect"),
]


def test_free_is_offered_minus_reserved():
    assert free(VIEW[2]) == {"cpu": 12.0, "memory": 8e9, "gpus": 1.0}


def test_only_alive_nodes_with_the_labels_and_the_room_are_candidates():
    assert set(candidates(VIEW, {"cpu": 1})) == {"a", "b", "c"}
    assert candidates(VIEW, {"cpu": 1}, {"zone": "x"}) == ["b"]
    assert candidates(VIEW, {"cpu": 3}) == ["b", "c"]  # a has 2 cpu left
    assert candidates(VIEW, {"gpus": 1}) == ["c"]


def test_spread_prefers_the_least_loaded_and_counts_recent_placements():
    assert candidates(VIEW, {"cpu": 1}, strategy="spread") == ["b", "c", "a"]
    assert candidates(VIEW, {"cpu": 1}, strategy="spread", recent={"b": 3})[0] == "c"
    # placing 6 one after another, remembering each, evens out the actor counts (b 1, c 3, a 5)
    recent: dict[str, int] = {}
    for _ in range(6):
        first = candidates(VIEW, {"cpu": 1}, recent=recent)[0]
        recent[first] = recent.get(first, 0) + 1
    assert recent == {"b": 4, "c": 2}
    # b's 4 cpus are now taken: it is no longer a candidate
    assert "b" not in candidates(VIEW, {"cpu": 1}, recent=recent)


def test_pack_prefers_the_fullest_node_that_fits():
    assert candidates(VIEW, {"cpu": 1}, strategy="pack")[0] == "a"
    assert candidates(VIEW, {"cpu": 1}, strategy="pack", recent={"a": 2})[0] == "b"  # a is full by now


def test_nothing_fits_is_a_clear_error():
    with pytest.raises(PlacementError, match="no node fits") as e:
        candidates(VIEW, {"cpu": 32})
    assert "c: it has {'cpu': 12.0} free of {'cpu': 32}" in str(e.value) and "d: it is dead" in str(e.value)
    with pytest.raises(PlacementError, match="unknown resources"):
        candidates(VIEW, {"tpu": 1})
    with pytest.raises(PlacementError, match="placement must be one of"):
        candidates(VIEW, {"cpu": 1}, strategy="random")


def test_nodes_that_cannot_run_the_class_are_skipped_and_the_error_says_why():
    view = [
        {"peer_id": "open", "state": "alive", "cpu": 4, "code": {"accept": "members", "allow": []}},
        {"peer_id": "strict", "state": "alive", "cpu": 4, "code": {"accept": "admins", "allow": []}},
        {"peer_id": "closed", "state": "alive", "cpu": 4, "code": {"accept": "nobody", "allow": ["myapp.*"]}},
        {"peer_id": "silent", "state": "alive", "cpu": 4},  # says nothing: its spawner decides
    ]
    member_code = Spawnable("train.Shard", code_admin=False)
    assert sorted(candidates(view, {"cpu": 1}, what=member_code)) == ["open", "silent"]
    assert sorted(candidates(view, {"cpu": 1}, what=Spawnable("train.Shard", code_admin=True))) == [
        "open",
        "silent",
        "strict",
    ]
    assert sorted(candidates(view, {"cpu": 1}, what=Spawnable("myapp.Model"))) == [
        "closed",
        "silent",
    ]  # installed, not shipped
    assert "closed" in candidates(view, {"cpu": 1}, what=Spawnable("lattica.supervisor.Supervisor"))
    assert "strict" in candidates(
        view, {"cpu": 1}, what=Spawnable("train.Shard", code_admin=False, home="strict")
    )  # its own
    with pytest.raises(PlacementError) as e:
        candidates(view[1:3], {"cpu": 1}, what=member_code)
    assert "no node fits train.Shard" in str(e.value)
    assert "strict: it runs code only from administrators of its mesh (accept_code='admins')" in str(e.value)
    assert "closed: it runs no code that travels (accept_code='nobody')" in str(e.value)
    assert (
        runs(view[2], Spawnable("other.X"))
        == "its allow-list ['myapp.*'] does not name other.X and its code does not travel"
    )


def test_an_administrators_placement_ranks_administrators_nodes_first():
    nodes = [
        {"peer_id": "lure", "state": "alive", "cpu": 1024, "admin": False, "load": {"actors": 0}},
        {"peer_id": "ours", "state": "alive", "cpu": 2, "admin": True, "load": {"actors": 5}},
        {"peer_id": "says-admin", "state": "alive", "cpu": 64, "admin": "yes", "load": {"actors": 0}},  # (not True)
    ]
    assert candidates(nodes, {"cpu": 1}) == ["lure", "says-admin", "ours"]
    assert candidates(nodes, {"cpu": 1}, admins_first=True) == ["ours", "lure", "says-admin"]
    assert candidates(nodes, {"cpu": 1}, strategy="pack", admins_first=True)[0] == "ours"
    assert candidates(nodes, {"cpu": 8}, admins_first=True) == ["lure", "says-admin"]  # (none of ours fits)
