"""What the SDK swarm service keeps of the relay addresses read on ``p2p-circuit-broadcast``
(actors/sdk_swarm.py): only a relayed address of the author's own, of our swarm."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from lattica._identity import KeyPair
from lattica.actors.sdk_swarm import SdkSwarm
from lattica.config import SdkConfig
from lattica.pubsub._subscription import Message
from lattica.sdk import _wire as w

ME, AUTHOR, OTHER, RELAY = (KeyPair.generate().peer_id for _ in range(4))
SWARM = "/lattica/1.0.0"


class _Host:
    """The little of a host the service reads: its address book, its events."""

    def __init__(self) -> None:
        self.peer_id = ME
        self.book: dict[Any, list] = {}
        self.hints: dict[Any, list] = {}
        self.conns: dict[Any, Any] = {AUTHOR: object()}
        self.events = SimpleNamespace(addresses_changed=SimpleNamespace(subscribe=lambda fn: None))

    @property
    def peer_addrs(self) -> dict[Any, list]:
        return self.book

    def remember_addrs(self, peer: Any, addrs: list, hint: bool = False) -> None:
        (self.hints if hint else self.book).setdefault(peer, []).extend(addrs)


def _swarm() -> tuple[SdkSwarm, _Host]:
    host = _Host()
    return SdkSwarm(host, None, SdkConfig(), SWARM), host  # type: ignore[arg-type]


def _msg(data: bytes, author: Any = AUTHOR) -> Message:
    return Message("p2p-circuit-broadcast", author, 1, data, None)


def test_a_relayed_address_of_the_authors_own_is_filed_under_it() -> None:
    swarm, host = _swarm()
    addr = f"/ip4/1.2.3.4/tcp/4001/p2p/{RELAY}/p2p-circuit/p2p/{AUTHOR}"
    swarm._on_message(_msg(w.encode_relay_addr(addr, SWARM)))
    swarm._on_message(_msg(addr.encode()))  # (the form before 1.0.21)
    assert [str(a) for a in host.book[AUTHOR]] == [addr, addr] and swarm.learned == 2


def test_an_authors_address_is_a_hint_while_we_do_not_know_the_author() -> None:
    """Authors cost nothing: one we are not connected to and have no address of is filed as a
    hint, so a flood of them cannot push the peers we know out of the address book."""
    swarm, host = _swarm()
    del host.conns[AUTHOR]
    addr = f"/ip4/1.2.3.4/tcp/4001/p2p/{RELAY}/p2p-circuit/p2p/{AUTHOR}"
    swarm._on_message(_msg(w.encode_relay_addr(addr, SWARM)))
    assert host.book == {} and [str(a) for a in host.hints[AUTHOR]] == [addr] and swarm.learned == 1


@pytest.mark.parametrize(
    "data",
    [
        w.encode_relay_addr(f"/ip4/1.2.3.4/tcp/4001/p2p/{RELAY}/p2p-circuit/p2p/{OTHER}", SWARM),  # someone else's
        w.encode_relay_addr(f"/ip4/1.2.3.4/tcp/4001/p2p/{AUTHOR}", SWARM),  # not relayed
        w.encode_relay_addr(f"/ip4/1.2.3.4/tcp/4001/p2p/{RELAY}/p2p-circuit/p2p/{AUTHOR}", "/other"),  # another swarm
        b"\xff\xfe",
        b"/not/a/multiaddr",
        b"/" + b"x" * 600,
    ],
    ids=["another-peer", "not-relayed", "another-swarm", "garbage", "bad-multiaddr", "too-long"],
)
def test_anything_else_is_dropped(data: bytes) -> None:
    swarm, host = _swarm()
    swarm._on_message(_msg(data))
    assert host.book == {} and host.hints == {} and swarm.learned == 0
