"""multistream-select 1.0, sans-IO (transports/multistream.py): the wire bytes, pipelined
proposals, refusals, listings, and what a hostile peer can and cannot make it do."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lattica.errors import ProtocolError
from lattica.transports.multistream import (
    HEADER,
    MAX_LISTINGS,
    MAX_MESSAGE,
    MAX_PROPOSALS,
    Agreed,
    Dialer,
    Listed,
    Listener,
    Refused,
    encode,
    encode_listing,
)

SUPPORTED = ("/noise", "/yamux/1.0.0", "/ipfs/ping/1.0.0")


def _listener() -> Listener:
    return Listener(lambda p: p in SUPPORTED, lambda: SUPPORTED)


def _events(side) -> list:
    out = []
    while (e := side.next_event()) is not None:
        out.append(e)
    return out


def test_messages_on_the_wire_are_the_ones_the_spec_shows():
    assert encode(HEADER) == b"\x13/multistream/1.0.0\n"
    assert encode("na") == bytes.fromhex("036e610a")
    assert encode("ls") == bytes.fromhex("036c730a")
    # ls answer: one message wrapping each protocol as a message, then a newline
    assert encode_listing(["/a", "/bc"]) == b"\x0a" + b"\x03/a\n" + b"\x04/bc\n" + b"\n"


def test_a_single_proposal_travels_with_its_first_data_and_the_listener_hands_the_data_on():
    d = Dialer(["/ipfs/ping/1.0.0"])
    assert d.lazy
    first = d.data_to_send() + b"32 bytes of ping payload........"
    lst = _listener()
    lst.receive(first)
    assert _events(lst) == [Agreed("/ipfs/ping/1.0.0", b"32 bytes of ping payload........")]
    answer = lst.data_to_send()
    assert answer == encode(HEADER) + encode("/ipfs/ping/1.0.0")
    d.receive(answer + b"echo")
    assert _events(d) == [Agreed("/ipfs/ping/1.0.0", b"echo")]
    assert d.done and lst.done


def test_proposals_go_one_after_another_until_one_is_agreed():
    d = Dialer(["/tls/1.0.0", "/noise"])
    assert not d.lazy
    lst = _listener()
    lst.receive(d.data_to_send())
    assert _events(lst) == [] and lst.data_to_send() == encode(HEADER) + encode("na")
    d.receive(encode(HEADER) + encode("na"))
    assert _events(d) == []
    lst.receive(d.data_to_send())
    assert _events(lst) == [Agreed("/noise", b"")]
    d.receive(lst.data_to_send())
    assert _events(d) == [Agreed("/noise", b"")]


def test_a_protocol_nobody_speaks_is_refused_cleanly():
    d = Dialer(["/lattica/unknown/1"])
    lst = _listener()
    lst.receive(d.data_to_send() + b"data the dialer sent at once")
    assert not lst.done and _events(lst) == []
    d.receive(lst.data_to_send())
    assert _events(d) == [Refused(("/lattica/unknown/1",))] and d.done


def test_ls_is_answered_with_the_listeners_protocols():
    d = Dialer(["/yamux/1.0.0"], ask_listing=True)
    assert not d.lazy
    lst = _listener()
    lst.receive(d.data_to_send())
    d.receive(lst.data_to_send())
    assert _events(d) == [Listed(SUPPORTED), Agreed("/yamux/1.0.0", b"")]


def test_bytes_may_arrive_one_at_a_time():
    d = Dialer(["/noise"])
    lst = _listener()
    for b in d.data_to_send():
        lst.receive(bytes([b]))
    assert _events(lst) == [Agreed("/noise", b"")]
    answer = lst.data_to_send()
    for b in answer:
        d.receive(bytes([b]))
    assert _events(d) == [Agreed("/noise", b"")]


@pytest.mark.parametrize(
    "wire, why",
    [
        (b"\x05hello", "not the header"),
        (encode("/other/1.0.0"), "not the header"),
        (b"\x13/multistream/1.0.0X", "no newline"),
        (b"\xff\xff\xff\x01", "varint"),
        (bytes([0x80 | (MAX_MESSAGE + 1) & 0x7F, (MAX_MESSAGE + 1) >> 7]), "too long"),
        (encode(HEADER) + b"\x03\xff\xfe\n", "not UTF-8"),
    ],
)
def test_malformed_messages_are_protocol_errors(wire, why):
    with pytest.raises(ProtocolError):
        _listener().receive(wire)


def test_a_dialer_that_proposes_forever_is_cut_off():
    lst = _listener()
    lst.receive(encode(HEADER))
    with pytest.raises(ProtocolError, match="proposals"):
        for i in range(MAX_PROPOSALS + 1):
            lst.receive(encode(f"/nope/{i}"))
    assert lst.data_to_send().count(encode("na")) == MAX_PROPOSALS - 1


def test_ls_floods_are_cut_off():
    lst = _listener()
    with pytest.raises(ProtocolError, match="listings"):
        lst.receive(encode(HEADER) + encode("ls") * (MAX_LISTINGS + 1))


def test_a_listener_answer_that_is_neither_echo_nor_na_is_an_error():
    d = Dialer(["/noise"])
    with pytest.raises(ProtocolError):
        d.receive(encode(HEADER) + encode("/yamux/1.0.0"))


def test_feeding_after_the_end_is_an_error():
    lst = _listener()
    lst.receive(Dialer(["/noise"]).data_to_send())
    with pytest.raises(ProtocolError):
        lst.receive(b"more")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise_anything_but_protocol_errors(data):
    lst = _listener()
    try:
        lst.receive(encode(HEADER) + data)
    except ProtocolError:
        pass
    assert len(lst.data_to_send()) <= 4 * MAX_MESSAGE * (MAX_PROPOSALS + MAX_LISTINGS)
