"""AutoNAT v2's client state, sans-IO (lattica/nat/_autonat_v2_client.py): dial data sent only
within the spec's bound, once, and within the node's budget; a dial-back counts only with a nonce
of a request in flight, on a connection the server opened, over the transport of the address it
names; a DialResponse without its dial-back counts as nothing."""

from __future__ import annotations

import pytest

from lattica._multiaddr import Multiaddr
from lattica.errors import ProtocolError
from lattica.nat import _autonat_v2_wire as w
from lattica.nat._autonat_v2_client import (
    DIAL_DATA_PER_MINUTE,
    MAX_PENDING,
    Outcome,
    Requests,
    addrs_to_ask,
)

TCP = Multiaddr("/ip4/203.0.113.5/tcp/4001")
QUIC = Multiaddr("/ip4/203.0.113.5/udp/4001/quic-v1")
SERVER = "198.51.100.9"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ok(idx: int = 0, dial: w.DialStatus = w.DialStatus.OK) -> w.DialResponse:
    return w.DialResponse(w.ResponseStatus.OK, idx, dial)


def test_the_request_carries_our_addresses_and_a_nonce_of_its_own() -> None:
    reqs = Requests()
    a, b = reqs.start((TCP, QUIC)), reqs.start((TCP,))
    assert a.nonce != b.nonce and len(reqs) == 2
    assert w.decode(a.opening()) == w.DialRequest((TCP, QUIC), a.nonce)


def test_dial_data_within_the_bound_is_sent_in_chunks_of_4_kib() -> None:
    reqs = Requests()
    req = reqs.start((TCP,))
    out = req.receive(w.DialDataRequest(0, 40_000))
    msgs = [w.decode(m) for m in out]
    assert all(isinstance(m, w.DialDataResponse) and len(m.data) <= 4096 for m in msgs)
    assert sum(len(m.data) for m in msgs if isinstance(m, w.DialDataResponse)) == 40_000
    assert reqs.counts["dial_data"] == 40_000
    assert req.receive(_ok()) == [] and req.answered


@pytest.mark.parametrize(
    "ask",
    [
        w.DialDataRequest(0, 10_000_000),  # 10 MB
        w.DialDataRequest(0, 100_001),  # just past the spec's 100 kB
        w.DialDataRequest(0, 29_999),  # below its 30 kB
        w.DialDataRequest(1, 40_000),  # for an address we did not send
    ],
)
def test_dial_data_outside_the_bound_abandons_the_request(ask) -> None:
    reqs = Requests()
    req = reqs.start((TCP,))
    with pytest.raises(ProtocolError):
        req.receive(ask)
    assert reqs.counts["dial_data"] == 0
    assert reqs.finish(req, "refused").outcome == Outcome.NOTHING and len(reqs) == 0


def test_dial_data_is_sent_once_per_request() -> None:
    req = Requests().start((TCP,))
    req.receive(w.DialDataRequest(0, 30_000))
    with pytest.raises(ProtocolError, match="twice"):
        req.receive(w.DialDataRequest(0, 30_000))


