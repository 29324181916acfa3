"""A target node in a process of its own (127.0.0.1), with a local stdin console for the reviewer
to look inside it: `stat` prints JSON; `eval <expr>` prints repr. Args: mesh_key_file accept_code [find_timeout]"""
import json, sys, os, resource, threading
import lattica
from lattica.config import ContentConfig

mesh, accept = sys.argv[1], sys.argv[2]
content = ContentConfig(find_timeout=float(sys.argv[3]), block_timeout=float(sys.argv[3])) if len(sys.argv) > 3 else True
node = lattica.Node(["/ip4/127.0.0.1/tcp/0"], mesh=mesh, accept_code=accept, content=content, mdns=False).start()
print("ADDR", node.addrs[0], flush=True)
print("PEER", node.peer_id, flush=True)
lib = lambda: node.host.services["code"].library

def rss():
    with open("/proc/self/status") as f:
        for l in f:
            if l.startswith("VmRSS"):
                return int(l.split()[1]) // 1024

def stat():
    L = lib()
    return {"meta_path": [type(f).__name__ for f in sys.meta_path], "code_modules": sorted(m for m in sys.modules if m.startswith("_lattica_code_")),
            "n_modules": len(sys.modules), "rss_mb": rss(), "loaded": list(L.loaded), "loading": list(L._loading),
            "actors": sorted(n for n, a in node._host.runtime.actors.items() if not a.system), "threads": threading.active_count(),
            "fetches": len(node.host.services["content"]._fetches), "json_mod": sys.modules["json"].__file__, "os_mod": sys.modules["os"].__file__,
            "env_X": os.environ.get("REVIEW_X"), "LOADED": list(__import__("lattica.code.tickets", fromlist=["x"]).LOADED)}

for line in sys.stdin:
    line = line.strip()
    try:
        if line == "stat":
            print("OUT", json.dumps(stat()), flush=True)
        elif line.startswith("eval "):
            print("OUT", repr(eval(line[5:])), flush=True)
        elif line == "quit":
            break
    except Exception as e:
        print("OUT", "ERR", repr(e), flush=True)
node.stop()
