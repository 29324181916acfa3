"""Shard ids, registrations and the provider picker (lattica/shards/_keys.py, _select.py), sans-IO."""

from __future__ import annotations

import collections
import random

import pytest

from lattica._identity import KeyPair
from lattica._runtime.limits import ASYNC
from lattica._runtime.refs import ActorRef
from lattica.shards._keys import decode_registration, encode_registration, shard_id, shard_key
from lattica.shards._select import BAN_FIRST, BAN_MAX, Picker


def test_shard_ids_are_canonical():
    assert (
        shard_id({"model": "tiny", "layers": (0, 4)})
        == shard_id({"layers": [0, 4], "model": "tiny"})
        == "layers=0:4,model=tiny"
    )
    assert shard_id({"expert": 7}) == "expert=7" and shard_id("stage-0") == "stage-0"
    assert shard_key("llm", {"expert": 7}) == b"lattica/shard/llm/expert=7"


@pytest.mark.parametrize(
    "bad",
    [{}, {"a": True}, {"a": (4, 0)}, {"a": 1.5}, {"a b": 1}, {"a": "x/y"}, "", "a/b", "x" * 300, {"a": (1, 2, 3)}],
)
def test_bad_shard_descriptors_are_refused(bad):
    with pytest.raises(ValueError):
        shard_id(bad)


def test_bad_service_names_are_refused():
    for bad in ("", "a/b", "x" * 65, 3):
        with pytest.raises(ValueError):
            shard_key(bad, "s")  # type: ignore[arg-type]


def _ref(i: int, peer=None) -> ActorRef:
    return ActorRef(peer or KeyPair.generate().peer_id, f"a{i}", {"f": ASYNC})


def test_a_registration_round_trips_and_junk_is_refused():
    refs = [_ref(0), _ref(1)]
    raw = encode_registration([(refs[0], 3), (refs[1], 0)], [b"cert"])
    entries, certs = decode_registration(raw)
    assert entries == [(refs[0], 3), (refs[1], 0)] and certs == [b"cert"]
    from lattica import codec

    for junk in (
        b"\xc1",
        codec.encode_bytes([1, 2]),
        codec.encode_bytes([[["x", 1]], []]),
        codec.encode_bytes([[[refs[0], -1]], []]),
        codec.encode_bytes([[[refs[0], 1]], [1]]),
    ):
        with pytest.raises(ValueError):
            decode_registration(junk)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_two_choices_prefer_the_less_loaded_and_the_faster():
    clock = Clock()
    pk = Picker(random.Random(1), clock)
    refs = [_ref(i) for i in range(4)]
    pk.update([(refs[0], 0), (refs[1], 10), (refs[2], 0), (refs[3], 0)])
    slow, fast = pk.providers[(refs[2].peer_id, "a2")], pk.providers[(refs[3].peer_id, "a3")]
    slow.latency, fast.latency = 0.050, 0.001
    counts = collections.Counter(pk.pick().ref.name for _ in range(2000))
    # the loaded one and the slow one lose every pair they are in: they are picked far less
    assert counts["a1"] < counts["a0"] and counts["a2"] < counts["a3"]
    assert counts["a1"] + counts["a2"] < 0.4 * 2000


def test_calls_in_flight_spread_the_load():
    pk = Picker(random.Random(2), Clock())
    refs = [_ref(i) for i in range(3)]
    pk.update([(r, 0) for r in refs])
    held = [pk.pick() for _ in range(30)]
    for p in held:
        pk.started(p)
        if p.inflight > 15:
            break
    loads = sorted(p.inflight for p in pk.providers.values())
    assert loads[-1] - loads[0] <= 12  # (not all on one)


def test_a_failure_bans_with_backoff_and_a_success_ends_it():
    clock = Clock()
    pk = Picker(random.Random(3), clock)
    a, b = _ref(0), _ref(1)
    pk.update([(a, 0), (b, 0)])
    pa = pk.providers[(a.peer_id, "a0")]
    pk.started(pa)
    pk.failed(pa, "unreachable")
    assert all(pk.pick() is not pa for _ in range(50))
    clock.t += BAN_FIRST + 0.01
    assert any(pk.pick() is pa for _ in range(50))
    pk.failed(pa, "unreachable")
    assert pa.banned_until == pytest.approx(clock.t + 2 * BAN_FIRST)
    for _ in range(10):
        pk.failed(pa, "unreachable")
    assert pa.banned_until == pytest.approx(clock.t + BAN_MAX) and pa.reasons == ["unreachable"] * 3
    pk.succeeded(pa, 0.01)
    assert pa.banned_until == 0 and pa.failures == 0
    # all banned: nothing to pick, and when the first comes back
    pk.failed(pa, "x")
    pb = pk.providers[(b.peer_id, "a1")]
    pk.failed(pb, "y", ban=5.0)
    assert pk.pick() is None and pk.next_ready() == pytest.approx(clock.t + BAN_FIRST)
    assert pk.pick(exclude=[pa]) is None


def test_an_update_keeps_what_was_learned_and_drops_the_gone():
    pk = Picker(random.Random(4), Clock())
    a, b, c = _ref(0), _ref(1), _ref(2)
    pk.update([(a, 0), (b, 0)])
    pa = pk.providers[(a.peer_id, "a0")]
    pk.succeeded(pa, 0.02)
    pk.failed(pk.providers[(b.peer_id, "a1")], "gone")
    pk.update([(a, 5), (c, 0)])
    assert set(pk.providers) == {(a.peer_id, "a0"), (c.peer_id, "a2")}
    assert pk.providers[(a.peer_id, "a0")] is pa and pa.load == 5 and pa.latency == 0.02
