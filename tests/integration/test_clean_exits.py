"""A script that ends without ``shutdown()`` (returns, raises, SIGINT, SIGTERM) finishes its
pending persistence and prints nothing of its own on the way out."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

WRITE = textwrap.dedent("""\
    import sys, time
    import lattica

    lattica.init()
    doc = lattica.crdt.open("exit/test")
    with doc.transaction():
        doc.map("m")[sys.argv[1]] = 1
    print("written", flush=True)
    if sys.argv[2] == "raise":
        raise SystemExit(3)
    if sys.argv[2] == "wait":
        time.sleep(60)
""")
READ = textwrap.dedent("""\
    import lattica

    lattica.init()
    print(sorted(lattica.crdt.open("exit/test").to_py().get("m", {})))
""")


@pytest.mark.parametrize("how", ["return", "raise", "sigint", "sigterm"])
def test_a_script_that_ends_without_shutdown_keeps_its_writes_and_prints_nothing(tmp_path, how):
    env = dict(os.environ, HOME=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITE, how, "wait" if how.startswith("sig") else how],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "written"
    if how.startswith("sig"):
        proc.send_signal(signal.SIGINT if how == "sigint" else signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == {"return": 0, "raise": 3, "sigint": -signal.SIGINT, "sigterm": 128 + signal.SIGTERM}[how]
    if how == "sigint":
        err = err[err.find("KeyboardInterrupt") :]  # (Python's own traceback of the interrupted line)
        assert err.strip() == "KeyboardInterrupt", err
    else:
        assert err == "", err
    read = subprocess.run([sys.executable, "-c", READ], env=env, capture_output=True, text=True, timeout=60)
    assert read.stdout.strip() == f"['{how}']", read.stderr
