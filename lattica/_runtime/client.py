"""The caller's side of calls: pending calls, the gate a thread waits at for mailbox room, call
channels to a peer (or to this node) and how their frames are written."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from lattica import _rpc as rpc
from lattica import codec
from lattica._future import Future
from lattica._identity import PeerId
from lattica._runtime import spill
from lattica._runtime.limits import CHANNEL_HIGH_WATER, IDENTIFY_WAIT, MAX_MESSAGE
from lattica._runtime.local import Invocation, Sink
from lattica._runtime.partials import BudgetedSplitter, PartialMessages
from lattica.errors import (
    LatticaError,
    MailboxFull,
    NodeClosed,
    PeerUnreachable,
    ProtocolError,
    UnsupportedProtocol,
)
from lattica.logging import get_logger
from lattica.transports.base import Connection, Stream

if TYPE_CHECKING:
    from lattica._hostview import HostView
    from lattica._runtime.local import LocalActor
    from lattica._runtime.refs import ActorRef
    from lattica._runtime.spilling import Spills

log = get_logger("lattica.runtime")


class CallRouter(Protocol):
    """What the channels need of the runtime (``Runtime`` in ``registry`` implements it): where
    a call's outcome goes, how a call whose path broke is followed or re-sent, and the node's
    actors, loop and host."""

    peer_id: PeerId
    loop: asyncio.AbstractEventLoop
    actors: dict[str, LocalActor]
    channel_idle: float
    partials: PartialMessages
    spills: Spills

    @property
    def host(self) -> HostView:
        """The node's host (read-only here, so a runtime holding a ``Host`` implements it)."""

    def complete_call(self, p: Pending, value: Any, error: tuple | None, end: bool = False) -> None:
        """A reply (value, error or a stream's end) for ``p`` arrived."""

    def fail_call(self, p: Pending, error: BaseException, cancel_local: bool = False) -> None:
        """``p`` failed with ``error`` (and, local, its invocation is cancelled if asked)."""

    def follow(self, p: Pending, error: BaseException, delivered: bool) -> bool:
        """Through a stable ref, send ``p`` on to its actor's next incarnation; False: fail it."""

    def resend(self, p: Pending, error: BaseException) -> bool:
        """Send an idempotent ``p`` once more over the next path; False: fail it."""

    def drop_channel(self, ch: Channel, error: LatticaError) -> None:
        """Forget ``ch`` and fail every call on it with ``error``."""

    def retire_channel(self, ch: RemoteChannel) -> None:
        """``ch`` moved to another connection and has nothing left in flight: close it."""

    def on_reply(self, ch: RemoteChannel, msg: list, size: int = 0) -> None:
        """A reply message arrived on ``ch`` (``size``: its encoded bytes)."""

    def local_arg_streams(self, inv: Invocation, p: Pending) -> None:
        """Start feeding a local call's argument streams."""


class Pending:
    """A call we made that has not finished."""

    __slots__ = (
        "cid",
        "ref",
        "msg",
        "future",
        "stream",
        "channel",
        "timer",
        "stream_args",
        "arg_state",
        "encoded",
        "gate",
        "created",
        "follow_until",
        "idempotent",
        "delivered",
    )

    def __init__(self, cid: int, ref: ActorRef, msg: rpc.CallMsg, future: Future | None, stream: Any) -> None:
        self.cid = cid
        self.ref = ref
        self.msg = msg
        self.future = future
        self.stream = stream
        self.channel: Channel | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.stream_args: dict[int, Any] | None = None  # client-streamed arguments by index
        self.arg_state: dict[int, list] | None = None  # per streamed argument: [credit, waiter, items' encoded size]
        self.encoded: list | None = None  # the CALL already encoded (calls made on other threads)
        self.gate: Gate | None = None  # the calling thread's gate slot, freed once the call is sent
        self.created = time.monotonic()  # the loop clock: deadlines travel as time remaining
        self.follow_until: float | None = None  # through a stable ref: re-sent until then while undelivered
        self.idempotent = False  # safe to run twice: re-sent to the next incarnation even if delivered
        self.delivered = False  # something came back for it: the callee has it (order is kept)

    def stamp(self) -> None:
        """Just before sending: the timeout becomes what is left of it (it may have waited)."""
        timeout = self.msg.timeout
        if timeout is not None:
            waited = time.monotonic() - self.created
            if waited > 0.001:
                self.msg.timeout = max(0.0, timeout - waited)
                self.encoded = None  # encode again with the shorter timeout

    def ungate(self) -> None:
        g, self.gate = self.gate, None
        if g is not None:
            g.release()


