"""The UDP side: ``Endpoint``, one socket routing datagrams to connections by connection ID, and
``QuicListener``."""

from __future__ import annotations

import asyncio
import errno as errno_mod
import ipaddress
import socket
import struct
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from lattica._interfaces import host_key, is_loopback_ip
from lattica._multiaddr import Multiaddr
from lattica.logging import get_logger
from lattica.transports.base import ConnectionHandler, Listener, Transport
from lattica.transports.quic import _aioquic
from lattica.transports.quic.connection import QuicConn
from lattica.transports.quic.wire import (
    CID_LEN,
    GSO_SEGMENTS,
    MAX_DATAGRAM,
    MIN_INITIAL,
    READ_BATCH,
    READ_BATCH_BYTES,
    RECV_SIZE,
    SUPPORTED_VERSIONS,
)

if TYPE_CHECKING:
    from lattica.transports.quic.transport import QuicTransport

log = get_logger("lattica.quic")

_UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)  # <linux/udp.h>; not every Python's socket module names it
# what a kernel says when it cannot segment this send (no GSO, or no checksum offload to do it in)
_NO_GSO = frozenset({errno_mod.EIO, errno_mod.EINVAL, errno_mod.ENOPROTOOPT, errno_mod.EOPNOTSUPP})


class _Datagrams(Protocol):
    """What the endpoint uses of its datagram transport (asyncio's and uvloop's both have it)."""

    def sendto(self, data: bytes, addr: tuple) -> None: ...
    def get_write_buffer_size(self) -> int: ...
    def close(self) -> None: ...


