"""identify message validation and length-prefixed framing, without sockets."""

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lattica import _identify as identify
from lattica._framing import read_message, write_message
from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica.errors import FrameTooLarge, ProtocolError, StreamClosed
from lattica.transports.base import Stream
from lattica.trust import MeshKey, Trust

KP = KeyPair.generate()
GOOD = identify.build(
    KP.public_key_protobuf(), "agent/1", [Multiaddr("/ip4/1.2.3.4/tcp/1")], Multiaddr("/ip4/5.6.7.8/tcp/9"), ["/a/1"]
)


def test_valid_message_parses():
    fields = identify.parse(GOOD, KP.peer_id)
    assert fields["listen_addrs"] == (Multiaddr("/ip4/1.2.3.4/tcp/1"),)
    assert fields["observed_addr"] == Multiaddr("/ip4/5.6.7.8/tcp/9")
    assert fields["protocols"] == ("/a/1",) and fields["agent_version"] == "agent/1"


@pytest.mark.parametrize(
    "patch, match",
    [
        ({"public_key": 2**62}, "must be bytes"),  # would otherwise allocate 4 EiB
        ({"public_key": -1}, "must be bytes"),
        ({"public_key": b"\x08\x01\x12\x02ab"}, "no valid public key"),
        ({"public_key": KeyPair.generate().public_key_protobuf()}, "does not match"),
        ({"listen_addrs": [b"\xff\xff"]}, "malformed address"),
        ({"listen_addrs": [7]}, "must be bytes"),
        ({"listen_addrs": [b"\x04\x01\x02\x03\x04"] * 65}, "at most 64"),
        ({"protocols": ["x" * 300]}, "short strings"),
        ({"protocols": "notalist"}, "at most 128"),
        ({"agent_version": 5}, "short string"),
        ({"observed_addr": 10**9}, "must be bytes"),
        ({"mesh_certs": b"cert"}, "mesh_certs"),
        ({"mesh_certs": [b"x"] * 5}, "mesh_certs"),
        ({"mesh_certs": [b"x" * 257]}, "mesh_certs"),
        ({"mesh_certs": ["text"]}, "mesh_certs"),
    ],
)
def test_bad_fields_are_protocol_errors(patch, match):
    with pytest.raises(ProtocolError, match=match):
        identify.parse({**GOOD, **patch}, KP.peer_id)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "public_key",
                "listen_addrs",
                "observed_addr",
                "protocols",
                "agent_version",
                "protocol_version",
                "mesh_certs",
                "other",
            ]
        ),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.binary(max_size=80) | st.text(max_size=20),
            lambda inner: st.lists(inner, max_size=5),
            max_leaves=10,
        ),
        max_size=8,
    )
)
def test_any_identify_fields_parse_or_raise_protocol_error_and_certificates_judge_safely(patch):
    msg = {**GOOD, **patch}
    try:
        fields = identify.parse(msg, KP.peer_id)
    except ProtocolError:
        return
    circle, why, admin, _ = Trust(KeyPair.generate().peer_id, [MeshKey.generate().public]).judge(
        KP.peer_id, fields["mesh_certs"], 0.0
    )
    assert circle == "stranger" and why and not admin


def test_non_map_is_rejected():
    with pytest.raises(ProtocolError):
        identify.parse([1, 2], KP.peer_id)


class _Pipe(Stream):
    """A one-way in-memory stream for framing tests."""

    def __init__(self):
        self.buf = bytearray()
        self.closed = False

    async def read(self, max_bytes=65536):
        data = bytes(self.buf[:max_bytes])
        del self.buf[:max_bytes]
        return data

    def write(self, data):
        self.buf += data

    async def drain(self):
        pass

    def write_buffer_size(self):
        return 0

    async def close(self):
        self.closed = True

    def reset(self):
        pass


def test_framing_round_trip_and_limits():
    async def main():
        p = _Pipe()
        write_message(p, {"x": b"y" * 100_000, "n": [1, 2]})
        write_message(p, "second")
        first = await read_message(p, 1 << 20)
        assert bytes(first["x"]) == b"y" * 100_000 and first["n"] == [1, 2]
        assert await read_message(p, 1 << 20) == "second"
        with pytest.raises(StreamClosed):
            await read_message(p, 1 << 20)  # clean EOF between messages
        write_message(p, b"z" * 5000)
        with pytest.raises(FrameTooLarge):
            await read_message(p, 1000)
        p.buf[:] = (10).to_bytes(4, "big") + b"abc"  # truncated body
        with pytest.raises(StreamClosed):
            await read_message(p, 1000)

    asyncio.run(main())
