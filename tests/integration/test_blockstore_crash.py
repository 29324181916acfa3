"""The disk blockstore under real failures: a process writing blocks and pin sets is SIGKILLed
mid-write again and again (once deliberately halfway through a block and through a pin file), and
the reopened store holds only blocks that verify against their CIDs, no temp file, and readable
pins; and a real full disk (a 4 MiB tmpfs) turns into StoreFull with the store still usable."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from lattica.content._blockstore import DiskBlockstore
from lattica.content._cid import Cid
from lattica.errors import StoreFull

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# argv: store directory, seed, what to tear ("" for none, "block" or "pin")
CHILD = r"""
import os, sys, time
from lattica.content import _blockstore as blockstore
from lattica.content._cid import Cid

root, seed, tear = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if tear:
    real_write = os.write
    def torn_write(fd, data):
        view = memoryview(data)
        is_pin = bytes(view[: len(blockstore._PIN_MAGIC)]) == blockstore._PIN_MAGIC
        if (tear == "pin") == is_pin and len(view) > 1000:
            real_write(fd, view[: len(view) // 2])
            print("torn", flush=True)
            time.sleep(600)  # until the parent's SIGKILL
        return real_write(fd, data)
    blockstore.os.write = torn_write

s = blockstore.DiskBlockstore(root, capacity=48 << 20)
base = os.urandom(2 << 20)
recent = []
print("ready", flush=True)
for i in range(10**9):
    n = 1 + (i * 7919 + seed * 104729) % (2 << 20)
    data = (seed * 10**9 + i).to_bytes(8, "big") + base[8:n]
    cid = Cid.of(data)
    s.put(cid, data)
    recent.append(cid)
    if i % 3 == 0:
        s.pin(f"set{i % 4}", recent[-40:])  # big enough (> 1000 bytes) to be torn
"""


def run_child(root: str, seed: int, tear: str = "") -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, root, str(seed), tear], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        if tear:
            assert proc.stdout.readline() == "torn\n"
        else:
            time.sleep(random.uniform(0.05, 0.25))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL


def block_files(root: str) -> tuple[list[str], list[str]]:
    """(final block files, temp files) under the store directory."""
    final, temp = [], []
    for d, _, files in os.walk(root):
        for f in files:
            if f.startswith(".tmp-"):
                temp.append(os.path.join(d, f))
            elif os.path.basename(os.path.dirname(d)) == "blocks" or os.path.basename(d) == "blocks":
                final.append(os.path.join(d, f))
    return final, temp


def test_sigkill_mid_write_never_leaves_a_torn_block(tmp_path):
    root = str(tmp_path / "store")
    temps_seen = 0
    for seed, tear in enumerate(["", "block", "", "pin", "", ""]):
        run_child(root, seed, tear)
        final, temp = block_files(root)
        temps_seen += len(temp)
        if tear:
            assert temp, "the torn write must have left its temp file"
        for path in final:  # before any reopen: every block under its final name is whole
            with open(path, "rb") as f:
                assert Cid.parse(os.path.basename(path)).verify(f.read()), path
    assert temps_seen >= 2
    with DiskBlockstore(root, capacity=48 << 20) as s:
        final, temp = block_files(root)
        assert temp == []
        held = list(s)
        assert len(held) > 5 and sorted(map(str, held)) == sorted(os.path.basename(p) for p in final)
        for cid in held:
            assert cid.verify(s.get(cid, verify=True))
        pins = s.pins()
        assert pins and all(len(cids) <= 40 for cids in pins.values())
        assert s.stats().bytes <= 48 << 20


@pytest.fixture
def tiny_disk(tmp_path):
    """A 4 MiB tmpfs mounted for the test (skipped where mounting is not allowed)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a 4 MiB tmpfs to fill a real disk needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot mount a tmpfs: {e}")
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs (no permission in this container?): {done.stderr.strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=10)


def test_full_disk_is_store_full_and_the_store_stays_usable(tiny_disk):
    s = DiskBlockstore(tiny_disk, capacity=1 << 30)  # the disk fills long before the capacity
    try:
        stored = []
        with pytest.raises(StoreFull, match="full") as err:
            for i in range(10):
                data = i.to_bytes(4, "big") + os.urandom((1 << 20) - 4)
                s.put(Cid.of(data), data)
                stored.append((Cid.of(data), data))
        assert 1 <= len(stored) < 4
        assert tiny_disk in str(err.value)
        final, temp = block_files(tiny_disk)
        assert temp == [] and len(final) == len(stored)
        assert set(s) == {cid for cid, _ in stored} and s.stats().bytes == len(stored) << 20
        for cid, data in stored:
            assert s.get(cid) == data
        s.delete(stored[0][0])  # room again: the store goes on
        small = b"small block"
        assert s.put(Cid.of(small), small)
        s.pin("small", [Cid.of(small)])
        s.close()
        with DiskBlockstore(tiny_disk, capacity=1 << 30) as s:
            assert s.get(Cid.of(small)) == small and s.is_pinned(Cid.of(small))
            assert len(s) == len(stored)
    finally:
        s.close()
