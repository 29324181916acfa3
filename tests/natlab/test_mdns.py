"""mDNS on a LAN: nodes on one segment (the lab's internet bridge) find each other with no
bootstrap address, by multicast; a node with mDNS off is neither found nor finds anyone."""

from __future__ import annotations

import time

import pytest

from .lab import Lab
from .test_matrix import Proc

pytestmark = pytest.mark.usefixtures("need_lab")  # (tests/natlab/conftest.py)


def test_nodes_on_one_lan_find_each_other_by_mdns():
    with Lab(prefix="nld") as lab:
        a = Proc(lab, lab.public_host("mdnsa"), ["--mdns", "on"])
        b = Proc(lab, lab.public_host("mdnsb"), ["--mdns", "on"])
        quiet = Proc(lab, lab.public_host("quiet"), ["--mdns", "off"])
        deadline = time.monotonic() + 15
        while b.peer_id not in a.ask({"cmd": "status"})["conns"]:
            assert time.monotonic() < deadline, "a never found b"
            time.sleep(0.2)
        r = a.ask({"cmd": "call", "peer": b.peer_id, "timeout": 10}, timeout=20)
        assert r.get("ok") and r["path"] in ("tcp", "quic"), r
        assert a.peer_id in b.ask({"cmd": "status"})["conns"]
        time.sleep(3)  # a few more query rounds: the quiet node stays out of it
        assert quiet.ask({"cmd": "status"})["conns"] == {}
        assert quiet.peer_id not in a.ask({"cmd": "status"})["conns"]
