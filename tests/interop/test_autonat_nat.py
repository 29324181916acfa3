"""AutoNAT answers from go-libp2p and from us agree on each NAT kind (issue 50). NAT lab
(tests/natlab/lab.py: namespaces and nftables, root), on public /24s that go will dial (it refuses
documentation ranges): a go node (p2pd 0.32 with its AutoNAT service; go-libp2p serves v2 only
from 0.36, so this one answers v1) and a Lattica node (AutoNAT v2 server) on public hosts; behind
each NAT kind, one client of ours per transport, connected to both over that transport, asks
each to dial it back at its address of that transport: QUIC as the server observed its
listening socket, TCP at its listening port. The two servers must come to the same answer, and
it must be the one the NAT kind implies (a dial-back leaves from a port the client never
contacted: only an endpoint- or address-independent filter lets it in), so that agreeing on
nothing cannot pass."""

from __future__ import annotations

import asyncio
import pathlib
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest
from natlab.lab import Lab
from natlab.test_matrix import Proc

from lattica.bench._peers.p2pd import Daemon

pytestmark = pytest.mark.timeout(240)

KINDS = ("public", "full_cone", "address_restricted", "port_restricted", "port_remap", "symmetric", "firewall")
#: (kind, transport) -> what a dial-back from a fresh port of the server's host comes to
EXPECTED = {
    (kind, transport): "reached"
    if kind == "public" or (transport == "quic" and kind in ("full_cone", "address_restricted"))
    else "failed"
    for kind in KINDS
    for transport in ("tcp", "quic")
}


@pytest.fixture(scope="module")
def need_lab() -> None:
    ok, why = Lab.available()  # (as tests/natlab/conftest.py's need_lab: root, ip netns, nft)
    if not ok:
        pytest.skip(why)


def test_go_and_ours_give_the_same_autonat_answer_on_each_nat_kind(need_lab, p2pd_binary) -> None:
    with (
        Lab(prefix="nan", internet="11.0.0.0/24", firewall_net="11.0.1.0/24") as lab,
        tempfile.TemporaryDirectory(prefix="p2pd-lab-") as tmp,
    ):
        gohost, ourhost = lab.public_host("gonat"), lab.public_host("ournat")
        go = Daemon(
            p2pd_binary,
            pathlib.Path(tmp),
            listen=(f"/ip4/{gohost.ip}/tcp/4001", f"/ip4/{gohost.ip}/udp/4001/quic-v1"),
            flags=("-autonat", "-forceReachabilityPublic"),
            popen=lambda argv, **kw: lab.popen(gohost, argv, **kw),
        )
        try:
            go_peer, _ = asyncio.run(go.identify())
            ours = Proc(lab, ourhost, ["--autonat-servers", "0"])
            servers = {"go": (str(go_peer), gohost.ip), "ours": (ours.peer_id, ourhost.ip)}
            clients = {
                (kind, transport): Proc(lab, lab.add_site(kind).host, ["--autonat-servers", "0", f"--{transport}-only"])
                for kind in KINDS
                for transport in ("tcp", "quic")
            }

            def run(key: tuple[str, str]) -> dict:
                client, transport = clients[key], key[1]
                for peer, ip in servers.values():
                    where = f"/ip4/{ip}/tcp/4001" if transport == "tcp" else f"/ip4/{ip}/udp/4001/quic-v1"
                    assert client.ask({"cmd": "connect", "addr": f"{where}/p2p/{peer}"}) == {"ok": True}
                got = client.ask(
                    {"cmd": "autonat_ask", "peers": [p for p, _ in servers.values()], "transport": transport},
                    timeout=70,
                )
                return dict(zip(servers, got["answers"]))

            with ThreadPoolExecutor(len(clients)) as pool:
                answers = dict(zip(clients, pool.map(run, clients)))
        finally:
            go.stop()

    table = {key: {who: a["outcome"] for who, a in got.items()} for key, got in answers.items()}
    for key, got in answers.items():
        assert got["go"]["version"] == 1 and got["ours"]["version"] == 2, got  # (go 0.32 answers v1 only)
    wrong = {
        key: (table[key], EXPECTED[key], answers[key]) for key in answers if set(table[key].values()) != {EXPECTED[key]}
    }
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in wrong.items())
