"""The client side of libp2p AutoNAT v2 (libp2p/specs ``autonat/autonat-v2.md``), sans-IO.

:class:`Requests` is a node's table of the requests it has in flight, each with its own random
fixed64 nonce; a :class:`Request` follows one from our ``DialRequest`` to the :class:`Verdict` it
comes to. The glue (``actors/nat/autonat_client.py``) opens the stream, writes what the request
gives it, feeds it what the server sends, and hands every nonce that arrives on
``/libp2p/autonat/2/dial-back`` to :meth:`Requests.dial_back`.

What counts is what arrives, not what the server answers: a request proves an address reachable
only when a dial-back with its nonce came in on a connection the server opened, over the
transport of the address the server says it dialed. A ``DialResponse`` that says OK without it
is nothing. One that says the server could not connect (``E_DIAL_ERROR``) is a failed try, as a
try of our own servers' is: a lying server can at worst make us think we are private.

Bounds: at most :data:`MAX_PENDING` requests (so nonces) at once, :data:`MAX_ADDRS` addresses a
request, dial data only when a server asks for 30-100 kB (the spec's amplification guard), once
per request, and at most :data:`DIAL_DATA_PER_MINUTE` bytes of it for the whole node.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from lattica._budget import Buckets
from lattica._interfaces import ip_of, is_private_ip
from lattica._multiaddr import Multiaddr
from lattica.errors import ProtocolError
from lattica.nat import _autonat_v2_wire as v2

__all__ = [
    "MIN_DIAL_DATA",
    "MAX_DIAL_DATA",
    "DIAL_DATA_PER_MINUTE",
    "MAX_PENDING",
    "MAX_ADDRS",
    "Outcome",
    "Verdict",
    "Request",
    "Requests",
    "addrs_to_ask",
]

MIN_DIAL_DATA = 30_000  # bytes of dial data a server may ask for: the spec's 30-100 kB
MAX_DIAL_DATA = 100_000
DIAL_DATA_PER_MINUTE = 300_000  # bytes of dial data this node sends in a minute, to all servers
MAX_PENDING = 8  # requests in flight at once (each holds a nonce until it ends)
MAX_ADDRS = 8  # addresses in one request
_MAX_ARRIVALS = 4  # dial-backs kept per request (a server dials one address)
_CHUNK = v2.encode(v2.DialDataResponse(bytes(v2.MAX_DIAL_DATA)))  # one message of dial data, reused


class Outcome(enum.Enum):
    REACHED = "reached"  # a dial-back with our nonce arrived (whether it proves much is the caller's rule)
    FAILED = "failed"  # the server says it could not connect to the address
    NOTHING = "nothing"  # refused, abandoned, unanswered, or a claim without its dial-back


@dataclass(frozen=True)
class Verdict:
    """What one request came to."""

    outcome: Outcome
    addr: Multiaddr | None = None  # the address the server dialed (REACHED, FAILED)
    dialer_ip: str | None = None  # where the dial-back came from (REACHED)
    transport: str = ""  # "tcp" or "quic" (REACHED)
    reason: str = ""


def addrs_to_ask(cands: Iterable[Multiaddr], server_ip: str | None) -> tuple[Multiaddr, ...]:
    """Of our candidate addresses, those worth a request to a server at ``server_ip``: TCP or QUIC
    over IP, in order, at most :data:`MAX_ADDRS`; no private address unless the server is itself
    at a private address (on our LAN, where it can dial one; the spec's clients send none)."""
    lan = server_ip is not None and is_private_ip(server_ip)
    out: list[Multiaddr] = []
    for a in cands:
        a = a.without_peer_id()
        ip = ip_of(a)
        if v2.dialable(a) and ip is not None and (lan or not is_private_ip(ip)) and a not in out:
            out.append(a)
            if len(out) == MAX_ADDRS:
                break
    return tuple(out)


class Request:
    """One ``DialRequest`` on its own stream, from what we send to what it proves."""

    def __init__(self, owner: Requests, addrs: tuple[Multiaddr, ...], nonce: int) -> None:
        self._owner = owner
        self.addrs = addrs
        self.nonce = nonce
        self.response: v2.DialResponse | None = None
        self.data_for: int | None = None  # the address index the server asked dial data for
        self.arrivals: list[tuple[str, str | None]] = []  # (transport, dialer IP) of dial-backs with our nonce

    def opening(self) -> bytes:
        """The message that opens the stream: our ``DialRequest``."""
        return v2.encode(v2.DialRequest(self.addrs, self.nonce))

    @property
    def answered(self) -> bool:
        return self.response is not None

    def receive(self, msg: v2.Message) -> list[bytes]:
        """The messages to send for the server's ``msg`` (dial data, or nothing); ProtocolError
        when the request is to be abandoned (the stream reset): dial data asked twice, for an
        address we did not send, outside the spec's bound or beyond our budget; or a message a
        server does not send."""
        if self.response is not None:
            raise ProtocolError("an AutoNAT v2 server went on after its DialResponse")
        if isinstance(msg, v2.DialResponse):
            self.response = msg
            return []
        if not isinstance(msg, v2.DialDataRequest):
            raise ProtocolError(f"an AutoNAT v2 server sent a {type(msg).__name__}")
        if self.data_for is not None:
            raise ProtocolError("an AutoNAT v2 server asked for dial data twice")
        if msg.addr_idx >= len(self.addrs):
            raise ProtocolError(
                f"an AutoNAT v2 server asked for dial data for address {msg.addr_idx} of {len(self.addrs)}"
            )
        if not MIN_DIAL_DATA <= msg.num_bytes <= MAX_DIAL_DATA:
            raise ProtocolError(
                f"an AutoNAT v2 server asked for {msg.num_bytes} bytes of dial data "
                f"(we send {MIN_DIAL_DATA}-{MAX_DIAL_DATA}, the spec's bound)"
            )
        if not self._owner.spend(msg.num_bytes):
            raise ProtocolError(f"our dial data budget ({DIAL_DATA_PER_MINUTE} bytes a minute) is spent")
        self.data_for = msg.addr_idx
        full, rest = divmod(msg.num_bytes, v2.MAX_DIAL_DATA)
        return [_CHUNK] * full + ([v2.encode(v2.DialDataResponse(bytes(rest)))] if rest else [])

    def dialed(self) -> Multiaddr | None:
        """The address the server says it dialed, if its answer is one to believe anything of."""
        r = self.response
        if r is None or r.status != v2.ResponseStatus.OK or r.addr_idx >= len(self.addrs):
            return None
        if self.data_for is not None and self.data_for != r.addr_idx:
            return None  # (it asked dial data for one address and says it dialed another)
        return self.addrs[r.addr_idx]

    def awaits_dial_back(self) -> bool:
        """The server says it delivered our nonce and none has arrived yet (it may trail the answer)."""
        addr = self.dialed()
        return (
            addr is not None
            and self.response is not None
            and self.response.dial_status == v2.DialStatus.OK
            and self._arrived(addr) is None
        )

    def _arrived(self, addr: Multiaddr) -> tuple[str, str | None] | None:
        want = v2.transport_of(addr)
        return next((a for a in self.arrivals if a[0] == want), None)

    def verdict(self, failure: str | None = None) -> Verdict:
        if failure is not None:
            return Verdict(Outcome.NOTHING, reason=f"abandoned: {failure}")
        r = self.response
        if r is None:
            return Verdict(Outcome.NOTHING, reason="no answer")
        addr = self.dialed()
        if addr is None:
            why = r.status.name if r.status != v2.ResponseStatus.OK else "an answer that names no address of ours"
            return Verdict(Outcome.NOTHING, reason=f"the server did not check us ({why})")
        arrived = self._arrived(addr)
        if arrived is not None:
            return Verdict(Outcome.REACHED, addr, arrived[1], arrived[0], "its dial-back arrived")
        if r.dial_status == v2.DialStatus.E_DIAL_ERROR:
            return Verdict(Outcome.FAILED, addr, reason="the server could not connect")
        if r.dial_status == v2.DialStatus.OK:
            return Verdict(Outcome.NOTHING, addr, reason="the server says it dialed us back, but no dial-back came")
        return Verdict(Outcome.NOTHING, addr, reason=f"the server's dial ended in {r.dial_status.name}")


class Requests:
    """A node's AutoNAT v2 requests in flight (by nonce), and its dial data budget."""

    def __init__(
        self,
        clock: Callable[[], float] | None = None,
        max_pending: int = MAX_PENDING,
        data_per_minute: int = DIAL_DATA_PER_MINUTE,
        nonce: Callable[[], int] | None = None,
    ) -> None:
        self.max_pending = max_pending
        self._pending: dict[int, Request] = {}
        self._data = Buckets(data_per_minute / 60.0, data_per_minute, max_keys=1, clock=clock)
        self._nonce = nonce or (lambda: int.from_bytes(os.urandom(8), "little"))
        self.counts = {o.value: 0 for o in Outcome} | {
            "asked": 0,
            "unconfirmed": 0,  # answers that said OK with no dial-back behind them
            "dial_data": 0,  # bytes sent
            "stray": 0,  # dial-backs with a nonce not ours (or on a connection we dialed)
            "busy": 0,  # requests not made: too many in flight
        }

    def __len__(self) -> int:
        return len(self._pending)

    def start(self, addrs: tuple[Multiaddr, ...]) -> Request:
        """A new request for ``addrs`` (at most :data:`MAX_ADDRS`), with a fresh nonce;
        ProtocolError if there is nothing to ask or too many requests are in flight."""
        if not addrs:
            raise ProtocolError("no address of ours is worth asking this server about")
        if len(self._pending) >= self.max_pending:
            self.counts["busy"] += 1
            raise ProtocolError(f"{self.max_pending} AutoNAT v2 requests in flight already")
        nonce = self._nonce()
        while nonce in self._pending:
            nonce = self._nonce()
        req = self._pending[nonce] = Request(self, tuple(addrs[:MAX_ADDRS]), nonce)
        self.counts["asked"] += 1
        return req

    def spend(self, n: int) -> bool:
        """Charge ``n`` bytes of dial data to the node's budget; False (nothing charged) if spent."""
        if not self._data.take(None, n):
            return False
        self.counts["dial_data"] += n
        return True

    def dial_back(self, nonce: int, transport: str, dialer_ip: str | None, inbound: bool) -> bool:
        """A dial-back stream delivered ``nonce``: True if it is a request's of ours in flight and
        came on a connection the server opened (answer it OK), else False (reset the stream)."""
        req = self._pending.get(nonce)
        if req is None or not inbound or transport not in ("tcp", "quic"):
            self.counts["stray"] += 1
            return False
        if len(req.arrivals) < _MAX_ARRIVALS:
            req.arrivals.append((transport, dialer_ip))
        return True

    def finish(self, req: Request, failure: str | None = None) -> Verdict:
        """The request is over (answered, abandoned with ``failure``, or timed out): its nonce is
        forgotten (a dial-back after this counts for nothing) and its verdict returned."""
        if self._pending.get(req.nonce) is req:
            del self._pending[req.nonce]
        verdict = req.verdict(failure)
        self.counts[verdict.outcome.value] += 1
        if failure is None and req.awaits_dial_back():
            self.counts["unconfirmed"] += 1  # (it said it dialed us back; nothing came)
        return verdict
