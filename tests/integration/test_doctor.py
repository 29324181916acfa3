"""`lattica doctor` as a user runs it: a real process, a real relay, reasons in plain words."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import lattica
from helpers import run_on_pty

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _doctor(*args: str) -> tuple[int, dict]:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(
        [sys.executable, "-m", "lattica.cli", "doctor", "--json", "--wait", "2", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )
    return p.returncode, json.loads(p.stdout)


def test_doctor_reports_a_working_setup_and_the_path_to_a_peer():
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], relay=True) as relay:
        code, r = _doctor(
            "--listen", "/ip4/127.0.0.1/tcp/0", "--bootstrap", str(relay.addrs[0]), "--peer", str(relay.peer_id)
        )
    assert r["bootstrap"][0]["ok"] and r["bootstrap"][0]["transport"] == "tcp"
    assert r["peer"]["ok"] and r["peer"]["path"] == "tcp"
    assert r["peers"]["direct"] >= 1 and r["holepunch"]["attempts"] == 0
    # on loopback AutoNAT has nothing to check: said so, in words
    assert r["nat"]["reachability"] == "unknown" and r["nat"]["reason"]
    assert code == 1 and any("unknown" in p for p in r["problems"])


def test_doctor_says_why_a_bootstrap_peer_cannot_be_reached():
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"]) as gone:
        addr = str(gone.addrs[0])
    code, r = _doctor("--listen", "/ip4/127.0.0.1/tcp/0", "--bootstrap", addr)
    assert code == 1 and not r["bootstrap"][0]["ok"]
    assert "nothing listens there" in r["bootstrap"][0]["why"]
    assert any("no bootstrap peer answered" in p for p in r["problems"])


def test_doctor_says_when_a_peer_refuses_us_for_not_being_a_member():
    from lattica.trust import MeshKey

    ours, theirs = MeshKey.generate(), MeshKey.generate()
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], relay=True, mesh=theirs) as relay:
        code, r = _doctor(
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--bootstrap",
            str(relay.addrs[0]),
            "--peer",
            str(relay.peer_id),
            "--mesh",
            ours.to_text(),
        )
        _, member = _doctor(
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--bootstrap",
            str(relay.addrs[0]),
            "--peer",
            str(relay.peer_id),
            "--mesh",
            theirs.to_text(),
        )
    assert r["mesh"].startswith("members: " + ours.name)
    assert r["peer"]["ok"] and "not a member of this node's mesh" in r["peer"]["refused"]
    assert any("does not take this node as a member" in p for p in r["problems"])
    assert [s["peer"] for s in r["strangers"]] == [str(relay.peer_id)] and "not ours" in r["strangers"][0]["why"]
    assert "refused" not in member["peer"] and member["strangers"] == []


def test_doctor_in_a_terminal_says_what_it_waits_for():
    """In a terminal (a pty here), the wait for the AutoNAT verdict is a line that counts up,
    erased before the report; in a log (no terminal) it is a line per stage, never rewritten."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], relay=True) as relay:
        args = [
            sys.executable,
            "-m",
            "lattica.cli",
            "doctor",
            "--wait",
            "1.5",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--bootstrap",
            str(relay.addrs[0]),
        ]
        p, seen = run_on_pty(args, stdout=subprocess.PIPE, env=env)
        out = p.stdout.read().decode()
        piped = subprocess.run(args, capture_output=True, text=True, timeout=90, env=env)
    assert b"waiting for the AutoNAT verdict" in seen and b"of 1.5 s" in seen
    assert "reachability" in out.lower()
    assert "\r" not in piped.stderr and "reachability" in piped.stdout.lower()
    assert "lattica doctor: waiting up to 1.5 s for the AutoNAT verdict" in piped.stderr, piped.stderr


def test_doctor_in_a_log_says_each_stage_as_it_starts():
    """Output piped (a log, CI): a line per stage on stderr as it starts, not silence until the
    report."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], relay=True) as relay:
        addr, peer = str(relay.addrs[0]), str(relay.peer_id)
        args = [
            sys.executable,
            "-m",
            "lattica.cli",
            "doctor",
            "--json",
            "--wait",
            "1",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--bootstrap",
            addr,
            "--peer",
            peer,
        ]
        p = subprocess.run(args, capture_output=True, text=True, timeout=90, env=env)
    stages = [
        line.removeprefix("lattica doctor: ") for line in p.stderr.splitlines() if line.startswith("lattica doctor: ")
    ]
    assert [s.split(" ")[0] for s in stages] == ["starting", "connecting", "waiting", "reaching"], p.stderr
    assert stages[1] == f"connecting to {addr}" and stages[3] == f"reaching {peer}"
    assert json.loads(p.stdout)["peer"]["ok"]