class Gate:
    """Backpressure for calls made on plain threads: at most ``window`` of them per actor may be
    waiting to be sent; the next caller blocks (or gets MailboxFull with ``block=False``)."""

    __slots__ = ("cond", "count")

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.count = 0

    def acquire(self, window: int, block: bool, name: str, alive: Callable[[], bool]) -> None:
        with self.cond:
            while self.count >= window:
                if not block:
                    raise MailboxFull(f"{window} calls to {name!r} already wait to be sent")
                if not alive():
                    raise NodeClosed("the node stopped while this call waited for room")
                self.cond.wait(0.5)
            self.count += 1

    def release(self) -> None:
        with self.cond:
            self.count -= 1
            self.cond.notify()


def call_finished(p: Pending) -> bool:
    """The caller no longer waits for this call (its future or stream already ended)."""
    if p.future is not None:
        return p.future.done()
    return p.stream is not None and p.stream._done


class _Outbox:
    """Calls from this node to one actor: credit left, and the calls waiting for it, in order."""

    __slots__ = ("credit", "queue", "window", "draining")

    def __init__(self, window: int) -> None:
        self.credit = window
        self.window = window
        self.queue: collections.deque[Pending] = collections.deque()
        self.draining = False


class Channel:
    """Calls from this node to one peer (remote) or to itself (local, no encoding)."""

    def __init__(self, runtime: CallRouter, peer: PeerId) -> None:
        self.runtime = runtime
        self.peer = peer
        self.outboxes: dict[str, _Outbox] = {}
        self.pending: dict[int, Pending] = {}
        self.closed: LatticaError | None = None

    def outbox(self, ref: ActorRef) -> _Outbox:
        ob = self.outboxes.get(ref.name)
        if ob is None:
            ob = self.outboxes[ref.name] = _Outbox(ref.window)
        return ob

    def submit(self, p: Pending, block: bool) -> None:
        if self.closed is not None:
            self.runtime.fail_call(p, self.closed)
            return
        ob = self.outbox(p.ref)
        if ob.credit > 0 and not ob.queue and not self.congested() and not self.held(p.ref.name):
            ob.credit -= 1
            self._send_call(p)
            return
        if not block:
            raise MailboxFull(f"actor {p.ref.name!r} has no room for another call from this node (window {ob.window})")
        if len(ob.queue) >= 16 * ob.window:
            raise MailboxFull(
                f"{len(ob.queue)} calls to {p.ref.name!r} already wait for room; await earlier results first"
            )
        ob.queue.append(p)

    def congested(self) -> bool:
        return False

    def held(self, actor: str) -> bool:
        """Calls to ``actor`` must wait: earlier ones are still on their way on another path."""
        return False

    def returned(self, actor: str, n: int = 1) -> None:
        """``n`` calls to ``actor`` finished: spend the credit on waiting calls, in order."""
        self.refill(actor, n)

    def refill(self, actor: str, n: int) -> None:
        """Add ``n`` credit for ``actor`` and send the calls waiting for it, in order."""
        ob = self.outboxes.get(actor)
        if ob is None:
            return
        ob.credit += n
        if ob.draining or self.closed is not None:
            return  # the loop below (further up this stack) spends it; a closed channel sends nothing
        ob.draining = True  # a call that completes at once re-enters here: no recursion
        try:
            while ob.queue and ob.credit > 0 and not self.congested() and not self.held(actor):
                p = ob.queue.popleft()
                if call_finished(p):
                    p.ungate()
                    continue  # cancelled or timed out while waiting
                ob.credit -= 1
                try:
                    self._send_call(p)
                except LatticaError as e:
                    self.runtime.fail_call(p, e)
        finally:
            ob.draining = False

    def _send_call(self, p: Pending) -> None:
        raise NotImplementedError

    def delivered(self, actor: str, n: int = 1) -> None:
        """The callee acknowledged ``n`` calls or tells to ``actor`` sent here (or we gave them up)."""

    def fail_all(self, error: LatticaError) -> None:
        self.closed = error  # from now on nothing is sent: returned() stops releasing calls
        rt = self.runtime
        for ob in self.outboxes.values():
            while ob.queue:
                p = ob.queue.popleft()
                if not rt.follow(p, error, delivered=False) and not rt.resend(p, error):
                    rt.fail_call(p, error)
        sent = getattr(self, "stream", True) is not None  # (a channel that never opened sent nothing)
        while self.pending:
            p = self.pending.popitem()[1]
            if not rt.follow(p, error, delivered=sent) and not rt.resend(p, error):
                rt.fail_call(p, error)


