"""A starting node loads only what it needs (issue 16's startup budget): what is imported later,
on first use, stays out of a fresh process that imports lattica and listens on TCP. The budget
itself (time and resident memory) is measured by ``lattica bench startup``, not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys

# Each is loaded when first needed: structlog on the first log event let through, pykka for the
# first actor with sync methods, ifaddr to read interfaces (wildcard listen addresses, LAN
# checks), mDNS on a LAN address, aioquic for QUIC; hashlib and shutil not at all (they load a
# second OpenSSL binding and the compression libraries); the relay service on a node that relays,
# supervisors and the shard stub's client side when first named, the in-memory transport for the
# first /memory address; ipaddress with QUIC or a dashboard (lattica._iptext does the rest);
# libsodium at the first signature checked (a handshake's, a record's).
LATER = [
    "structlog",
    "pykka",
    "ifaddr",
    "lattica._host.mdns",
    "aioquic",
    "hashlib",
    "_hashlib",
    "shutil",
    "lattica.actors.nat.relay",
    "lattica.supervisor",
    "lattica.shards._client",
    "lattica.shards._select",
    "lattica.transports.memory",
    "ipaddress",
    "nacl",
    "nacl._sodium",
]

_CHILD = r"""
import sys
before = set(sys.modules)  # (what the interpreter's start loaded: an editable install's finder loads pathlib and ipaddress)
import json
import lattica
node = lattica.Node(["/ip4/127.0.0.1/tcp/0"])
node.start()
loaded = [m for m in json.loads(sys.argv[1]) if m in sys.modules and m not in before]
node.stop()
print(json.dumps(loaded))
"""


def _loaded_after_start(modules: list[str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(modules)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_starting_node_does_not_load_what_it_needs_later():
    assert _loaded_after_start(LATER) == []


def test_the_check_sees_what_is_loaded():
    # the probe itself works: modules a node always needs are reported
    assert _loaded_after_start(["asyncio", "lattica._host", "cryptography"]) == [
        "asyncio",
        "lattica._host",
        "cryptography",
    ]


def test_sync_actors_and_configured_logs_load_on_demand():
    child = r"""
import sys, lattica, lattica.logging

@lattica.actor
class Sync:
    def f(self):
        return 1

lattica.init(listen=["/ip4/127.0.0.1/tcp/0"])
assert "pykka" not in sys.modules and "structlog" not in sys.modules
assert Sync.remote().f.remote().result(10) == 1
assert "pykka" in sys.modules
lattica.logging.configure("WARNING")
assert "structlog" in sys.modules
lattica.shutdown()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_what_loads_late_still_works_on_a_node_that_never_loaded_it():
    # a supervisor's child spec carries an actor class (a codec extension): a node that has not
    # imported lattica.supervisor must still decode it; the lazy names resolve on first use
    import lattica
    from lattica import codec

    frame = codec.encode_bytes([lattica.Supervisor]).hex()
    child = r"""
import sys, lattica
from lattica import codec
node = lattica.Node(["/ip4/127.0.0.1/tcp/0"])
node.start()
assert codec.decode(bytes.fromhex(sys.argv[1])) == ["lattica.supervisor.Supervisor"]
assert "lattica.supervisor" not in sys.modules
assert lattica.Supervisor.cls.__name__ == "Supervisor" and "lattica.supervisor" in sys.modules
assert lattica.shards.Stub.__module__ == "lattica.shards._client" and callable(lattica.shards.stub)
assert "lattica.transports.memory" not in sys.modules
with lattica.Node(["/memory/0"]) as a:  # (memory nodes talk only on one loop: listening is the check)
    assert "lattica.transports.memory" in sys.modules and str(a.addrs[0]).startswith("/memory/")
node.stop()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", child, frame], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_libsodium_loads_with_the_first_signature_checked():
    child = r"""
import sys, lattica
a = lattica.Node(["/ip4/127.0.0.1/tcp/0"]); a.start()
b = lattica.Node(["/ip4/127.0.0.1/tcp/0"]); b.start()
assert "nacl._sodium" not in sys.modules
b.connect(a.addrs[0])  # (the handshake checks the peer's signature over its Noise key)
assert "nacl._sodium" in sys.modules
b.stop(); a.stop()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
