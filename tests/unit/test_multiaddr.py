"""Multiaddr text and binary forms, including the byte encodings other libp2p stacks produce."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica.errors import MultiaddrError

PID = "12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3pq"


@pytest.mark.parametrize(
    "text, hexbytes",
    [
        # byte forms from the multiaddr spec / go-multiaddr tests
        ("/ip4/127.0.0.1/tcp/4001", "047f000001060fa1"),
        ("/ip4/127.0.0.1/udp/4001/quic-v1", "047f00000191020fa1cd03"),  # quic-v1 is 0x01cd (0x01cc: draft-29 quic)
        ("/ip6/::1/tcp/80", "2900000000000000000000000000000001060050"),
        ("/dns4/example.com/tcp/443", "360b6578616d706c652e636f6d0601bb"),
    ],
)
def test_known_binary_forms(text, hexbytes):
    ma = Multiaddr(text)
    assert ma.to_bytes().hex() == hexbytes
    assert Multiaddr.from_bytes(bytes.fromhex(hexbytes)) == ma
    assert str(ma) == text


@pytest.mark.parametrize(
    "text",
    [
        f"/ip4/1.2.3.4/tcp/4001/p2p/{PID}",
        f"/ip4/1.2.3.4/udp/4001/quic-v1/p2p/{PID}",
        f"/ip4/1.2.3.4/tcp/4001/p2p/{PID}/p2p-circuit/p2p/{PID}",
        "/dns/relay.example.org/tcp/4001",
        "/ip6/2001:db8::1/udp/9/quic-v1",
        "/memory/42",
    ],
)
def test_round_trips(text):
    ma = Multiaddr(text)
    assert str(ma) == text
    assert Multiaddr.from_bytes(ma.to_bytes()) == ma
    assert Multiaddr(str(ma)) == ma


def test_peer_id_helpers_and_circuit():
    base = Multiaddr("/ip4/10.0.0.1/tcp/1")
    pid = KeyPair.generate().peer_id
    full = base.with_peer_id(pid)
    assert full.peer_id == pid and full.without_peer_id() == base
    relayed = full.encapsulate(f"/p2p-circuit/p2p/{PID}")
    assert relayed.is_circuit and str(relayed.peer_id) == PID
    assert base.host_port() == ("10.0.0.1", 1)
    assert Multiaddr("/ipfs/" + PID) == Multiaddr("/p2p/" + PID)  # legacy alias
    assert Multiaddr("/ip6/2001:0db8:0000::1/tcp/1") == Multiaddr("/ip6/2001:db8::1/tcp/1")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "ip4/1.2.3.4",
        "/ip4/1.2.3.400/tcp/1",
        "/ip4/1.2.3.4/tcp/70000",
        "/ip4/1.2.3.4/tcp",
        "/foo/1",
        "/p2p/notanid",
        "/tcp/x",
    ],
)
def test_bad_text(text):
    with pytest.raises(MultiaddrError):
        Multiaddr(text)


@given(st.binary(max_size=64))
def test_garbage_bytes_raise_multiaddr_error_only(data):
    try:
        ma = Multiaddr.from_bytes(data)
    except MultiaddrError:
        return
    assert Multiaddr.from_bytes(ma.to_bytes()) == ma
