"""Every Python snippet in README.md and docs/*.md runs as written, as its own script, against a
mesh of fresh ``lattica node`` processes. Only placeholders are filled: the example addresses
become the mesh's first node, the example PeerId ``"12D3KooW..."`` its second node, public listen
addresses and the dashboard's port become free loopback ones. The shell blocks' ``lattica ...``
commands are checked against the CLI's grammar (running them all would take the benchmarks'
hours): each parses, or, written as a usage summary, names what exists."""

import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

from lattica.mesh.process import cli_node
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(300)

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def snippets() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for m in FENCE.finditer(text):
            line = text[: m.start()].count("\n") + 2
            found.append((f"{path.relative_to(ROOT)}:{line}", m.group(1)))
    return found


SNIPPETS = snippets()


def test_the_docs_have_snippets():
    assert len(SNIPPETS) >= 15 and any(where.startswith("README.md") for where, _ in SNIPPETS)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    """Two plain ``lattica node`` processes in one mesh (the second joined through the first)."""
    tmp = tmp_path_factory.mktemp("snippets")
    key = tmp / "mesh.key"
    MeshKey.generate().save(str(key))
    env = dict(os.environ, HOME=str(tmp / "home"), LATTICA_MESH=str(key))
    procs, addrs = [], []
    try:
        for i in range(2):
            cwd = tmp / f"node{i}"
            cwd.mkdir()
            proc, addr = cli_node(*(["--connect", addrs[0]] if addrs else []), cwd=cwd, env=env)
            procs.append(proc)
            addrs.append(addr)
        yield env, addrs
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def fill(code: str, addrs: list[str]) -> str:
    """The placeholders, and nothing else."""
    second = addrs[1].rsplit("/p2p/", 1)[1]
    code = re.sub(r'"/ip4/[0-9.]+/tcp/4001/p2p/12D3KooW\.\.\."', repr(addrs[0]).replace("'", '"'), code)
    code = code.replace('"12D3KooW..."', f'"{second}"')
    code = code.replace('"/ip4/0.0.0.0/tcp/4001"', '"/ip4/127.0.0.1/tcp/0"').replace(
        '"/ip4/0.0.0.0/udp/4001/quic-v1"', '"/ip4/127.0.0.1/udp/0/quic-v1"'
    )
    code = code.replace('"127.0.0.1:8265"', '"127.0.0.1:0"')
    return code


@pytest.mark.parametrize("where,code", SNIPPETS, ids=[w for w, _ in SNIPPETS])
def test_a_snippet_runs_as_written(mesh, tmp_path, where, code):
    env, addrs = mesh
    if "natlab" in code:
        from natlab.lab import Lab

        ok, why = Lab.available()
        if not ok:
            pytest.skip(f"the NAT lab snippet needs what the NAT lab needs: {why}")
        env = dict(env, PYTHONPATH=os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p))
    script = tmp_path / "snippet.py"
    script.write_text(fill(code, addrs))
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, (
        f"{where} failed:\n{script.read_text()}\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-6000:]}"
    )


def commands() -> list[tuple[str, str]]:
    """Every ``lattica ...`` command line in the docs' other code blocks (shell), with its place."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
            if m.group(1) == "python":
                continue
            for i, line in enumerate(m.group(2).splitlines()):
                line = re.sub(r"^\S+\$ ", "", line.strip())  # a prompt: machine-a$
                if line.startswith("lattica "):
                    found.append((f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 2 + i}", line))
    return found


COMMANDS = commands()


@pytest.mark.parametrize("where,line", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_command_in_the_docs_is_one_the_cli_takes(where, line):
    """A concrete command parses as the CLI would parse it; a usage summary (``a|b``, ``[--x N]``)
    names only subcommands, choices and options that exist."""
    import shlex

    from lattica.cli import parser

    words = shlex.split(re.split(r"\s+#\s", line)[0])
    if ">" in words:
        words = words[: words.index(">")]
    p = parser()
    if not any("|" in w or w.startswith("[") for w in words):
        try:
            p.parse_args(words[1:])
        except SystemExit:
            pytest.fail(f"{where}: `{line}` is not a command the CLI takes")
        return
    sub = next(a for a in p._actions if a.dest == "cmd").choices  # (argparse keeps its subparsers here)
    assert words[1] in sub, f"{where}: no subcommand {words[1]!r}"
    sp = sub[words[1]]
    options = {o for a in sp._actions for o in a.option_strings}
    choices = {c for a in sp._actions if a.choices and not a.option_strings for c in a.choices}
    for w in words[2:]:
        for part in re.findall(r"--[a-z][a-z-]*", w):
            assert part in options, f"{where}: `lattica {words[1]}` has no option {part}"
    if choices and len(words) > 2 and not words[2].startswith(("-", "[")):  # the first positional: its alternatives
        head = re.split(r"\s(?=--|\[)", " ".join(words[2:]), maxsplit=1)[0]  # up to the first option
        unknown = [t.split()[0] for t in head.split("|") if t.strip() and t.split()[0] not in choices]
        assert not unknown, f"{where}: `lattica {words[1]}` takes none of {unknown}"
