"""``lattica get`` and ``lattica put`` as a user types them, with a Lattica SDK node (issue 49):
``lattica get <cid> --bootstrap <SDK node>`` fetches what the SDK's ``put_block`` stored, over
Bitswap, and names the provider's kind; the SDK's ``get_block`` fetches what ``lattica put``
serves. Real processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys

import pytest

from lattica.bench._peers.sdk_node import SdkNode

pytestmark = pytest.mark.timeout(120)


def _cli(tmp_path, *args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, HOME=str(tmp_path / "home"), LATTICA_BLOCKS=str(tmp_path / f"blocks{len(args)}"))
    return subprocess.Popen(
        [sys.executable, "-m", "lattica.cli", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw
    )


def test_lattica_get_from_the_sdk(sdk_python, tmp_path):
    data = os.urandom(700_000)

    async def run() -> str:
        async with await SdkNode.start(sdk_python) as sdk:
            cid = await sdk.put_block(data)
            out = tmp_path / "out.bin"
            proc = _cli(tmp_path, "get", cid, "--bootstrap", sdk.addr(), "-o", str(out))
            _, err = await asyncio.to_thread(proc.communicate, timeout=60)
            assert proc.returncode == 0, err.decode()
            assert out.read_bytes() == data
            return err.decode()

    err = asyncio.run(run())
    assert "from 1 peer (1 libp2p (" in err, err  # the final line names the SDK's implementation


def test_the_sdk_gets_what_lattica_put_serves(sdk_python, tmp_path):
    data = os.urandom(400_000)
    path = tmp_path / "file.bin"
    path.write_bytes(data)
    proc = _cli(tmp_path, "put", str(path), "--listen", "/ip4/127.0.0.1/tcp/0", "-q")
    try:
        assert proc.stdout is not None and proc.stderr is not None
        cid = proc.stdout.readline().decode().strip()
        serving = proc.stderr.readline().decode()
        addr = re.search(r"from (\S+?)[,\s]", serving + " ")
        assert cid and addr, serving

        async def run() -> bytes:
            async with await SdkNode.start(sdk_python, [addr.group(1)]) as sdk:
                return await sdk.get_block(cid, timeout=20)

        assert asyncio.run(run()) == data
    finally:
        proc.send_signal(signal.SIGINT)  # (Ctrl-C: it stops serving)
        proc.wait(timeout=20)
