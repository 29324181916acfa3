"""CRDT replicas under real crashes: a process SIGKILLed right after ``commit(replicas=1)``
returned (the change lives on in the other replica and comes back to a restarted one, from its
own disk or from the peer), processes SIGKILLed again and again mid-write (the store reopens
to a whole prefix of each chain: no torn envelope, no gap), and again while they compact their
logs (a checkpoint and the deletion of what it covers are one transaction)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

import lattica
from lattica.config import CrdtConfig
from lattica.crdt._store import Store
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(180)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TCP = "/ip4/127.0.0.1/tcp/0"

WRITER = r"""
import sys, time, lattica
from lattica.config import CrdtConfig
boot, key_path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "compact":  # an owner document (its owner checkpoints alone), a checkpoint every 20 envelopes
    lattica.init([], key_path=key_path, crdt=CrdtConfig(compact_every=20))
    doc = lattica.crdt.open("crash", owner=True)
else:
    lattica.init([], bootstrap=[boot] if boot else [], key_path=key_path)
    doc = lattica.crdt.open("crash")
if mode == "commit":
    with doc.transaction():
        doc.map("m")["precious"] = "kept"
    print("committed", doc.commit(replicas=1, timeout=20).result(25), flush=True)
    time.sleep(600)  # until the SIGKILL
elif mode == "read":
    time.sleep(float(sys.argv[4]))
    print(repr(doc.to_py()), flush=True)
else:  # "churn", "compact": write and commit without end
    print("ready", flush=True)
    for i in range(10**9):
        with doc.transaction():
            doc.map("m")[str(i % 50)] = i
            doc.text("t").insert(0, "x" * (i % 7))
        if i % 5 == 0:
            doc.commit().result(10)
"""


def _env(key: MeshKey, store: str) -> dict:
    return {
        **os.environ,
        "LATTICA_MESH": key.to_text(),
        "LATTICA_CRDT": store,
        "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
    }


def _start(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def test_a_replica_killed_right_after_commit_loses_nothing(tmp_path):
    key = MeshKey.generate()
    keyfile = str(tmp_path / "writer.key")
    with lattica.Node([TCP], mesh=key, crdt=CrdtConfig(path=str(tmp_path / "peer"))) as peer:
        doc = lattica.crdt.open("crash", node=peer)
        boot = str(peer.addrs[0])
        proc = _start([boot, keyfile, "commit"], _env(key, str(tmp_path / "writer")))
        try:
            line = proc.stdout.readline()
            assert line == "committed 1\n", (line, proc.stderr.read() if proc.poll() is not None else "")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        assert doc.to_py() == {"m": {"precious": "kept"}}  # the other replica holds it
        # the killed writer restarts on its own disk: the change is there before any peer answers
        out = subprocess.run(
            [sys.executable, "-c", WRITER, "", keyfile, "read", "0"],
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(key, str(tmp_path / "writer")),
        )
        assert out.stdout.strip() == repr({"m": {"precious": "kept"}}), out.stderr[-2000:]
        # and a replacement with an empty disk gets it back from the peer
        out = subprocess.run(
            [sys.executable, "-c", WRITER, boot, keyfile, "read", "1.5"],
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(key, str(tmp_path / "fresh")),
        )
        assert out.stdout.strip() == repr({"m": {"precious": "kept"}}), out.stderr[-2000:]


@pytest.mark.parametrize("round_", range(4))
def test_killed_mid_write_the_store_reopens_to_whole_chains(tmp_path, round_):
    key = MeshKey.generate()
    store_dir = str(tmp_path / "store")
    keyfile = str(tmp_path / "k")
    for kill in range(3):
        proc = _start(["", keyfile, "churn"], _env(key, store_dir))
        try:
            assert proc.stdout.readline() == "ready\n", proc.stderr.read() if proc.poll() is not None else ""
            time.sleep(random.uniform(0.2, 0.8))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
    store = Store(os.path.join(store_dir, "crdt.sqlite"))
    try:
        docs = store.documents().result(10)
        assert [d[1] for d in docs] == ["crash"]
        nonce, snap, envs, _ = store.load(docs[0][0]).result(30)
        assert nonce is None and envs  # (killed, never closed: the next session starts a new chain)
        seqs: dict = {}
        for _, env in envs:
            assert env.verify()
            assert env.seq == seqs.get(env.chain, 0) + 1, "a gap or a repeat in a chain"
            seqs[env.chain] = env.seq
        # a session killed may have published envelopes it never wrote: the next one starts a new chain
        assert 1 <= len(seqs) <= 3
    finally:
        store.close()
    # and the node reopens it, with the same content as replaying the log gives
    with lattica.Node([TCP], mesh=key, key_path=keyfile, crdt=CrdtConfig(path=store_dir)) as n:
        d = lattica.crdt.open("crash", node=n)
        assert len(d.to_py()["m"]) == 50 and d.stats()["refused"] == 0


@pytest.mark.parametrize("round_", range(3))
def test_killed_while_compacting_the_store_reopens_to_a_checkpoint_and_whole_chains_after_it(tmp_path, round_):
    from lattica.crdt._checkpoint import Checkpoint, check_state

    key = MeshKey.generate()
    store_dir = str(tmp_path / "store")
    keyfile = str(tmp_path / "k")
    for kill in range(3):
        proc = _start(["", keyfile, "compact"], _env(key, store_dir))
        try:
            assert proc.stdout.readline() == "ready\n", proc.stderr.read() if proc.poll() is not None else ""
            time.sleep(random.uniform(0.3, 1.0))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
    store = Store(os.path.join(store_dir, "crdt.sqlite"))
    try:
        docs = store.documents().result(10)
        nonce, snap, envs, cps = store.load(docs[0][0]).result(30)
        assert len(cps) == 1, "no checkpoint made (or a superseded one kept)"
        cp = Checkpoint.from_bytes(cps[0][0])
        assert check_state(cp, cps[0][1])[0] == ""
        covers = cp.covers()
        seqs: dict = {}
        for _, env in envs:
            if env.kind:  # (the owner's writers list: never compacted)
                continue
            assert env.verify()
            assert env.seq > covers.get(env.chain, 0), "an envelope the checkpoint covers was kept"
            assert env.seq == seqs.get(env.chain, covers.get(env.chain, 0)) + 1, "a gap or a repeat in a chain"
            seqs[env.chain] = env.seq
    finally:
        store.close()
    with lattica.Node([TCP], mesh=key, key_path=keyfile, crdt=CrdtConfig(path=store_dir)) as n:
        d = lattica.crdt.open("crash", node=n, owner=True)
        s = d.stats()
        assert len(d.to_py()["m"]) == 50 and s["refused"] == 0 and s["checkpoints"] == 1, s
