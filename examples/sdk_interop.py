"""A Lattica SDK node and a Lattica actor calling each other (docs/sdk.md).

    python examples/sdk_interop.py [--sdk-python PATH]

The GradientHQ Lattica SDK (rust-libp2p; ``pip install lattica==1.0.21`` in a venv of its own,
since its package is also named ``lattica``; ``make interop-peers`` puts one in ``.interop/sdk``)
runs in a child process with that venv's interpreter. It joins our node, serves ``Echo.echo``
and calls ``Translator.upper``, which our node serves from an actor. The actor, in turn, calls
the SDK node's ``Echo.echo``. Payloads are bytes both ways (what an SDK method typed with a
protobuf class receives); nothing is pickled.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import lattica

ROOT = pathlib.Path(__file__).resolve().parents[1]

# what the SDK's interpreter runs: an SDK node that serves Echo and calls our Translator
SDK_SIDE = r"""
import json, os, sys
import lattica  # (the SDK's package, in its own venv)

# the SDK logs to file descriptor 1: our JSON lines go to a copy of it, its logs to stderr
out = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)

class Raw:
    # bytes as they are: the SDK hands a class with these two methods the raw payload
    def __init__(self, data=b""): self.data = data
    def SerializeToString(self): return self.data
    def ParseFromString(self, data): self.data = bytes(data)

class Echo(lattica.ConnectionHandler):
    @lattica.rpc_method
    def echo(self, request: Raw) -> Raw:
        return Raw(b"echo: " + request.data)

ours = sys.argv[1]
node = (lattica.Lattica.builder().with_listen_addrs(["/ip4/127.0.0.1/tcp/0"]).with_bootstraps([ours])
        .with_mdns(False).with_upnp(False).with_autonat(False).build())
Echo(node)
print(json.dumps({"peer_id": node.peer_id()}), file=out)
sys.stdin.readline()  # (our side says when it is serving)
peer = ours.rsplit("/p2p/", 1)[1]
answer = node.get_client(peer).call("Translator.upper", b"hello from the SDK").result(30)
print(json.dumps({"answer": bytes(answer).decode()}), file=out)
sys.stdin.readline()
node.close()
"""


@lattica.actor
class Translator:
    """A Lattica actor: SDK nodes call ``upper``; ``ask`` calls an SDK node's ``Echo.echo``."""

    def upper(self, data: bytes) -> bytes:
        return data.upper()

    async def ask(self, sdk_peer: str) -> bytes:
        echo = lattica.sdk.stub(sdk_peer, "Echo")
        return await echo.echo.remote(b"hello from a Lattica actor")


def _sdk_python(given: str | None) -> str:
    path = given or os.environ.get("LATTICA_SDK_PYTHON") or str(ROOT / ".interop" / "sdk" / "bin" / "python")
    if not os.path.exists(path):
        sys.exit(
            f"the Lattica SDK's interpreter is not at {path}: run `make interop-peers`, or make a venv with "
            "`pip install lattica==1.0.21` and pass --sdk-python PATH"
        )
    return path


def _line(sdk: subprocess.Popen) -> dict:
    """The SDK side's next JSON line (SystemExit if it ended: its error is on stderr above)."""
    assert sdk.stdout is not None
    line = sdk.stdout.readline()
    if not line:
        sys.exit("the SDK node ended early (its error is above)")
    return json.loads(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdk-python", help="the SDK venv's python (default: .interop/sdk/bin/python)")
    args = parser.parse_args()

    node = lattica.init()
    translator = Translator.remote()
    lattica.sdk.serve(translator, "Translator")  # SDK nodes call "Translator.upper"
    sdk = subprocess.Popen(
        # -I: the SDK's own `lattica`, not this checkout's (which the current folder would give)
        [_sdk_python(args.sdk_python), "-I", "-c", SDK_SIDE, str(node.addrs[0])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sdk.stdin is not None and sdk.stdout is not None
    try:
        sdk_peer = _line(sdk)["peer_id"]
        deadline = time.monotonic() + 15
        while sdk_peer not in [str(p.peer_id) for p in node.peers()]:  # (it dials us: its bootstrap)
            if time.monotonic() > deadline:
                sys.exit("the SDK node never connected")
            time.sleep(0.05)
        sdk.stdin.write("serving\n")
        sdk.stdin.flush()
        print("the SDK node got:  ", _line(sdk)["answer"])
        print("the actor got:     ", translator.ask.remote(sdk_peer).result(timeout=30).decode())
    finally:
        sdk.stdin.close()
        sdk.wait(10)
        lattica.shutdown()


if __name__ == "__main__":
    main()
