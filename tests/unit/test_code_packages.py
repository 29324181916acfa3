"""Code packages: packed deterministically, read safely from a peer, signed, loaded in namespaces
of their own (two drivers' ``myapp`` side by side), and the rule for a driver's script."""

import os
import sys
import textwrap

import msgpack
import pytest

from lattica._code.loader import Namespace
from lattica._code.package import CodePackage, pack, unpack
from lattica._code.script import check_class, filter_script
from lattica._code.tickets import Ticket, ticket_of
from lattica._identity import KeyPair
from lattica.errors import CodeError, SpawnError


def write(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))


def ticket(cid="bafkreitest", key=None):
    return Ticket.issue(cid, key or KeyPair.generate(), [])


# -- packing ------------------------------------------------------------------------------------


def test_the_same_files_pack_to_the_same_bytes_whatever_order_they_were_written_in(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    files = {"train.py": "x = 1\n", "myapp/__init__.py": "", "myapp/model.py": "y = 2\n"}
    write(a, files)
    write(b, dict(reversed(list(files.items()))))
    pa, pb = pack([str(a)]), pack([str(b)])
    assert pa.encode() == pb.encode()
    assert sorted(pa.files) == ["myapp/__init__.py", "myapp/model.py", "train.py"]
    write(b, {"myapp/model.py": "y = 3\n"})
    assert pack([str(b)]).encode() != pa.encode()


def test_packing_skips_what_is_not_source_or_not_importable_and_honours_excludes(tmp_path):
    write(
        tmp_path,
        {
            "train.py": "",
            "data.json": "{}",
            "notes/readme.txt": "",
            ".hidden/x.py": "",
            "__pycache__/train.cpython-311.py": "",
            "venv/lib/site.py": "",
            "my-script.py": "",
            "tests/test_x.py": "",
            "pkg/mod.py": "",
        },
    )
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    pkg = pack([str(tmp_path)], excludes=["tests/*"])
    assert sorted(pkg.files) == ["pkg/mod.py", "train.py"]


def test_a_module_by_name_travels_under_its_name(tmp_path, monkeypatch):
    write(tmp_path, {"shipme/__init__.py": "A = 1\n", "shipme/sub.py": "B = 2\n", "single_mod.py": "C = 3\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    pkg = pack(["shipme", "single_mod"])
    assert sorted(pkg.files) == ["shipme/__init__.py", "shipme/sub.py", "single_mod.py"]
    with pytest.raises(CodeError, match="neither a directory nor an importable module"):
        pack(["no_such_module_here"])


def test_a_package_over_the_cap_is_refused_when_packed_and_when_read(tmp_path):
    write(tmp_path, {"big.py": "#" * 5000 + "\n"})
    with pytest.raises(CodeError, match="over the cap of 1000 bytes"):
        pack([str(tmp_path)], max_bytes=1000)
    data = pack([str(tmp_path)]).encode()
    with pytest.raises(CodeError, match="cap"):
        unpack(data, max_bytes=1000)


def test_the_main_script_is_named_when_a_root_holds_it(tmp_path):
    write(tmp_path, {"train.py": "", "lib.py": ""})
    assert pack([str(tmp_path)], main=(str(tmp_path), "train.py")).main == "train.py"
    assert pack([str(tmp_path)]).main is None


@pytest.mark.parametrize(
    "doc",
    [
        [1, None, [["../evil.py", b""]]],
        [1, None, [["/abs.py", b""]]],
        [1, None, [["a/../b.py", b""]]],
        [1, None, [["data.txt", b""]]],
        [1, None, [["a.py", "text, not bytes"]]],
        [1, None, [["a.py", b""], ["a.py", b""]]],
        [1, "missing.py", [["a.py", b""]]],
        [2, None, []],
        {"files": []},
        [1, None, [["a.py"]]],
    ],
)
def test_a_malformed_package_from_a_peer_is_a_code_error(doc):
    with pytest.raises(CodeError):
        unpack(msgpack.packb(doc, use_bin_type=True))


def test_bytes_that_are_not_msgpack_are_a_code_error():
    for data in (b"", b"\xc1", b"\x93\x01", os.urandom(200)):
        with pytest.raises(CodeError):
            unpack(data)


def test_a_ticket_verifies_only_for_its_cid_and_signer():
    key = KeyPair.generate()
    t = ticket("bafkreione", key)
    assert t.verify()
    back = Ticket.from_wire(t.to_wire())
    assert back == t and back.verify()
    assert not Ticket("bafkreitwo", t.sender, t.signature).verify()
    assert not Ticket(t.cid, KeyPair.generate().peer_id, t.signature).verify()
    for raw in (None, [], ["c", b"x", b"s", []], [1, 2, 3, 4], ["c" * 200, key.peer_id.to_bytes(), b"s", []]):
        with pytest.raises(CodeError):
            Ticket.from_wire(raw)


# -- the script rule ------------------------------------------------------------------------------

SCRIPT = '''\
"""A driver."""
import sys
import lattica
from dataclasses import dataclass

HIDDEN = 64
SIZES = (HIDDEN, HIDDEN * 2)
log = open("/dev/null")
DOUBLE = HIDDEN * 2
try:
    import numpy as np
except ImportError:
    np = None

def helper(x):
    return x * DOUBLE

def uses_log():
    return log

@lattica.actor
class Shard:
    def __init__(self, seed):
        self.seed = seed
    def forward(self, x):
        return helper(x) + self.seed

@lattica.actor
class Logged:
    def go(self):
        return uses_log()

lattica.init()
s = Shard.remote(1)
print(lattica.get(s.forward.remote(2)))
for i in range(3):
    pass
if __name__ == "__main__":
    @lattica.actor
    class Hidden:
        pass
'''


def test_the_rule_keeps_imports_definitions_and_assignments_that_call_nothing():
    f = filter_script(SCRIPT, "train.py")
    kept = {type(s).__name__ + ":" + getattr(s, "name", "") for s in f.kept.body}
    assert "ClassDef:Shard" in kept and "FunctionDef:helper" in kept and "Try:" in kept
    assert set(f.left_out) >= {"log", "s", "i"}
    assert f.left_out["log"][0] == 8
    namespace: dict = {}
    exec(compile(f.kept, "train.py", "exec"), namespace)  # nothing drives: no init, no print, no loop
    assert namespace["DOUBLE"] == 128 and namespace["SIZES"] == (64, 128)
    assert "s" not in namespace and "log" not in namespace


def test_a_class_that_needs_a_left_out_name_is_refused_naming_the_line():
    f = filter_script(SCRIPT, "train.py")
    check_class(f, "Shard", "train.py")  # helper -> DOUBLE -> HIDDEN: all kept
    with pytest.raises(
        CodeError, match=r"train.py line 8 \(log = open\(\"/dev/null\"\)\).*Logged uses 'log' \(through uses_log\)"
    ):
        check_class(f, "Logged", "train.py")
    with pytest.raises(CodeError, match="Hidden is defined where other nodes do not run it"):
        check_class(f, "Hidden", "train.py")


def test_a_kept_kind_that_uses_a_left_out_name_is_left_out_too():
    f = filter_script("import os\nA = os.getcwd()\nB = A\nclass C(B.__class__):\n    pass\n", "s.py")
    assert set(f.left_out) == {"A", "B", "C"}
    with pytest.raises(CodeError, match="line 4"):
        check_class(f, "C", "s.py")


def test_assignments_that_change_what_is_not_the_scripts_are_left_out():
    source = "import os, sys\nos.environ['X'] = '1'\nsys.path[:0] = ['/x']\nos.sep2 = 'x'\nA: int = 1\nB: os.getcwd() = 2\nC, D = 1, 2\n"
    f = filter_script(source, "s.py")
    namespace: dict = {}
    exec(compile(f.kept, "s.py", "exec"), namespace)
    assert namespace["A"] == 1 and namespace["C"] == 1 and "B" not in namespace
    assert set(f.left_out) == {"B"} and os.environ.get("X") != "1" and "/x" not in sys.path


def test_a_local_name_that_shadows_a_left_out_one_is_not_a_false_alarm():
    f = filter_script(
        "model = make()\nclass C:\n    def go(self, model):\n        x = model\n        return x\n", "s.py"
    )
    check_class(f, "C", "s.py")


def test_a_script_that_does_not_parse_is_a_code_error():
    with pytest.raises(CodeError, match="s.py line 1"):
        filter_script("def (:\n", "s.py")


# -- namespaces -----------------------------------------------------------------------------------

APP = """\
import lattica
from myapp.util import VERSION
from . import util

@lattica.actor
class Shard:
    def version(self):
        return VERSION, util.VERSION
"""


def namespace(version, main=None, extra=None):
    files = {
        "myapp/__init__.py": b"",
        "myapp/util.py": f"VERSION = {version}\n".encode(),
        "myapp/shard.py": APP.encode(),
    }
    files.update(extra or {})
    ns = Namespace(ticket(f"bafkreiv{version}"), CodePackage(files, main))
    ns.install()
    return ns


def test_two_versions_of_one_package_load_side_by_side_and_unload():
    one, two = namespace(1), namespace(2)
    try:
        c1, c2 = one.actor_class("myapp.shard.Shard"), two.actor_class("myapp.shard.Shard")
        assert c1().version() == (1, 1) and c2().version() == (2, 2)
        assert "myapp" not in sys.modules  # the node's own module space is untouched
        assert ticket_of(c1.__module__) is one.ticket
    finally:
        one.unload()
        two.unload()
    assert not [m for m in sys.modules if m.startswith(one.prefix) or m.startswith(two.prefix)]
    assert ticket_of(c1.__module__) is None


def test_a_packaged_script_runs_only_its_definitions():
    script = b"import lattica\nimport myapp.util\n@lattica.actor\nclass S:\n    def v(self):\n        return myapp.util.VERSION\nraise SystemExit('the driver ran')\n"
    ns = namespace(3, main="train.py", extra={"train.py": script})
    try:
        assert ns.actor_class("train.S")().v() == 3
    finally:
        ns.unload()


def test_an_import_that_raises_reaches_the_caller_with_the_package_traceback():
    ns = namespace(4, extra={"broken.py": b"import lattica\n\ndef f():\n    return 1 / 0\n\nf()\n"})
    try:
        with pytest.raises(CodeError, match=r"(?s)ZeroDivisionError.*broken.py\", line 4.*return 1 / 0"):
            ns.actor_class("broken.Anything")
    finally:
        ns.unload()


def test_a_missing_class_or_module_or_a_plain_class_is_refused():
    ns = namespace(5, extra={"plain.py": b"class P:\n    pass\n"})
    try:
        with pytest.raises(SpawnError, match="no module 'other'"):
            ns.actor_class("other.X")
        with pytest.raises(SpawnError, match="defines no 'Nope'"):
            ns.actor_class("myapp.shard.Nope")
        with pytest.raises(SpawnError, match="not a @lattica.actor class"):
            ns.actor_class("plain.P")
    finally:
        ns.unload()


def test_every_class_of_the_script_is_checked_not_only_the_first(tmp_path, monkeypatch):
    import asyncio
    import types

    from lattica._code.shipper import Shipper

    script = tmp_path / "train.py"
    script.write_text(
        "import lattica\nh = open(__file__)\n\n@lattica.actor\nclass Good:\n    pass\n\n@lattica.actor\nclass Bad:\n    def f(self):\n        return h\n"
    )
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    shipper = Shipper(KeyPair.generate(), [], lambda data: "bafkreitest", code=None)
    good = type("Good", (), {"__module__": "__main__", "__qualname__": "Good"})
    bad = type("Bad", (), {"__module__": "__main__", "__qualname__": "Bad"})
    assert asyncio.run(shipper.ticket(good)) is not None
    with pytest.raises(CodeError, match="line 2 .*Bad uses 'h'"):
        asyncio.run(shipper.ticket(bad))
