"""AutoNAT v1's client state, sans-IO (lattica/nat/_autonat_v1_client.py): the Dial carries our id
and the addresses asked about; an OK is believed only with a connection from the server's IP
over the named address's transport, and only for an address we asked about; E_DIAL_ERROR is a
failed try; refusals, lies and malformed turns prove nothing."""

from __future__ import annotations

import pytest

from lattica._multiaddr import Multiaddr
from lattica.errors import ProtocolError
from lattica.nat import _autonat_v1_wire as v1
from lattica.nat._autonat_v1_client import V1Request
from lattica.nat._autonat_v2_client import Outcome

TCP = Multiaddr("/ip4/203.0.113.5/tcp/4001")
QUIC = Multiaddr("/ip4/203.0.113.5/udp/4001/quic-v1")
SERVER = "198.51.100.9"
ME = b"\x00\x24" + bytes(36)


def _ok(addr: Multiaddr | None) -> v1.DialResponse:
    return v1.DialResponse(v1.Status.OK, addr=addr)


def test_the_dial_names_us_and_the_addresses_asked_about() -> None:
    req = V1Request(ME, (TCP.encapsulate("/p2p/12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo"), QUIC), SERVER)
    msg = v1.decode(req.opening())
    assert isinstance(msg, v1.Dial)
    assert msg.peer_id == ME and msg.addrs == (TCP, QUIC)  # (our id is in the message, not in each address)


def test_nothing_to_ask_about_is_an_error() -> None:
    with pytest.raises(ProtocolError):
        V1Request(ME, (), SERVER)


def test_an_ok_with_a_connection_from_the_server_is_reached() -> None:
    req = V1Request(ME, (TCP,), SERVER)
    req.receive(_ok(TCP))
    assert req.awaits_dial_back()
    assert req.dialed_in("tcp", SERVER)
    assert not req.awaits_dial_back()
    v = req.verdict()
    assert (v.outcome, v.addr, v.dialer_ip, v.transport) == (Outcome.REACHED, TCP, SERVER, "tcp")


@pytest.mark.parametrize(
    ("transport", "ip"),
    [
        ("tcp", "198.51.100.77"),  # another host's dial
        ("quic", SERVER),  # over the other transport than the address named
        ("memory", SERVER),  # not a direct connection
    ],
)
def test_an_ok_without_its_dial_back_is_nothing(transport: str, ip: str) -> None:
    req = V1Request(ME, (TCP,), SERVER)
    req.dialed_in(transport, ip)
    req.receive(_ok(TCP))
    v = req.verdict()
    assert v.outcome == Outcome.NOTHING and "no connection came" in v.reason


def test_an_ok_naming_an_address_we_did_not_ask_about_is_nothing() -> None:
    req = V1Request(ME, (TCP,), SERVER)
    req.dialed_in("tcp", SERVER)
    req.receive(_ok(Multiaddr("/ip4/192.0.2.66/tcp/80")))  # (we would advertise it if believed)
    assert not req.awaits_dial_back()
    assert req.verdict().outcome == Outcome.NOTHING
    req = V1Request(ME, (TCP,), SERVER)
    req.receive(_ok(None))
    assert req.verdict().outcome == Outcome.NOTHING


def test_a_dial_error_is_a_failed_try_of_the_address_asked_about() -> None:
    req = V1Request(ME, (QUIC,), SERVER)
    req.receive(v1.DialResponse(v1.Status.E_DIAL_ERROR, "dial failed"))
    v = req.verdict()
    assert (v.outcome, v.addr) == (Outcome.FAILED, QUIC) and "dial failed" in v.reason


@pytest.mark.parametrize("status", [v1.Status.E_DIAL_REFUSED, v1.Status.E_BAD_REQUEST, v1.Status.E_INTERNAL_ERROR])
def test_a_refusal_proves_nothing(status: v1.Status) -> None:
    req = V1Request(ME, (TCP,), SERVER)
    req.receive(v1.DialResponse(status, "no"))
    assert req.verdict().outcome == Outcome.NOTHING


def test_a_second_message_or_a_dial_from_the_server_is_refused() -> None:
    req = V1Request(ME, (TCP,), SERVER)
    with pytest.raises(ProtocolError):
        req.receive(v1.Dial(ME, (TCP,)))
    req.receive(_ok(TCP))
    with pytest.raises(ProtocolError):
        req.receive(_ok(TCP))


def test_no_answer_or_an_abandoned_request_is_nothing() -> None:
    req = V1Request(ME, (TCP,), SERVER)
    assert req.verdict().outcome == Outcome.NOTHING
    assert req.verdict("timeout").outcome == Outcome.NOTHING


def test_arrivals_kept_per_request_are_bounded() -> None:
    req = V1Request(ME, (TCP,), SERVER)
    for _ in range(100):
        req.dialed_in("tcp", SERVER)
    assert len(req.arrivals) <= 4
