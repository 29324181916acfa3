"""Shared setup for the review's attack scripts: a mesh key, target processes, attacker nodes."""
import json, os, subprocess, sys, tempfile, time, asyncio
sys.path.insert(0, "/work/main/tests/support")
import lattica
from lattica.trust import MeshKey
from lattica.runtime import spawner_ref
from lattica.code.tickets import Ticket
from lattica.code.package import CodePackage, pack
from lattica.content.cid import Cid

HERE = os.path.dirname(os.path.abspath(__file__))
TCP = "/ip4/127.0.0.1/tcp/0"

class Target:
    def __init__(self, mesh_file, accept="admins", find_timeout=None, home=None):
        env = dict(os.environ, HOME=home or tempfile.mkdtemp(prefix="rv-home-"))
        args = [sys.executable, os.path.join(HERE, "target.py"), mesh_file, accept] + ([str(find_timeout)] if find_timeout else [])
        self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(os.path.join(HERE, "target.stderr.log"), "a"), text=True, env=env)
        self.addr = self._expect("ADDR")
        self.peer = lattica.PeerId.from_string(self._expect("PEER"))
    def _expect(self, tag):
        for line in self.p.stdout:
            if line.startswith(tag + " "):
                return line.split(" ", 1)[1].strip()
        raise RuntimeError(f"target exited rc={self.p.wait()}")
    def stat(self):
        self.p.stdin.write("stat\n"); self.p.stdin.flush()
        return json.loads(self._expect("OUT"))
    def eval(self, expr):
        self.p.stdin.write("eval " + expr + "\n"); self.p.stdin.flush()
        return self._expect("OUT")
    def alive(self):
        return self.p.poll() is None
    def close(self):
        if self.alive():
            try:
                self.p.stdin.write("quit\n"); self.p.stdin.flush(); self.p.wait(15)
            except Exception:
                self.p.kill()

def mesh(tmp):
    key = MeshKey.generate()
    path = os.path.join(tmp, "mesh.key")
    key.save(path)
    return key, path

def own_content():
    from lattica.config import ContentConfig
    return ContentConfig(blocks=tempfile.mkdtemp(prefix="rv-blocks-"))

def node(mesh_, **kw):
    kw.setdefault("content", own_content())
    return lattica.Node([TCP], mesh=mesh_, mdns=False, **kw).start()

def member(key, admin=False, **kw):
    kp = lattica.KeyPair.generate()
    cert = key.issue(kp.peer_id, 3600, admin=admin)
    return node(cert.to_text(), keypair=kp, **kw)

def call(node, ref, method, *args, timeout=20):
    async def go():
        return await node._host.runtime.call(ref, method, args, {}, timeout=timeout)
    return node.run(go(), timeout=timeout + 5)

def spawn(node, target_peer, path, code, name=None, timeout=20, **opts):
    o = dict(opts)
    if code is not None:
        o["code"] = code
    return call(node, spawner_ref(target_peer), "spawn", path, [], None, name, o, timeout=timeout)

def put(node, data: bytes) -> str:
    return str(node.host.services["content"].put_now(data))

def ticket(node, cid):
    return Ticket.issue(cid, node.keypair, node.trust.presented)

def try_(label, f):
    t = time.time()
    try:
        r = f()
        print(f"[{label}] OK -> {r!r}"[:400], f"({time.time()-t:.1f}s)", flush=True)
        return r
    except Exception as e:
        print(f"[{label}] {type(e).__name__}: {str(e)[:300]}", f"({time.time()-t:.1f}s)", flush=True)
        return e