class Endpoint(asyncio.DatagramProtocol):
    """One UDP socket: routes datagrams to connections by destination CID, accepts Initials."""

    def __init__(self, owner: QuicTransport, sock: socket.socket) -> None:
        self.owner = owner
        self.sock = sock
        self.family = sock.family
        bound = sock.getsockname()
        self.bound_ip = ipaddress.ip_address(bound[0])
        self.local_maddr = Multiaddr.from_sockaddr(bound, "quic-v1")
        self.port: int = bound[1]
        self.loop = asyncio.get_running_loop()
        self.dgram: _Datagrams | None = None
        self.by_cid: dict[bytes, QuicConn] = {}
        self.members: set[QuicConn] = set()
        self.listener: QuicListener | None = None
        self.pending = 0  # inbound handshakes in progress
        self.pending_at: dict[str, int] = {}  # remote host (IPv4, IPv6 /64) -> its inbound handshakes
        self._slot: dict[QuicConn, str | None] = {}  # inbound handshakes -> the host they count for
        self.drops = 0
        # UDP GSO: a run of equal-size datagrams to one address leaves in one system call (the
        # kernel cuts it up); off where the kernel refuses it, found out at the first refusal
        self.gso = hasattr(socket, "SOL_UDP") and sock.type == socket.SOCK_DGRAM
        self.gso_sends = 0  # system calls that carried a run of datagrams
        self.paused = False
        self.closed = False
        self.close_when_idle = False
        self.on_punch: Callable[[bytes, tuple], None] | None = None  # hole punching: told of 0x00 datagrams

    # -- inbound handshake slots --------------------------------------------------------------

    def hold(self, conn: QuicConn, host: str | None) -> None:
        self.pending += 1
        self._slot[conn] = host
        if host is not None:
            self.pending_at[host] = self.pending_at.get(host, 0) + 1

    def release(self, conn: QuicConn) -> None:
        """An inbound handshake ended (verified, failed or timed out): its slots are free."""
        if conn not in self._slot:
            return
        host = self._slot.pop(conn)
        self.pending -= 1
        if host is not None:
            left = self.pending_at.pop(host) - 1
            if left:
                self.pending_at[host] = left

    # -- routing ----------------------------------------------------------------------------

    def register(self, conn: QuicConn, cid: bytes) -> None:
        self.by_cid[cid] = conn
        conn._cids.add(cid)
        self.members.add(conn)

    def unregister_cid(self, conn: QuicConn, cid: bytes) -> None:
        if self.by_cid.get(cid) is conn:
            del self.by_cid[cid]
        conn._cids.discard(cid)

    def forget(self, conn: QuicConn) -> None:
        for cid in conn._cids:
            if self.by_cid.get(cid) is conn:
                del self.by_cid[cid]
        conn._cids.clear()
        if conn in self.members:
            self.members.discard(conn)
            self.release(conn)
        if self.close_when_idle and not self.members:
            self.close()

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        """Route this datagram and whatever else is already queued on the socket.

        asyncio's selector loop delivers one datagram per loop iteration, and every delivery
        would cost a flush (aioquic's datagrams_to_send); draining the non-blocking socket here
        turns a burst into one batch, so a connection transmits once per batch.
        """
        self._route(data, addr)
        recvfrom = self.sock.recvfrom
        budget = READ_BATCH_BYTES - len(data)
        for _ in range(READ_BATCH):
            if budget <= 0:
                return
            try:
                data, addr = recvfrom(RECV_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # a pending ICMP error (IP_RECVERR) or a closed socket
                if not self.closed:
                    self.error_received(e)
                return
            budget -= len(data)
            self._route(data, addr)

    def _route(self, data: bytes, addr: tuple) -> None:
        """Hand one datagram to its connection; unparsable or unknown ones are dropped, counted."""
        try:
            b0 = data[0]
            if b0 == 0 and self.on_punch is not None:  # not QUIC (fixed bit clear): a punch probe
                self.on_punch(data, addr)
                return
            if not b0 & 0x80:  # short header: fixed bit, then our 8-byte CID
                conn = self.by_cid.get(data[1 : 1 + CID_LEN]) if b0 & 0x40 else None
                if conn is None:
                    self.drops += 1
                else:
                    conn._datagram(data, addr)
                return
            dcid, initial, version = _aioquic.long_header(data)
            conn = self.by_cid.get(dcid)
            if conn is not None:
                conn._datagram(data, addr)
            elif (
                initial
                and self.listener is not None
                and len(data) >= MIN_INITIAL
                and version in SUPPORTED_VERSIONS
                and len(dcid) >= 8
            ):
                self.listener._accept(data, addr, dcid)
            else:
                self.drops += 1
        except Exception:  # junk (IndexError, ValueError) or a bug: never raise into asyncio
            self.drops += 1

    def error_received(self, exc: Exception) -> None:
        """ICMP errors (IP_RECVERR): fail pending dials to the address that bounced."""
        try:
            bounced = self._read_error_queue()
        except Exception:
            log.debug("quic.error_queue_failed", exc=repr(exc), exc_info=True)
            return
        if bounced:
            # React on a later callback: aborting sends a datagram, and re-entering the
            # transport from inside its own error callback crashes uvloop 0.23 (segfault).
            self.loop.call_soon(self._bounced, bounced)

    def _bounced(self, bounced: list[tuple[tuple, int]]) -> None:
        for addr, err in bounced:
            for conn in list(self.members):
                if conn._peer_addr[:2] == addr[:2]:
                    conn._icmp_error(err)

    def _read_error_queue(self) -> list[tuple[tuple, int]]:
        out = []
        for _ in range(64):  # drain it, or level-triggered pollers spin on POLLERR
            try:
                _data, anc, _flags, addr = self.sock.recvmsg(1, 512, socket.MSG_ERRQUEUE)
            except (BlockingIOError, InterruptedError, AttributeError):
                break
            except OSError:
                break
            err = errno_mod.ECONNREFUSED
            for level, _type, payload in anc:
                if level in (socket.IPPROTO_IP, socket.IPPROTO_IPV6) and len(payload) >= 4:
                    err = struct.unpack_from("=I", payload)[0]  # sock_extended_err.ee_errno
            if addr:
                out.append((addr, err))
        return out

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        for conn in list(self.members):
            conn._schedule_flush()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.dgram = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for conn in list(self.members):
            conn.abort("UDP socket closed")

    def sendto(self, data: bytes, addr: tuple) -> None:
        if self.dgram is not None and not self.closed:
            self.dgram.sendto(data, addr)

    def send_datagrams(self, datagrams: list[tuple[bytes, tuple]]) -> int:
        """Send ``datagrams`` in order; the bytes they hold. A run of equal-size datagrams to one
        address (its last may be shorter) goes out as one UDP GSO send of up to ``GSO_SEGMENTS``
        datagrams: one system call in place of one per datagram (docs/benchmarks.md, "UDP GSO,
        the first lever taken")."""
        total = 0
        run: list[bytes] = []
        to: tuple = ()
        size = held = 0
        for data, addr in datagrams:
            n = len(data)
            total += n
            if run and (addr != to or n > size or len(run) >= GSO_SEGMENTS or held + n > MAX_DATAGRAM):
                self._send_run(run, to, size)
                run = []
            if not run:
                to, size, held = addr, n, 0
            run.append(data)
            held += n
            if n < size:  # a short datagram ends a run
                self._send_run(run, to, size)
                run = []
        if run:
            self._send_run(run, to, size)
        return total

    def _send_run(self, run: list[bytes], addr: tuple, size: int) -> None:
        dgram = self.dgram
        if len(run) > 1 and self.gso and dgram is not None and not self.closed and not dgram.get_write_buffer_size():
            try:
                self.sock.sendmsg(
                    [b"".join(run)], [(socket.SOL_UDP, _UDP_SEGMENT, size.to_bytes(2, sys.byteorder))], 0, addr
                )
                self.gso_sends += 1
                return
            except (BlockingIOError, InterruptedError):
                pass  # the socket's buffer is full: the transport queues them
            except OSError as e:
                if e.errno not in _NO_GSO:
                    # as the transport does with a failed send: the datagrams are lost, QUIC sends again
                    self.error_received(e)
                    return
                self.gso = False
                log.debug("quic.gso_refused", error=str(e))
        for data in run:  # one by one (behind datagrams the transport still holds: queued after them, in order)
            self.sendto(data, addr)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for conn in list(self.members):
                conn.abort("endpoint closed")
            if self.dgram is not None:
                self.dgram.close()
            self.owner._endpoints.discard(self)


class QuicListener(Listener):
    """A listening UDP endpoint; closing it stops accepting, live connections keep the socket."""

    def __init__(self, endpoint: Endpoint, on_connection: ConnectionHandler) -> None:
        self._endpoint = endpoint
        self._on_connection = on_connection
        self.addrs = [endpoint.local_maddr]

    def _accept(self, data: bytes, addr: tuple, dcid: bytes) -> None:
        ep = self._endpoint
        owner = ep.owner
        host = None if is_loopback_ip(addr[0]) else host_key(addr[0])  # (a local peer is the machine's own)
        if ep.pending >= owner.max_pending_handshakes or (
            host is not None and ep.pending_at.get(host, 0) >= owner.max_handshakes_per_ip
        ):
            ep.drops += 1
            return
        quic = owner._new_quic(is_client=False, peer_addr=addr, odcid=dcid)
        conn = QuicConn(owner, ep, quic, addr, "inbound", None, on_verified=self._verified)
        ep.register(conn, dcid)
        ep.register(conn, quic.host_cid)
        ep.hold(conn, host)
        conn._datagram(data, addr)
        if quic.nothing_decrypted():  # a garbled Initial: no state kept
            ep.drops += 1
            conn._teardown()
            return
        owner.note_dialed_in(addr[0])

    def _verified(self, conn: QuicConn) -> None:
        self._endpoint.release(conn)
        if self._endpoint.listener is not self:
            conn.abort("listener closed")
            return
        Transport._hand_over(conn, self._on_connection)

    async def close(self) -> None:
        ep = self._endpoint
        if ep.listener is not self:
            return
        ep.listener = None
        for conn in list(ep.members):
            if conn.direction == "inbound" and not conn._established:
                conn.abort("listener closed")
        ep.owner._listen_eps.discard(ep)
        if ep.members:
            ep.close_when_idle = True  # established connections keep using the socket
        else:
            ep.close()
