"""Attack 2a/5: a member replays an administrator's ticket whose package is no longer anywhere (the
driver exited) in ~1000 concurrent spawns: each waits on the shared fetch (find_timeout 20 s) and
holds one of the spawner's 1000 concurrency slots. Does the spawner (lookup, spawn, kill for
everyone) wedge?"""
import os, tempfile, time, asyncio
from harness import *

tmp = tempfile.mkdtemp(prefix="rv-a2-")
os.environ["HOME"] = tmp
key, keyfile = mesh(tmp)
T = Target(keyfile, "admins")
gone_admin = node(keyfile)
cid = put(gone_admin, CodePackage({"x.py": b"import lattica\n@lattica.actor\nclass X:\n    pass\n"}).encode())
tk = ticket(gone_admin, cid).to_wire()
gone_admin.stop()  # the driver exited: its package is nowhere now
M = member(key)
A = node(keyfile)  # an honest administrator, wanting the spawner
S = node(MeshKey.generate())
for n in (M, A, S):
    n.connect(T.addr)
time.sleep(1)

N = int(os.environ.get("N", "1024"))
async def flood():
    rt = M._host.runtime
    ref = spawner_ref(T.peer)
    async def one(i):
        try:
            await rt.call(ref, "spawn", ("x.X", [], None, f"w{i}", {"code": tk}), {}, timeout=300)
            return "ok"
        except Exception as e:
            return type(e).__name__
    return await asyncio.gather(*[one(i) for i in range(N)])

fut = asyncio.run_coroutine_threadsafe(flood(), M._loop)
time.sleep(3)
print("target stat after 3 s:", {k: v for k, v in T.stat().items() if k in ("loading", "fetches", "rss_mb", "threads")})
for probe in range(4):
    try_(f"admin lookup spawner (probe {probe})", lambda: call(A, spawner_ref(T.peer), "names", timeout=10))
    try_(f"stranger public lookup (probe {probe})", lambda: call(S, spawner_ref(T.peer), "lookup", "nope", timeout=10))
    time.sleep(5)
res = fut.result(timeout=400)
from collections import Counter
print("flood results:", Counter(res))
try_("admin lookup after the wave", lambda: call(A, spawner_ref(T.peer), "names", timeout=10))
print("target alive:", T.alive())
T.close()
for n in (M, A, S):
    n.stop()