class _LocalSink(Sink):
    __slots__ = ("runtime", "p")

    def __init__(self, runtime: CallRouter, p: Pending) -> None:
        self.runtime = runtime
        self.p = p

    def ok(self, value: Any) -> None:
        self.runtime.complete_call(self.p, value, None)

    def err(self, kind: str, type_name: str, message: str, tb: str = "") -> None:
        self.runtime.complete_call(self.p, None, (kind, type_name, message, tb))

    def item(self, value: Any) -> int:
        self.p.stream._push(value)
        return 0

    def end(self) -> None:
        self.runtime.complete_call(self.p, None, None, end=True)


class LocalChannel(Channel):
    """Calls to actors on this node: same credit rules, objects passed by reference."""

    def _send_call(self, p: Pending) -> None:
        p.ungate()
        p.stamp()
        rt = self.runtime
        _, cid, actor_name, method, args, kwargs, timeout, flags = p.msg
        actor = rt.actors.get(actor_name)
        self.pending[cid] = p
        p.channel = self
        sink = _LocalSink(rt, p)
        if actor is None:
            sink.err(rpc.E_NOT_FOUND, "ActorNotFound", f"no actor named {actor_name!r} on this node")
            return
        deadline = rt.loop.time() + timeout if timeout is not None else None
        inv = Invocation(
            actor, method, args, kwargs, deadline, sink, streaming=bool(flags & rpc.F_STREAM), caller=rt.peer_id
        )
        if p.stream is not None:
            p.stream._bind(lambda n, taken: actor.grant(inv, n, taken), lambda: actor.cancel(inv))
        if flags & rpc.F_ARGSTREAM:
            rt.local_arg_streams(inv, p)
        if p.future is not None:
            p.future._cancel_hook = lambda: actor.cancel(inv)
        actor.dispatch(inv)


