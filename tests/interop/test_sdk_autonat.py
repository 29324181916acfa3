"""AutoNAT v2 with rust-libp2p 0.54 (the Lattica SDK 1.0.21, its AutoNAT v2 client on): an SDK
node that bootstraps from our node asks our server to dial one of its addresses back; we dial
it from a fresh port on libp2p's stack and deliver the nonce, and the SDK's client counts the
dial-back a success (its own log says so, naming our node and the nonce). Real processes on
127.0.0.1; the SDK runs in a folder of its own (it writes its key and blocks where it runs)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time

import lattica

TCP = "/ip4/127.0.0.1/tcp/0"

# run by the SDK venv's interpreter: an SDK node with AutoNAT v2's client, bootstrapped from us
_SDK_NODE = """
import sys, time
import lattica as sdk
node = (sdk.Lattica.builder().with_listen_addrs(["/ip4/127.0.0.1/tcp/0"]).with_bootstraps([sys.argv[1]])
        .with_mdns(False).with_upnp(False).with_autonat(True).build())
print("peer", node.peer_id(), flush=True)
sys.stdin.read()
node.close()
"""


def test_the_sdks_autonat_v2_client_is_dialed_back_by_our_server(sdk_python) -> None:
    with lattica.Node([TCP], mdns=False) as ours, tempfile.TemporaryDirectory(prefix="sdk-autonat-") as home:
        env = dict(os.environ, RUST_LOG="warn,libp2p_autonat=debug", NO_COLOR="1")
        proc = subprocess.Popen(
            [str(sdk_python), "-c", _SDK_NODE, str(ours.addrs[0])],
            cwd=home,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            counts = ours.host.services.autonat.v2_counts
            deadline = time.monotonic() + 20
            while counts["reached"] == 0 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
            assert counts["reached"] >= 1, counts
            assert counts["refused"] == 0
        finally:
            out, _ = proc.communicate(input="", timeout=20)
        peer = re.search(r"^peer (\S+)$", out, re.M)
        assert peer is not None, out[-2000:]
        ok = [line for line in out.splitlines() if "Successful dial-back" in line]
        assert ok and f"peer_id={ours.peer_id}" in ok[0], out[-2000:]
