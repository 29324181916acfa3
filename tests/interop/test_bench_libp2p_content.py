"""``lattica bench libp2p-content`` runs its four figures with the installed SDK at a tiny size and
gives a row for each with its keys: every leaf from the SDK node over Bitswap, the forced Bitswap
run over Bitswap, lookups that found what was stored, a swarm that completed (figures are the
bench's business, not the test's)."""

from __future__ import annotations

import pytest

from lattica.bench.libp2p_content import MiB, bench_libp2p_content

pytestmark = pytest.mark.timeout(240)

KEYS = {
    "bitswap from an sdk node": {"lattica_mb_s", "sdk_mb_s", "ratio", "all_from_a", "sdk_all_from_a", "same_cids"},
    "bitswap from a lattica node": {"actor_mb_s", "bitswap_mb_s", "ratio", "bitswap_bytes", "bitswap"},
    "kad lookups": {
        "lattica_closest_p50_ms",
        "lattica_closest_p99_ms",
        "lattica_get_p50_ms",
        "lattica_get_p99_ms",
        "sdk_get_p50_ms",
        "sdk_get_p99_ms",
    },
    "swarm: 1 lattica + 2 sdk providers -> 4 fetchers": {
        "completed",
        "seconds",
        "publisher_mib",
        "sdk_mib",
        "fetchers_mib",
    },
}


def test_bench_libp2p_content_gives_each_figure(sdk_python):
    size = 3 * MiB + 4321  # four leaves, the last one short
    rows = list(bench_libp2p_content(sdk_python, size=size, lookups=3, keys=4, rounds=1))
    assert [r["case"] for r in rows] == list(KEYS)
    for row in rows:
        assert row["bench"] == "libp2p-content"
        assert KEYS[row["case"]] <= row.keys(), row
    from_sdk, from_lattica, kad, swarm = rows
    # figure 1: our UnixFS leaves are the SDK's put_block CIDs; every leaf came from A over Bitswap
    assert from_sdk["same_cids"] and from_sdk["r_blocks"] == 1 and from_sdk["error"] is None, from_sdk
    assert from_sdk["all_from_a"] and from_sdk["from_a_bytes"] == size and from_sdk["sdk_all_from_a"], from_sdk
    # figure 2: the forced run went over Bitswap (the whole object and its root), the other not at all
    assert from_lattica["bitswap_bytes"][0] > size and from_lattica["actor_runs_bitswap_bytes"] == 0, from_lattica
    assert from_lattica["actor_mb_s"] and from_lattica["bitswap_mb_s"], from_lattica
    # figure 3: the lookers held nothing, and found every value
    assert kad["held_by_lookers_before"] == 0 and kad["lattica_get_found"] == kad["sdk_get_found"] == 3, kad
    assert kad["lattica_closest_ok"] == 3, kad
    # figure 4: every fetcher completed; what they got (the leaves and the root, once each) came
    # from the three kinds of provider
    assert swarm["completed"] == 4 and not swarm["errors"] and len(swarm["seconds"]) == 4, swarm
    got = swarm["publisher_mib"] + swarm["sdk_mib"] + swarm["fetchers_mib"]
    assert swarm["other_mib"] == 0 and got == pytest.approx(4 * size / MiB, abs=0.2), swarm