class RemoteChannel(Channel):
    """Calls to one peer over its ``/lattica/rpc/2`` stream (``/lattica/rpc/1`` with a peer that
    does not serve it: its grants cannot say what was taken, and streams' windows do not grow).

    When its connection goes away the channel moves: a successor on the new path takes its
    outboxes (credit and waiting calls) and all new calls, while the calls in flight here finish
    here; a call to an actor waits at the successor until every earlier call to that actor sent
    here has been acknowledged (so calls still arrive in the order they were made), and the old
    channel closes once it holds no credit."""

    def __init__(self, runtime: CallRouter, peer: PeerId) -> None:
        super().__init__(runtime, peer)
        self.conn: Connection | None = None  # the connection the stream is on, once open
        self.predecessor: RemoteChannel | None = None  # the channel this one took over from, still finishing
        self.successor: RemoteChannel | None = None  # the channel that took over from this one
        self.out: dict[str, int] = {}  # credit taken here per actor and not given back yet
        self.undelivered: dict[str, int] = {}  # calls and tells sent here the callee has not acknowledged
        self.stream: Stream | None = None
        self.opening: asyncio.Task | None = None
        self.unsent: list = []  # calls submitted before the stream was open
        self.writer = FrameWriter(runtime.loop)
        self.last_used = time.monotonic()
        self.moving = False  # a better connection came up: switch when quiet
        self.round_trip = RoundTrip(lambda: runtime.host.conns.get(peer))  # (the connection calls go on now)
        self.protocol = rpc.PROTOCOL  # until the stream opens; then what the peer serves
        self._draining: asyncio.Task | None = None  # the one drain of the stream that ``writable`` waits on

    def quiet(self) -> bool:
        """No call or tell in flight and none queued: a new channel cannot overtake anything."""
        return self.settled() and not any(ob.queue for ob in self.outboxes.values())

    def settled(self) -> bool:
        """Nothing sent here holds credit any more (every call answered, every tell taken)."""
        return not self.out and not self.pending and not self.unsent

    def idle(self) -> bool:
        return (
            self.stream is not None and self.quiet() and time.monotonic() - self.last_used > self.runtime.channel_idle
        )

    def held(self, actor: str) -> bool:
        pred = self.predecessor
        while pred is not None:
            if pred.undelivered.get(actor):
                return True
            pred = pred.predecessor
        return False

    def returned(self, actor: str, n: int = 1) -> None:
        if n:
            left = self.out.get(actor, 0) - n
            if left > 0:
                self.out[actor] = left
            else:
                self.out.pop(actor, None)
        self.refill(actor, n)
        if self.successor is not None and self.settled():
            self.runtime.retire_channel(self)

    def refill(self, actor: str, n: int) -> None:
        if self.successor is not None:  # (moved: its outboxes are its successor's now)
            self.successor.refill(actor, n)
        else:
            super().refill(actor, n)

    def delivered(self, actor: str, n: int = 1) -> None:
        left = self.undelivered.get(actor, 0) - n
        if left > 0:
            self.undelivered[actor] = left
            return
        if self.undelivered.pop(actor, None) is not None and self.successor is not None:
            self.successor.refill(actor, 0)  # calls to it that waited for these may go now

    def hand_over(self) -> RemoteChannel:
        """Move: a successor on the peer's current path takes the outboxes and all new calls."""
        new = RemoteChannel(self.runtime, self.peer)
        new.outboxes = self.outboxes
        new.predecessor = self
        self.successor = new
        return new

    def leave(self) -> None:
        """A channel that moved is done (settled, or failed): unlink it, and let its successor send
        what waited on it."""
        succ, pred = self.successor, self.predecessor
        if succ is None:
            return
        self.successor = self.predecessor = None
        succ.predecessor = pred
        if pred is not None:
            pred.successor = succ
        out, self.out = self.out, {}
        self.undelivered.clear()
        self.outboxes = {}  # (they are the successor's: nothing here may fail its queued calls)
        for actor in list(succ.outboxes):
            succ.refill(actor, out.get(actor, 0))  # (credit this channel still held goes back too)

    def fail_all(self, error: LatticaError) -> None:
        if self.successor is None:
            super().fail_all(error)
            return
        # moved: the queued calls are the successor's; only the calls sent here fail (or follow)
        self.closed = error
        pending = list(self.pending.values())
        self.pending.clear()
        self.leave()
        rt = self.runtime
        for p in pending:
            if not rt.follow(p, error, delivered=True) and not rt.resend(p, error):
                rt.fail_call(p, error)

    def congested(self) -> bool:
        return self.writer.backlog() > CHANNEL_HIGH_WATER

    async def writable(self) -> None:
        """Wait while the channel is congested (any number of waiters: one drain serves them)."""
        while self.congested() and self.stream is not None and self.closed is None:
            task = self._draining
            if task is None or task.done():
                self.writer.flush()
                task = self._draining = self.runtime.host.spawn(self.stream.drain())
                task.add_done_callback(_retrieved)  # (every waiter may have gone by the time it fails)
            await asyncio.shield(task)

    def _send_call(self, p: Pending) -> None:
        p.ungate()
        p.stamp()
        self.last_used = time.monotonic()
        actor = p.ref.name
        self.out[actor] = self.out.get(actor, 0) + 1
        self.undelivered[actor] = self.undelivered.get(actor, 0) + 1
        tell = p.msg.flags & rpc.F_TELL
        if not tell:  # a tell gets no reply: its credit comes back in MAILBOX messages
            self.pending[p.cid] = p
        p.channel = self
        cid = p.cid  # the hooks capture the id, not p: p -> future -> hook -> p would be a cycle
        if p.future is not None:
            p.future._cancel_hook = lambda: self.send([rpc.CANCEL, cid])
        if p.stream is not None:
            p.stream._bind(
                lambda n, taken: self.send(self.credit_msg(cid, n, taken)),
                lambda: self.send([rpc.CANCEL, cid]),
                self.stream_rtt,
            )
        try:
            self.send(p.msg, p.encoded)
        except LatticaError:
            if not tell:
                del self.pending[p.cid]
            self.delivered(actor)
            self.returned(actor)
            raise

    def credit_msg(self, cid: int, n: int, taken: int) -> list:
        """A CREDIT granting ``n`` items, ``taken`` of them taken (said only where understood)."""
        return [rpc.CREDIT, cid, n, taken] if self.protocol == rpc.PROTOCOL else [rpc.CREDIT, cid, n]

    def stream_rtt(self) -> float | None:
        """What result streams' windows are timed against: None (they do not grow) on a stream
        whose grants cannot say what was taken, or until the stream is open."""
        return self.round_trip() if self.stream is not None and self.protocol == rpc.PROTOCOL else None

    def send(self, msg: list, encoded: list | None = None) -> None:
        """Encode ``msg`` now (errors surface here, at the caller) and queue it for the stream."""
        chunks = encoded if encoded is not None else codec.encode(msg)
        if self.stream is None:
            self.unsent.append(chunks)
            if self.opening is None:
                self.opening = self.runtime.loop.create_task(self._open())
            return
        self.writer.write(self.stream, chunks)

    async def _open(self) -> None:
        try:
            host = self.runtime.host
            for _ in range(3):
                conn = await host.get_connection(self.peer)
                info = await host.peer_info(conn, IDENTIFY_WAIT)  # (it came with the handshake, normally)
                # it went, went away or a better one came meanwhile: take the peer's current one
                if conn.is_closed or conn.going_away or host.conns.get(self.peer, conn) is not conn:
                    continue
                served = (
                    info.protocols if info is not None else (rpc.PROTOCOL_1,)
                )  # (unknown: what every version serves)
                self.protocol = next((p for p in (rpc.PROTOCOL, rpc.PROTOCOL_1) if p in served), "")
                if not self.protocol:
                    raise UnsupportedProtocol(f"{self.peer} does not serve actor calls")
                stream = await host.open_stream_on(conn, self.protocol)
                break
            else:
                raise PeerUnreachable(f"every connection to {self.peer} went away as calls were about to use it")
        except LatticaError as e:
            err = e
            if not isinstance(e, PeerUnreachable):
                err = PeerUnreachable(f"cannot reach {self.peer}: {e}")
                err.__cause__ = e  # e.g. our own ConnectionLimit: callers can tell it is not the peer
            self.runtime.drop_channel(self, err)
            return
        self.stream = stream
        self.conn = conn
        unsent, self.unsent = self.unsent, []
        for chunks in unsent:
            self.writer.write(stream, chunks)
        self.runtime.host.spawn(self._read_replies(stream))

    async def _read_replies(self, stream: Stream) -> None:
        rt = self.runtime

        def overdue(why: str) -> None:
            log.info("closing call channel: reply overdue", peer=str(self.peer), reason=why)
            stream.reset()

        splitter = BudgetedSplitter(MAX_MESSAGE, rt.partials, self.peer, rt.loop, overdue)
        splitter.stranger = rt.host.circle_of(self.peer) == "stranger"  # (a public service we call)
        try:
            while True:
                data = await stream.read(1 << 20)
                if not data:
                    raise PeerUnreachable(f"{self.peer} closed the call channel")
                for frame in splitter.feed(data):
                    before = spill.seen
                    msg = rpc.parse(codec.decode(frame))
                    if spill.seen != before:  # an answer whose big values travel by CID: fetched, then answered
                        rt.host.spawn(_unspill_reply(self, msg, len(frame)))
                        continue
                    rt.on_reply(self, msg, len(frame))
        except Exception as e:  # whatever broke the reader, no call may be left waiting on it
            err = e if isinstance(e, PeerUnreachable) else PeerUnreachable(f"call channel to {self.peer} failed: {e}")
            if isinstance(e, ProtocolError):
                log.info("closing call channel: peer broke the protocol", peer=str(self.peer), reason=str(e))
            elif not isinstance(e, LatticaError):
                log.exception("call channel reader failed", peer=str(self.peer))
            stream.reset()
            rt.drop_channel(self, err)
        finally:
            splitter.close()


