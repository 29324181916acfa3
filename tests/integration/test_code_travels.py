"""A user's script as written, against plain ``lattica node`` processes: its own classes travel
with their spawns, its actors end with it (normal exit, Ctrl-C, SIGKILL, mid-spawn), a named
actor's script runs twice, detached actors stay, and whose code a node runs is its setting."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import lattica
from helpers import call_as, wait_for
from lattica._runtime import spawner_ref
from lattica.mesh.process import cli_node
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(120)

NODE = "import sys; from lattica.cli import main; main(sys.argv[1:])"

SCRIPT = """\
import sys
import lattica

HIDDEN = 4

def helper(x):
    return x * HIDDEN

@lattica.actor
class Shard:
    def __init__(self, seed):
        self.seed = seed
    def forward(self, x):
        return helper(x) + self.seed
    async def generate(self, n):
        for i in range(n):
            yield i

lattica.init(bootstrap=[sys.argv[1]])
peer = sys.argv[1].rsplit("/p2p/", 1)[1]
s = Shard.options(node=peer, name="shard-0").remote(seed=1)
print(lattica.get(s.forward.remote(3)), list(s.generate.stream(5)), flush=True)
if len(sys.argv) > 2:
    print("serving", flush=True)
    import time
    time.sleep(600)
"""


class Mesh:
    """Plain ``lattica node`` processes sharing a mesh key (their HOME is the test's), and the
    test's own node in the same mesh to look at them."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.key = tmp_path / "mesh.key"
        MeshKey.generate().save(str(self.key))
        self.env = dict(os.environ, HOME=str(tmp_path / "home"), LATTICA_MESH=str(self.key))
        self.procs = []
        self.addrs = []
        self.me = lattica.Node(["/ip4/127.0.0.1/tcp/0"], mesh=str(self.key)).start()

    def node(self, *flags, mesh=None):
        cwd = self.tmp / f"node{len(self.procs)}"
        cwd.mkdir()
        env = dict(self.env, LATTICA_MESH=str(mesh or self.key))
        proc, addr = cli_node(*flags, cwd=cwd, env=env)
        self.procs.append(proc)
        self.addrs.append(addr)
        self.me.connect(addr)
        return addr

    def names(self, addr, timeout=10.0):
        peer = addr.rsplit("/p2p/", 1)[1]
        names = call_as(self.me, spawner_ref(lattica.PeerId.from_string(peer)), "names", timeout=timeout)
        return [n for n in names if n != "spawner" and not n.startswith("crdt/") and n not in SYSTEM]

    def script(self, text, name="train.py", folder="job"):
        d = self.tmp / folder
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(textwrap.dedent(text))
        return d / name

    def run(self, path, *args, timeout=60, env=None):
        return subprocess.run(
            [sys.executable, str(path), *args],
            cwd=path.parent,
            env=dict(self.env, **(env or {})),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, path, *args):
        proc = subprocess.Popen(
            [sys.executable, str(path), *args],
            cwd=path.parent,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.me.stop()


SYSTEM = {"checkpoints", "dht", "autonat", "holepunch", "membership", "shards", "content", "pubsub", "dashboard"}


@pytest.fixture
def mesh(tmp_path):
    m = Mesh(tmp_path)
    try:
        yield m
    finally:
        m.close()


def wait_line(proc, want, timeout=30):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if want in line:
            return seen
    raise AssertionError(
        f"no {want!r} from the script; it printed {seen!r}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
    )


def test_a_scripts_own_class_runs_on_a_plain_node_and_the_script_runs_twice(mesh):
    addr = mesh.node()
    script = mesh.script(SCRIPT)
    for _ in range(2):  # the second run's named actor finds its name free: the first ended with its job
        out = mesh.run(script, addr)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "13 [0, 1, 2, 3, 4]"
        wait_for(lambda: mesh.names(addr) == [], timeout=10)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "sigkill", "frozen"])
def test_a_scripts_actors_end_when_it_is_interrupted_killed_or_frozen(mesh, how):
    addr = mesh.node()
    driver = mesh.start(mesh.script(SCRIPT), addr, "serve")
    wait_line(driver, "serving")
    assert mesh.names(addr) == ["shard-0"]
    driver.send_signal(
        {"ctrl-c": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL, "frozen": signal.SIGSTOP}[how]
    )
    # SIGKILL, SIGSTOP: the membership detector's verdict (a reset connection at once; silence ~2.5 s)
    wait_for(lambda: mesh.names(addr) == [], timeout=15)
    if how == "frozen":
        driver.kill()
    driver.wait(20)


