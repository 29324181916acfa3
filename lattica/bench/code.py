"""``lattica bench code``: what it costs when a driver's classes travel to the nodes that run them.

``nodes`` plain ``lattica node`` processes (fresh blockstores) and a driver node in this process
whose code package is a generated folder of ``size`` bytes of Python source: one module with an
actor class, the rest filler modules. Per size:

- ``pack_ms``: the driver packs, hashes and stores the package (once per process);
- ``first_spawn_ms``: a spawn and its first call on a node that has never seen the package (it
  fetches, verifies and loads it);
- ``fleet_ms`` / ``uploaded_bytes``: the other ``nodes - 1`` nodes spawn at once, and the bytes
  the driver served to all of them (they fetch from each other too);
- ``cached_ms``: spawn + first call on a node that has the package loaded, beside
  ``installed_ms``: the same for an identical class installed on that node and allowed there
  (what a spawn cost before code travelled); medians of ``spawns``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import lattica
from lattica.bench import host_of
from lattica.mesh.process import cli_node
from lattica.trust import MeshKey

_CLASS = """import lattica


@lattica.actor
class Echo:
    def echo(self, x):
        return x
"""


def bench_code(
    sizes: tuple[int, ...] = (100_000, 10_000_000), nodes: int = 8, spawns: int = 20
) -> list[dict[str, Any]]:
    """One row per package size (see the module docstring)."""
    tmp = tempfile.mkdtemp(prefix="lattica-bench-code-")
    try:
        key = os.path.join(tmp, "mesh.key")
        MeshKey.generate().save(key)
        installed = os.path.join(tmp, "installed")
        os.makedirs(installed)
        with open(os.path.join(installed, "benchinstalled.py"), "w") as f:
            f.write(_CLASS)
        env = dict(
            os.environ,
            HOME=os.path.join(tmp, "home"),
            LATTICA_MESH=key,
            PYTHONPATH=os.pathsep.join(p for p in (installed, os.environ.get("PYTHONPATH")) if p),
        )
        procs, addrs = _start_nodes(nodes, env, tmp)
        try:
            return [_one_size(size, key, addrs, installed, tmp, spawns) for size in sizes]
        finally:
            for p in procs:
                p.send_signal(signal.SIGINT)
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _start_nodes(n: int, env: dict[str, str], tmp: str) -> tuple[list[subprocess.Popen], list[str]]:
    procs: list[subprocess.Popen] = []
    addrs: list[str] = []
    for i in range(n):
        cwd = os.path.join(tmp, f"node{i}")
        os.makedirs(cwd)
        proc, addr = cli_node(
            "--allow", "benchinstalled.*", *(["--connect", addrs[0]] if addrs else []), cwd=cwd, env=env
        )
        procs.append(proc)
        addrs.append(addr)
    return procs, addrs


def _package(size: int, tmp: str) -> tuple[str, str]:
    """A folder of ``size`` bytes of source: ``benchapp_<size>.py`` and filler modules."""
    name = f"benchapp_{size}"
    folder = os.path.join(tmp, name)
    os.makedirs(folder)
    with open(os.path.join(folder, f"{name}.py"), "w") as f:
        f.write(_CLASS)
    left, i = size - len(_CLASS), 0
    line = "# " + "lattica code that travels " * 3 + "\n"
    while left > 0:
        chunk = min(left, 50_000)
        with open(os.path.join(folder, f"filler_{i:04d}.py"), "w") as f:
            f.write(f"VALUE_{i} = {i}\n" + line * max(0, (chunk - 20) // len(line)))
        left -= chunk
        i += 1
    return folder, name


def _one_size(size: int, key: str, addrs: list[str], installed: str, tmp: str, spawns: int) -> dict[str, Any]:
    folder, module = _package(size, tmp)
    sys.path[:0] = [folder, installed]
    try:
        app = __import__(module).Echo
        plain = __import__("benchinstalled").Echo
        peers = [a.rsplit("/p2p/", 1)[1] for a in addrs]
        with lattica.Node(["/ip4/127.0.0.1/tcp/0"], mesh=key, code=[folder], mdns=False) as driver:
            for a in addrs:
                driver.connect(a)
            host = host_of(driver)
            code, content = host.services.code, host.services.content
            assert code is not None and content is not None  # (the driver runs the content plane)
            shipper = code.shipper
            t0 = time.perf_counter()
            shipper.ticket_now(app.cls)
            pack_ms = (time.perf_counter() - t0) * 1e3

            async def spawn_call(cls: Any, peer: str) -> Any:
                ref = cls.options(node=peer).remote()
                await ref.echo.remote(1)
                return ref

            served = content.served_bytes
            t0 = time.perf_counter()
            keep = driver.run(spawn_call(app, peers[0]), timeout=120)
            first_ms = (time.perf_counter() - t0) * 1e3

            async def fleet() -> list[Any]:
                return list(await asyncio.gather(*(spawn_call(app, p) for p in peers[1:])))

            t0 = time.perf_counter()
            driver.run(fleet(), timeout=300)
            fleet_ms = (time.perf_counter() - t0) * 1e3
            uploaded = content.served_bytes - served  # to every node (they also fetch from each other)

            def median_spawn(cls: Any) -> float:
                times = []
                for _ in range(spawns):
                    t = time.perf_counter()
                    ref = driver.run(spawn_call(cls, peers[0]), timeout=60)
                    times.append((time.perf_counter() - t) * 1e3)
                    driver.run(lattica.akill(ref), timeout=30)
                return statistics.median(times)

            installed_ms = median_spawn(plain)
            cached_ms = median_spawn(app)
            installed_again_ms = median_spawn(plain)
            del keep
        return {
            "bench": "code",
            "package_bytes": size,
            "nodes": len(addrs),
            "pack_ms": round(pack_ms, 1),
            "first_spawn_ms": round(first_ms, 1),
            "fleet_ms": round(fleet_ms, 1),
            "uploaded_bytes": uploaded,
            "uploaded_packages": round(uploaded / size, 2),
            "cached_ms": round(cached_ms, 2),
            "installed_ms": round(statistics.median([installed_ms, installed_again_ms]), 2),
            "cached_over_installed": round(cached_ms / statistics.median([installed_ms, installed_again_ms]), 3),
        }
    finally:
        for p in (folder, installed):
            while p in sys.path:
                sys.path.remove(p)
