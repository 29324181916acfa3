"""The redial membership tries when a member's connection is lost: a process being SIGKILLed can
accept one last connection and reset it mid-handshake; the next try is refused, and that refusal
is the proof of death. (The race itself cannot be produced on demand with real sockets, so the
host's dialer is a stand-in here; tests/integration/test_rl_supervised.py kills real processes.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica.actors.membership import _REDIAL_TRIES, MembershipService
from lattica.errors import PeerGone, PeerUnreachable


def _service(failures: list[BaseException | None]) -> SimpleNamespace:
    peer = KeyPair.generate().peer_id
    verdicts: list[tuple] = []
    tries: list[int] = []

    async def race(p, addrs):
        tries.append(len(addrs))
        err = failures.pop(0)
        if err is not None:
            raise err

    host = SimpleNamespace(peer_addrs={peer: [Multiaddr("/ip4/127.0.0.1/tcp/4001")]}, dial_addrs=race)
    core = SimpleNamespace(
        declare_dead=lambda now, m, why: verdicts.append(("dead", m, why)) or [],
        suspect=lambda now, m: verdicts.append(("suspect", m)) or [],
    )
    svc = SimpleNamespace(host=host, core=core, _now=lambda: 0.0, _emit=lambda events: None)
    return SimpleNamespace(svc=svc, peer=peer, verdicts=verdicts, tries=tries)


def _redial(t: SimpleNamespace) -> None:
    asyncio.run(MembershipService._redial(t.svc, t.peer))  # type: ignore[arg-type]


def test_a_reset_during_the_handshake_then_a_refusal_is_death():
    t = _service([PeerUnreachable("connection lost during handshake: reset"), PeerGone("refused")])
    _redial(t)
    assert len(t.tries) == 2
    assert t.verdicts == [("dead", str(t.peer), "connection lost and redial refused")]


def test_a_member_that_answers_the_redial_is_left_alone():
    t = _service([PeerUnreachable("reset"), None])
    _redial(t)
    assert t.verdicts == [] and len(t.tries) == 2


def test_a_member_that_keeps_failing_without_refusing_is_only_suspected():
    t = _service([PeerUnreachable("reset")] * _REDIAL_TRIES)
    _redial(t)
    assert len(t.tries) == _REDIAL_TRIES
    assert t.verdicts == [("suspect", str(t.peer))]
