"""Attack 1: get code to run on a target (real process, accept_code='admins') as a stranger, as a
non-admin member, by forging / replaying / re-labelling tickets."""
import os, sys, tempfile, textwrap, time
from harness import *
from lattica.trust import Certificate

tmp = tempfile.mkdtemp(prefix="rv-a1-")
os.environ["HOME"] = tmp
key, keyfile = mesh(tmp)
marker = os.path.join(tmp, "sibling-ran")
app = os.path.join(tmp, "app"); os.mkdir(app)
open(os.path.join(app, "app_echo.py"), "w").write(textwrap.dedent('''
    import lattica
    @lattica.actor
    class Echo:
        def echo(self, x):
            return ("echo", x)
        def pid(self):
            import os; return os.getpid()
'''))
# another script in the driver's folder: never meant to run on other nodes (packing ships the whole folder)
open(os.path.join(app, "reset_everything.py"), "w").write(textwrap.dedent(f'''
    import os
    open({marker!r}, "w").write(str(os.getpid()))
    os.environ["REVIEW_X"] = "set-by-sibling-module"
'''))
T = Target(keyfile, "admins")
admin = lattica.Node([TCP], mesh=keyfile, mdns=False).start()   # key holder: an administrator
M = member(key)                                                   # invited, not an administrator
S = lattica.Node([TCP], mesh=MeshKey.generate(), mdns=False).start()  # a stranger
for n in (admin, M, S):
    n.connect(T.addr)
admin.connect(M.addrs[0])
time.sleep(1)

pkg = pack([app]).encode()
cid = put(admin, pkg)
adm_ticket = ticket(admin, cid)
print("package files:", sorted(pack([app]).files), "cid", cid)

# -- the admin places an actor on the member's node: the member's node now holds the admin's ticket
r = try_("admin spawns Echo on member's node", lambda: spawn(admin, M.peer_id, "app_echo.Echo", adm_ticket.to_wire(), name="on-member"))
lib = M.host.services["code"].library
stolen = next(iter(lib.loaded.values())).ticket if lib.loaded else adm_ticket
print("member obtained the admin's ticket from its own library:", stolen == adm_ticket)

# -- baseline refusals
mpkg = pack([app]).encode()
mcid = put(M, mpkg)
try_("member's own ticket", lambda: spawn(M, T.peer, "app_echo.Echo", ticket(M, mcid).to_wire(), name="m-own"))
try_("stranger's own ticket", lambda: spawn(S, T.peer, "app_echo.Echo", ticket(S, put(S, mpkg)).to_wire(), name="s-own"))
try_("stranger replays admin ticket", lambda: spawn(S, T.peer, "app_echo.Echo", stolen.to_wire(), name="s-replay"))

# -- re-labelling / forging
evil = os.path.join(tmp, "evil"); os.mkdir(evil)
open(os.path.join(evil, "app_echo.py"), "w").write("import os\nopen(%r + '-evil','w').write('x')\nimport lattica\n@lattica.actor\nclass Echo:\n    pass\n" % marker)
ecid = put(M, pack([evil]).encode())
w = stolen.to_wire()
try_("admin signature, other CID", lambda: spawn(M, T.peer, "app_echo.Echo", [ecid, w[1], w[2], w[3]], name="relabel"))
try_("member signs, presents admin's certs", lambda: spawn(M, T.peer, "app_echo.Echo", [ecid, M.peer_id.to_bytes(), M.keypair.sign(Ticket.signed_part(ecid)), w[3]], name="certswap"))
other = MeshKey.generate()
selfadmin = other.issue(M.peer_id, 3600, admin=True).to_bytes()
try_("member signs, self-made admin cert of another mesh", lambda: spawn(M, T.peer, "app_echo.Echo", [ecid, M.peer_id.to_bytes(), M.keypair.sign(Ticket.signed_part(ecid)), [selfadmin] + list(M.trust.presented)], name="othermesh"))
mc = Certificate.from_bytes(M.trust.presented[0])
flipped = Certificate(mc.mesh, mc.peer, mc.expires, mc.signature, True).to_bytes()
try_("member cert with admin flag flipped", lambda: spawn(M, T.peer, "app_echo.Echo", [ecid, M.peer_id.to_bytes(), M.keypair.sign(Ticket.signed_part(ecid)), [flipped]], name="flip"))
print("evil marker exists:", os.path.exists(marker + "-evil"))

# -- replay of the admin's ticket by the member
ref = try_("member replays admin ticket (same class)", lambda: spawn(M, T.peer, "app_echo.Echo", stolen.to_wire(), name="m-replay"))
if not isinstance(ref, Exception):
    try_("  call it: runs in target pid", lambda: call(M, ref, "pid"))
    print("  target says owner of m-replay:", T.eval("node.host.services['spawner'].owners.get('m-replay')"), "sender_of:", T.eval("lib().sender_of('m-replay')"), "member:", M.peer_id)
try_("member replays admin ticket, class path = another module of the package", lambda: spawn(M, T.peer, "reset_everything.Nothing", stolen.to_wire(), name="m-sibling"))
print("sibling module's top level ran on the target:", os.path.exists(marker), "pid", open(marker).read() if os.path.exists(marker) else None, "target pid", T.p.pid)
print("target env REVIEW_X:", T.stat()["env_X"])
# -- get_if_exists: a member takes another's named actor? (same as lookup for members)
aref = try_("admin spawns a named actor on target", lambda: spawn(admin, T.peer, "app_echo.Echo", adm_ticket.to_wire(), name="admins-actor"))
try_("member get_if_exists admins-actor (no ticket, bogus class)", lambda: spawn(M, T.peer, "no.such.Class", None, name="admins-actor", get_if_exists=True))
try_("member lookup admins-actor", lambda: call(M, spawner_ref(T.peer), "lookup", "admins-actor"))
try_("member kill admins-actor", lambda: call(M, spawner_ref(T.peer), "kill", "admins-actor"))
print("target alive:", T.alive(), T.stat())
T.close()
for n in (admin, M, S):
    n.stop()