def test_a_scripts_supervisor_takes_its_children_with_it(mesh):
    addr, other = mesh.node(), mesh.node()
    driver = mesh.start(
        mesh.script("""\
        import sys
        import lattica

        @lattica.actor
        class Worker:
            def ping(self):
                return "pong"

        lattica.init(bootstrap=[sys.argv[1]])
        nodes = [a.rsplit("/p2p/", 1)[1] for a in sys.argv[1:3]]
        sup = lattica.Supervisor.options(node=nodes[0]).remote(children=[{"cls": Worker, "id": f"w{i}", "node": nodes[i % 2]} for i in range(4)])
        print(lattica.get([c.ping.remote() for c in lattica.get(sup.children.remote())]), flush=True)
        print("serving", flush=True)
        import time
        time.sleep(600)
    """),
        addr,
        other,
    )
    wait_line(driver, "serving")
    assert len(mesh.names(addr)) == 3 and len(mesh.names(other)) == 2  # the supervisor and its children
    driver.send_signal(signal.SIGINT)
    driver.wait(20)
    wait_for(lambda: mesh.names(addr) == [] and mesh.names(other) == [], timeout=15)


def test_a_driver_killed_mid_spawn_leaves_no_orphan(mesh):
    addr = mesh.node()
    driver = mesh.start(
        mesh.script("""\
        import sys, time
        import lattica

        @lattica.actor
        class Slow:
            def __init__(self):
                time.sleep(3)
            def ping(self):
                return 1

        lattica.init(bootstrap=[sys.argv[1]])
        ref = Slow.options(node=sys.argv[1].rsplit("/p2p/", 1)[1], name="slow").remote()
        print("spawning", flush=True)
        lattica.get(ref.ping.remote())
    """),
        addr,
    )
    wait_line(driver, "spawning")
    wait_for(lambda: mesh.names(addr) == ["slow"], timeout=10)  # its constructor runs
    driver.kill()
    driver.wait(10)
    time.sleep(3.5)  # the constructor finishes after its job was declared dead
    wait_for(lambda: mesh.names(addr) == [], timeout=10)


def test_detached_actors_stay_and_get_if_exists_returns_the_live_one(mesh):
    addr = mesh.node()
    script = mesh.script("""\
        import sys
        import lattica

        @lattica.actor
        class Counter:
            def __init__(self):
                self.n = 0
            def bump(self):
                self.n += 1
                return self.n

        lattica.init(bootstrap=[sys.argv[1]])
        peer = sys.argv[1].rsplit("/p2p/", 1)[1]
        c = Counter.options(node=peer, name="counter", lifetime="detached", get_if_exists=True).remote()
        print(lattica.get(c.bump.remote()), flush=True)
    """)
    for want in ("1", "2"):
        out = mesh.run(script, addr)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == want
    assert mesh.names(addr) == ["counter"]


def test_two_drivers_with_the_same_module_names_at_once(mesh):
    addr = mesh.node()
    drivers = []
    for version in (1, 2):
        folder = f"app{version}"
        mesh.script(f"VERSION = {version}\n", "__init__.py", f"{folder}/myapp")
        mesh.script(
            """\
            import lattica
            from myapp import VERSION

            @lattica.actor
            class Which:
                def version(self):
                    return VERSION
        """,
            "shard.py",
            f"{folder}/myapp",
        )
        script = mesh.script(
            """\
            import sys, time
            import lattica
            from myapp.shard import Which

            lattica.init(bootstrap=[sys.argv[1]])
            w = Which.options(node=sys.argv[1].rsplit("/p2p/", 1)[1]).remote()
            for _ in range(20):
                print(lattica.get(w.version.remote()), flush=True)
                time.sleep(0.05)
        """,
            "train.py",
            folder,
        )
        drivers.append(mesh.start(script, addr))
    for version, driver in zip((1, 2), drivers):
        out, err = driver.communicate(timeout=60)
        assert driver.returncode == 0, err
        assert set(out.split()) == {str(version)}


