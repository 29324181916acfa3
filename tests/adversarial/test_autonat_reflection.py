"""AutoNAT as a reflection vector (issue 17): a peer must not be able to aim our dials at a third
party. Real nodes on loopback; the "victim" is a plain TCP listener counting who connects."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

import lattica
from helpers import call_as, wait_for
from lattica._runtime import autonat_ref
from lattica.errors import LatticaError, PermissionDenied, ProtocolError
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(60)


class Victim:
    """A TCP listener on 127.0.0.1 that counts and drops every connection."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            c.close()

    def addr(self) -> str:
        return f"/ip4/127.0.0.1/tcp/{self.port}"

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@pytest.fixture
def victim():
    v = Victim()
    yield v
    v.close()


def _dial_for(node, target, addrs):
    return call_as(
        node, autonat_ref(target.peer_id), "dial_for", target.peer_id.to_bytes(), addrs, os.urandom(16), timeout=10
    )


def test_a_stranger_cannot_make_us_dial_a_third_party(mesh, victim):
    host, member, stranger = mesh
    for _ in range(5):
        with pytest.raises(PermissionDenied):
            call_as(
                stranger,
                autonat_ref(host.peer_id),
                "dial_for",
                member.peer_id.to_bytes(),
                [victim.addr()],
                os.urandom(16),
            )
    time.sleep(0.3)
    assert victim.accepted == 0


def test_a_stranger_is_dialed_back_only_at_its_own_ip(mesh, victim):
    host, member, stranger = mesh
    # the stranger's connection comes from 127.0.0.1: an address at another IP is never dialed
    answer = call_as(
        stranger,
        autonat_ref(host.peer_id),
        "check",
        [f"/ip4/127.0.0.2/tcp/{victim.port}"],
        os.urandom(16),
        [],
        timeout=10,
    )
    assert answer["tried"] == []
    time.sleep(0.3)
    assert victim.accepted == 0


def test_dial_for_names_one_ip(mesh, victim):
    host, member, stranger = mesh
    with pytest.raises(ProtocolError, match="one IP"):
        call_as(
            member,
            autonat_ref(host.peer_id),
            "dial_for",
            stranger.peer_id.to_bytes(),
            [victim.addr(), "/ip4/127.0.0.2/tcp/9"],
            os.urandom(16),
        )


def test_many_identities_asking_for_one_address_get_a_bounded_number_of_dials(victim):
    """Members (each within its own request budget) together ask for 48 dial-backs to one IP:
    the host dials it at most the per-IP burst plus what refills meanwhile, and refuses the rest
    as busy (a refusal, which the asker does not take as evidence that it is unreachable)."""
    key = MeshKey.generate()
    tcp = "/ip4/127.0.0.1/tcp/0"
    with lattica.Node([tcp], mesh=key) as host:
        askers = [lattica.Node([tcp], mesh=key).start() for _ in range(6)]
        try:
            for a in askers:
                a.connect(host.addrs[0])
            t0 = time.monotonic()
            results = []

            def ask(node):
                for _ in range(8):  # one requester's whole burst
                    try:
                        results.append(
                            call_as(
                                node,
                                autonat_ref(host.peer_id),
                                "dial_for",
                                askers[0].peer_id.to_bytes(),
                                [victim.addr()],
                                os.urandom(16),
                                timeout=10,
                            )
                        )
                    except LatticaError as e:
                        results.append(e)

            threads = [threading.Thread(target=ask, args=(a,)) for a in askers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.monotonic() - t0
            wait_for(lambda: False, 0.3)
            assert len(results) == 48
            refused = [r for r in results if isinstance(r, BaseException)]
            assert all("busy" in str(r) for r in refused), refused  # over budget: refused, not dialed
            allowed = 16 + 1.0 * elapsed + 1  # the per-IP burst, its refill, and rounding
            assert len(results) - len(refused) <= allowed
            assert 1 <= victim.accepted <= allowed, (victim.accepted, elapsed)
        finally:
            for a in askers:
                a.stop()