async def _unspill_reply(ch: RemoteChannel, msg: list, size: int) -> None:
    """Fetch an answer's values that travel by CID from the callee, then hand the answer on (an
    ERR in its place when they do not arrive)."""
    rt = ch.runtime
    if msg[0] != rpc.OK:
        msg = [
            rpc.ERR,
            msg[rpc.ID],
            rpc.E_PROTOCOL,
            "ProtocolError",
            "values that travel by CID come only in an answer's value",
            "",
        ]
    else:
        try:
            msg = [rpc.OK, msg[rpc.ID], await rt.spills.fetch(msg[rpc.VALUE], ch.peer)]
        except LatticaError as e:
            msg = [
                rpc.ERR,
                msg[rpc.ID],
                rpc.E_REMOTE,
                f"lattica.errors.{type(e).__name__}",
                f"the answer's values that travel by CID did not arrive: {e}",
                "",
            ]
    rt.on_reply(ch, msg, size)


def _retrieved(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


class RoundTrip:
    """A path's round trip in seconds, read from its connection at most once a second (None:
    unknown); what streams' item windows are timed against."""

    __slots__ = ("_conn", "_rtt", "_due")

    def __init__(self, conn: Callable[[], Connection | None]) -> None:
        self._conn = conn
        self._rtt: float | None = None
        self._due = 0.0

    def __call__(self) -> float | None:
        now = time.monotonic()
        if now >= self._due:
            self._due = now + 1.0
            conn = self._conn()
            stats = conn.path_stats() if conn is not None else None
            ms = stats.get("rtt_ms") if stats else None
            self._rtt = ms / 1000.0 if ms is not None else None
        return self._rtt


class FrameWriter:
    """Coalesces small messages per loop iteration into one stream write."""

    __slots__ = ("_loop", "_buf", "_stream", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buf = bytearray()
        self._stream: Stream | None = None
        self._scheduled = False

    def write(self, stream: Stream, chunks: list) -> None:
        """Queue one encoded message (``codec.encode`` output) behind its 4-byte length."""
        size = sum(map(len, chunks)) if len(chunks) > 2 else len(chunks[0]) + len(chunks[1])
        self._stream = stream
        buf = self._buf
        buf += size.to_bytes(4, "big")
        if size < 65536:
            for c in chunks:
                buf += c
        else:  # big payloads: flush what is queued, then hand the buffers over without copying
            for c in chunks[:2]:
                buf += c
            stream.write(buf)
            self._buf = bytearray()
            for c in chunks[2:]:
                stream.write(c)
            return
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if self._buf and self._stream is not None:
            buf, self._buf = self._buf, bytearray()
            try:
                self._stream.write(buf)
            except LatticaError:
                pass  # the reader side notices the broken stream and fails the calls

    def backlog(self) -> int:
        s = self._stream
        return len(self._buf) + (s.write_buffer_size() if s is not None else 0)