def test_dial_data_stays_within_the_nodes_budget_a_minute() -> None:
    clock = Clock()
    reqs = Requests(clock=clock)
    sent = 0
    for _ in range(DIAL_DATA_PER_MINUTE // 100_000):
        req = reqs.start((TCP,))
        sent += sum(len(m) for m in req.receive(w.DialDataRequest(0, 100_000)))
        reqs.finish(req)
    req = reqs.start((TCP,))
    with pytest.raises(ProtocolError, match="budget"):
        req.receive(w.DialDataRequest(0, 100_000))
    reqs.finish(req, "budget")
    assert reqs.counts["dial_data"] == DIAL_DATA_PER_MINUTE
    clock.now += 60.0  # a minute later, the budget is back
    assert reqs.start((TCP,)).receive(w.DialDataRequest(0, 100_000))


def test_a_dial_back_with_our_nonce_and_the_servers_ok_reach_us() -> None:
    reqs = Requests()
    req = reqs.start((TCP, QUIC))
    assert reqs.dial_back(req.nonce, "quic", SERVER, inbound=True)
    req.receive(_ok(1))
    v = reqs.finish(req)
    assert (v.outcome, v.addr, v.dialer_ip, v.transport) == (Outcome.REACHED, QUIC, SERVER, "quic")
    assert reqs.counts["reached"] == 1


@pytest.mark.parametrize(
    "nonce_delta, transport, inbound",
    [
        (1, "tcp", True),  # another nonce
        (0, "tcp", False),  # on a connection we dialed (the one we asked over, say)
        (0, "memory", True),  # not over the network
    ],
)
def test_a_dial_back_that_is_not_ours_is_refused(nonce_delta: int, transport: str, inbound: bool) -> None:
    reqs = Requests()
    req = reqs.start((TCP,))
    assert not reqs.dial_back((req.nonce + nonce_delta) % 2**64, transport, SERVER, inbound)
    req.receive(_ok())
    assert reqs.finish(req).outcome == Outcome.NOTHING
    assert reqs.counts["stray"] == 1 and reqs.counts["unconfirmed"] == 1


def test_a_dial_response_without_our_dial_back_counts_as_nothing() -> None:
    reqs = Requests()
    req = reqs.start((TCP,))
    req.receive(_ok())
    assert req.awaits_dial_back()
    v = reqs.finish(req)
    assert v.outcome == Outcome.NOTHING and "no dial-back" in v.reason
    assert reqs.counts["unconfirmed"] == 1 and reqs.counts["reached"] == 0


def test_a_dial_back_over_another_transport_than_the_address_named_counts_as_nothing() -> None:
    reqs = Requests()
    req = reqs.start((TCP, QUIC))
    reqs.dial_back(req.nonce, "quic", SERVER, inbound=True)
    req.receive(_ok(0))  # it names the TCP address; the nonce came over QUIC
    assert reqs.finish(req).outcome == Outcome.NOTHING


def test_a_dial_back_after_the_request_ended_is_refused() -> None:
    reqs = Requests()
    req = reqs.start((TCP,))
    req.receive(_ok())
    reqs.finish(req)
    assert not reqs.dial_back(req.nonce, "tcp", SERVER, inbound=True)


def test_a_server_that_could_not_connect_tried_and_failed() -> None:
    reqs = Requests()
    req = reqs.start((TCP,))
    req.receive(_ok(0, w.DialStatus.E_DIAL_ERROR))
    v = reqs.finish(req)
    assert (v.outcome, v.addr) == (Outcome.FAILED, TCP)


@pytest.mark.parametrize(
    "answer",
    [
        w.DialResponse(w.ResponseStatus.E_DIAL_REFUSED),
        w.DialResponse(w.ResponseStatus.E_REQUEST_REJECTED),
        w.DialResponse(w.ResponseStatus.E_INTERNAL_ERROR),
        _ok(3),  # an index past what we sent
        _ok(0, w.DialStatus.E_DIAL_BACK_ERROR),  # it connected, it says, but could not send the nonce
    ],
)
def test_refusals_and_answers_that_prove_nothing_count_as_nothing(answer) -> None:
    reqs = Requests()
    req = reqs.start((TCP,))
    req.receive(answer)
    assert reqs.finish(req).outcome == Outcome.NOTHING


def test_a_dial_back_that_arrived_counts_whatever_the_server_says_of_it() -> None:
    reqs = Requests()
    req = reqs.start((TCP,))
    reqs.dial_back(req.nonce, "tcp", SERVER, inbound=True)
    req.receive(_ok(0, w.DialStatus.E_DIAL_BACK_ERROR))
    assert reqs.finish(req).outcome == Outcome.REACHED


def test_a_server_that_dials_another_address_than_it_was_paid_for_counts_as_nothing() -> None:
    reqs = Requests()
    req = reqs.start((TCP, QUIC))
    req.receive(w.DialDataRequest(0, 30_000))
    reqs.dial_back(req.nonce, "quic", SERVER, inbound=True)
    req.receive(_ok(1))
    assert reqs.finish(req).outcome == Outcome.NOTHING


@pytest.mark.parametrize("msg", [w.DialRequest((TCP,), 1), w.DialDataResponse(b"x")])
def test_messages_a_server_does_not_send_abandon_the_request(msg) -> None:
    with pytest.raises(ProtocolError):
        Requests().start((TCP,)).receive(msg)


def test_nothing_after_the_dial_response() -> None:
    req = Requests().start((TCP,))
    req.receive(_ok())
    with pytest.raises(ProtocolError):
        req.receive(w.DialDataRequest(0, 30_000))


def test_requests_in_flight_are_bounded() -> None:
    reqs = Requests()
    held = [reqs.start((TCP,)) for _ in range(MAX_PENDING)]
    with pytest.raises(ProtocolError, match="in flight"):
        reqs.start((TCP,))
    reqs.finish(held[0], "timeout")
    reqs.start((TCP,))
    with pytest.raises(ProtocolError, match="no address"):
        Requests().start(())


def test_which_addresses_are_worth_asking_about() -> None:
    lan = Multiaddr("/ip4/192.168.1.5/tcp/4001")
    circuit = Multiaddr("/ip4/203.0.113.9/tcp/1/p2p/12D3KooWHHzSeKaY8xuZVzkLbKFfvNgPPeKhFBGrMbNzbm5akpqu/p2p-circuit")
    named = Multiaddr("/dns4/example.com/tcp/4001")
    cands = [lan, circuit, named, TCP, TCP, QUIC]
    assert addrs_to_ask(cands, SERVER) == (TCP, QUIC)  # (the spec's clients send no private address)
    assert addrs_to_ask(cands, "192.168.1.1") == (lan, TCP, QUIC)  # (a server on our LAN can dial it)
    many = [Multiaddr(f"/ip4/203.0.113.{i}/tcp/1") for i in range(20)]
    assert len(addrs_to_ask(many, SERVER)) == 8
