"""``lattica bench`` defaults are short: one configuration unless asked for the matrix, and a
line that says what will run and about how long, before it runs."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def test_bench_rpc_runs_one_configuration_by_default_and_says_so():
    out = subprocess.run(
        [sys.executable, "-c", "from lattica.cli import main; main()", "bench", "rpc", "--duration", "0.5", "--json"],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert (
        len(rows) == 1
        and rows[0]["payload"] == 128
        and rows[0]["concurrency"] == 1000
        and rows[0]["transport"] == "tcp"
    )
    assert "1 configuration of 0.5 s, about" in out.stderr and "--matrix" in out.stderr


def test_a_bench_says_what_it_runs_before_its_first_figure():
    out = subprocess.run(
        [sys.executable, "-c", "from lattica.cli import main; main()", "bench", "ciphers"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stdout
    lines = out.stdout.splitlines()
    assert lines[0].startswith("lattica bench ciphers: ") and ", about " in lines[0], lines
    assert len(lines) >= 2 and lines[1].startswith("noise"), lines


def test_the_busy_poll_bench_compares_both_loops_under_each_load_and_names_a_winner():
    from lattica.bench.busypoll import bench_busy_poll  # (the bench's machinery, as the CLI loads it)

    rows = list(bench_busy_poll((0.0, 200.0), loads=(0, 1), workloads=("call",), runs=1, duration=0.5))
    figures = [r for r in rows if "busy_poll_us" in r]
    assert sorted((r["busy"], r["busy_poll_us"]) for r in figures) == [(0, 0.0), (0, 200.0), (1, 0.0), (1, 200.0)]
    assert all(r["p50_us"] > 0 for r in figures)
    verdicts = [r for r in rows if "wins" in r]
    assert [r["busy"] for r in verdicts] == [0, 1] and all(r["wins"] in ("0 us", "200 us") for r in verdicts)
    for v in verdicts:  # the winner is the one with the lower p50
        mine = {r["busy_poll_us"]: r["p50_us"] for r in figures if r["busy"] == v["busy"]}
        assert mine[float(v["wins"].split()[0])] == min(mine.values())
    assert sum(rows[-1]["verdict"].values()) == 2


def test_the_ceilings_bench_prints_the_machines_own_figures():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from lattica.cli import main; main()",
            "bench",
            "ceilings",
            "--size",
            "67108864",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr
    (row,) = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    for key in ("tcp_stream", "sha256", "aes256gcm", "chacha20poly1305", "udp_1350B"):
        assert row[f"{key}_MB_per_s"] > 0, row
    assert row["udp_1350B_datagrams_per_s"] * 1350 / 1e6 == pytest.approx(row["udp_1350B_MB_per_s"], abs=0.1)


def test_the_content_bench_puts_one_fetch_beside_one_stream_of_the_same_bytes():
    from lattica.bench.content import bench_content  # (the bench's machinery, as the CLI loads it)

    rows = {r["case"]: r for r in bench_content(size=8 << 20, fetchers=2, small=50, rounds=1)}
    one = rows["1->1"]
    assert one["mb_s"] > 0 and one["stream_mb_s"] > 0
    assert one["of_stream"] == pytest.approx(one["mb_s"] / one["stream_mb_s"], rel=0.01)
    assert rows["swarm 1->2"]["publisher_uploaded_x"] <= 3  # (the warm-up fetches are not counted)