def test_errors_name_what_went_wrong(mesh):
    addr = mesh.node()
    script = mesh.script("""\
        import sys
        import lattica

        handle = open(__file__)

        @lattica.actor
        class Reader:
            def first(self):
                return handle.readline()

        lattica.init(bootstrap=[sys.argv[1]])
        r = Reader.options(node=sys.argv[1].rsplit("/p2p/", 1)[1]).remote()
        lattica.get(r.first.remote())
    """)
    out = mesh.run(script, addr)
    assert out.returncode == 1
    assert (
        "lattica.errors.CodeError: train.py line 4 (handle = open(__file__)) is left out on other nodes, and Reader uses 'handle'"
        in out.stderr
    )
    mesh.script("import lattica\n\nX = 1 / 0\n\n@lattica.actor\nclass Broken:\n    pass\n", "broken.py", "job2")
    script = mesh.script(
        """\
        import sys
        import lattica
        from broken import Broken

        lattica.init(bootstrap=[sys.argv[1]])
        b = Broken.options(node=sys.argv[1].rsplit("/p2p/", 1)[1]).remote()
        lattica.get(b.__ray_ready__.remote() if False else lattica.kill(b))
    """,
        "train.py",
        "job2",
    )
    out = mesh.run(script, addr)
    assert out.returncode == 1
    assert "ZeroDivisionError" in out.stderr and 'broken.py", line 3' in out.stderr, out.stderr


def test_whose_code_a_node_runs_is_its_setting(mesh, tmp_path):
    member_cert = tmp_path / "member.cert"
    driver_key = tmp_path / "driver.key"
    peer = lattica.KeyPair.load_or_create(str(driver_key)).peer_id
    member_cert.write_text(MeshKey.load_or_create(str(mesh.key)).issue(peer, 3600).to_text())
    strict, lenient, closed = mesh.node(), mesh.node("--accept-code", "members"), mesh.node("--accept-code", "nobody")
    script = mesh.script("""\
        import sys
        import lattica

        @lattica.actor
        class Echo:
            def echo(self, x):
                return x

        lattica.init(bootstrap=[sys.argv[1]], key_path=sys.argv[2])
        e = Echo.options(node=sys.argv[1].rsplit("/p2p/", 1)[1]).remote()
        try:
            print(lattica.get(e.echo.remote("ran")), flush=True)
        except lattica.errors.PermissionDenied as err:
            print("refused:", err, flush=True)
    """)
    env = {"LATTICA_MESH": str(member_cert)}  # an invited member, not an administrator
    out = mesh.run(script, strict, str(driver_key), env=env)
    assert "refused:" in out.stdout and "accept_code='admins'" in out.stdout, out.stdout + out.stderr
    assert mesh.run(script, lenient, str(driver_key), env=env).stdout.strip() == "ran"
    out = mesh.run(script, closed, str(driver_key))  # even an administrator's
    assert "refused:" in out.stdout and "accept_code='nobody'" in out.stdout


def test_a_stranger_is_told_why_and_a_missing_name_is_not_waited_on(mesh, tmp_path):
    addr = mesh.node()
    out = mesh.run(
        mesh.script("""\
        import sys
        import lattica

        @lattica.actor
        class Bank:
            def balance(self):
                return 100

        lattica.init(bootstrap=[sys.argv[1]])
        Bank.options(node=sys.argv[1].rsplit("/p2p/", 1)[1], name="bank", lifetime="detached").remote().balance.remote().result(20)
    """),
        addr,
    )
    assert out.returncode == 0, out.stderr
    lookup = mesh.script(
        """\
        import sys, time
        import lattica

        lattica.init(bootstrap=[sys.argv[1]])
        for name in ("bank", "nobody-holds-this"):
            t0 = time.monotonic()
            try:
                print(name, lattica.get_actor(name).balance.remote().result(10), flush=True)
            except lattica.errors.LatticaError as e:
                print(name, type(e).__name__, round(time.monotonic() - t0), str(e).replace("\\n", " "), flush=True)
    """,
        "lookup.py",
    )
    out = mesh.run(lookup, addr)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "bank 100"
    name, kind, seconds, _ = lines[1].split(" ", 3)
    assert kind == "ActorNotFound" and int(seconds) < 5  # not the 10 s timeout
    other = tmp_path / "other.key"
    MeshKey.generate().save(str(other))
    out = mesh.run(lookup, addr, env={"LATTICA_MESH": str(other)})  # the most likely mistake: another mesh
    bank = out.stdout.splitlines()[0]
    assert bank.startswith("bank PermissionDenied") and "registered only by nodes outside this node's mesh" in bank, (
        out.stdout + out.stderr
    )
    assert int(bank.split()[2]) < 5


def test_a_bad_mesh_credential_is_a_lattica_error():
    with pytest.raises(lattica.errors.CertificateError, match="base64|malformed"):
        lattica.Node(["/ip4/127.0.0.1/tcp/0"], mesh="lattica-mesh-cert-1:%%%")


def test_sigterm_is_a_goodbye(mesh):
    """A node stopped by kill, systemd or docker stop leaves the mesh; it does not look crashed."""
    addr = mesh.node()
    peer = addr.rsplit("/p2p/", 1)[1]
    wait_for(lambda: any(n["peer_id"] == peer and n["state"] == "alive" for n in mesh.me.nodes()), timeout=10)
    node = mesh.procs[-1]
    node.send_signal(signal.SIGTERM)
    assert node.wait(20) == 128 + signal.SIGTERM
    wait_for(lambda: any(n["peer_id"] == peer and n["state"] == "left" for n in mesh.me.nodes()), timeout=5)


def test_cli_edges(mesh, tmp_path):
    """``dht get`` of a missing key fails (a script can test for it); ``put --key`` keeps one PeerId."""
    addr = mesh.node()
    cli = [sys.executable, "-c", NODE]
    out = subprocess.run(
        [*cli, "dht", "get", "no/such/key", "--bootstrap", addr],
        env=mesh.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and '"found": false' in out.stdout
    (tmp_path / "f.bin").write_bytes(b"x" * 1000)
    ids = []
    for _ in range(2):
        out = subprocess.run(
            [*cli, "put", str(tmp_path / "f.bin"), "--no-serve", "--key", str(tmp_path / "put.key"), "-q"],
            env=mesh.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        ids.append(lattica.KeyPair.load(str(tmp_path / "put.key")).peer_id)
    assert ids[0] == ids[1]


def test_lattica_get_as_a_user_meets_it(mesh, tmp_path):
    """Binary never goes to a terminal (a file named after the CID instead), a missing directory is
    named, an unknown CID is said to have no provider, at once, and a get ends with a summary."""
    import pty
    import time

    from lattica.content._cid import Cid

    addr = mesh.node()
    cli = [sys.executable, "-c", NODE]
    data = os.urandom(300_000)
    (tmp_path / "f.bin").write_bytes(data)
    server = subprocess.Popen(
        [*cli, "put", str(tmp_path / "f.bin"), "--listen", "/ip4/127.0.0.1/tcp/0", "--bootstrap", addr, "-q"],
        env=mesh.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    mesh.procs.append(server)
    cid = server.stdout.readline().strip()
    where = tmp_path / "out"
    where.mkdir()
    primary, secondary = pty.openpty()
    try:
        out = subprocess.run(
            [*cli, "get", cid, "--bootstrap", addr, "--blocks", str(tmp_path / "b1")],
            cwd=where,
            env=mesh.env,
            stdout=secondary,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(secondary)
        os.close(primary)
    assert out.returncode == 0, out.stderr
    assert (where / cid).read_bytes() == data
    assert f"got {cid}: 0.3 MB in" in out.stderr and f"saved to {cid}" in out.stderr
    out = subprocess.run(
        [
            *cli,
            "get",
            cid,
            "-o",
            str(tmp_path / "nowhere" / "f.bin"),
            "--bootstrap",
            addr,
            "--blocks",
            str(tmp_path / "b2"),
        ],
        env=mesh.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and f"the directory {tmp_path / 'nowhere'} does not exist" in out.stderr
    unknown = str(Cid.of(b"nobody has this"))
    t0 = time.monotonic()
    out = subprocess.run(
        [*cli, "get", unknown, "-o", str(tmp_path / "u.bin"), "--bootstrap", addr, "--blocks", str(tmp_path / "b3")],
        env=mesh.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and out.stderr.strip().endswith(f"no provider found for {unknown}"), out.stderr
    assert time.monotonic() - t0 < 15  # the DHT answered "none": not after the 20 s find_timeout


def test_lattica_status_counts_user_and_system_actors_apart_and_survives_head(mesh):
    addr = mesh.node()
    cli = [sys.executable, "-c", NODE]
    full = subprocess.run(
        [*cli, "status", "--bootstrap", addr], env=mesh.env, capture_output=True, text=True, timeout=60
    )
    assert full.returncode == 0, full.stderr
    header = next(line for line in full.stdout.splitlines() if line.startswith("NODE"))
    assert "ACTORS" in header and "SYSTEM" in header
    row = next(
        line
        for line in full.stdout.splitlines()
        if line.startswith("…" + addr.rsplit("/p2p/", 1)[1][-8:]) or addr.rsplit("/p2p/", 1)[1][-8:] in line
    )
    at = header.index("ACTORS")
    assert (
        row[at:].split()[0] == "0" and int(row[header.index("SYSTEM") :].split()[0]) > 0
    )  # no user actors on a fresh node; its system ones counted apart
    proc = subprocess.Popen(
        [*cli, "status", "--bootstrap", addr], env=mesh.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    proc.stdout.readline()  # `| head -n 1`
    proc.stdout.close()
    assert proc.wait(60) == 0 and proc.stderr.read() == ""
