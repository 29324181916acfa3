"""The callee's side of calls: serving a peer's call stream, checking every message and handing
the calls to local actors."""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

from lattica import _rpc as rpc
from lattica import codec, trust
from lattica._runtime import spill
from lattica._runtime.client import FrameWriter, RoundTrip
from lattica._runtime.limits import (
    CHANNEL_HIGH_WATER,
    IDENTIFY_WAIT,
    MAX_MESSAGE,
    MAX_STREAM_ARGS,
    STRANGER_UNIT,
    STREAM_WINDOW,
)
from lattica._runtime.local import ArgStream, Invocation, Sink
from lattica._runtime.partials import BudgetedSplitter
from lattica._runtime.refs import StreamArg
from lattica.errors import (
    ConnectionClosed,
    FrameTooLarge,
    LatticaError,
    ProtocolError,
)
from lattica.logging import get_logger
from lattica.transports.base import Connection, Stream

if TYPE_CHECKING:
    from lattica._runtime.registry import Runtime

log = get_logger("lattica.runtime")


class _ServerSink(Sink):
    """Replies to a call that came from a peer; holds one slot of that peer's mailbox window."""

    __slots__ = ("server", "cid", "actor", "tell", "counted")

    def __init__(self, server: ServerChannel, cid: int, actor: str, tell: bool) -> None:
        self.server = server
        self.cid = cid
        self.actor = actor
        self.tell = tell  # fire-and-forget: only the mailbox credit goes back (batched)
        self.counted = True

    def _release(self) -> None:
        s = self.server
        s.invocations.pop(self.cid, None)
        if self.counted:
            self.counted = False
            s.runtime.release_slot(s.peer, self.actor)
            if self.tell:
                s.tell_credit(self.actor)

    def ok(self, value: Any) -> None:
        self._release()
        if self.tell:
            return
        try:
            self.server.send([rpc.OK, self.cid, value])
        except FrameTooLarge as e:  # its big values travel by CID (stored off the loop first)
            self.server.runtime.host.spawn(self.server.send_spilled(self.cid, value, e))
        except LatticaError as e:  # e.g. a result the codec cannot encode
            self.server.send(
                [
                    rpc.ERR,
                    self.cid,
                    rpc.E_REMOTE,
                    f"lattica.errors.{type(e).__name__}",
                    f"cannot send the result: {e}",
                    "",
                ]
            )

    def err(self, kind: str, type_name: str, message: str, tb: str = "") -> None:
        self._release()
        if not self.tell:
            if self.server.circle == trust.STRANGER:
                tb = ""  # (a stranger is not shown our code: its paths, lines and frames)
            self.server.send([rpc.ERR, self.cid, kind, type_name, message, tb])
        elif kind == rpc.E_REMOTE:
            log.info("fire-and-forget call failed", actor=self.actor, error=f"{type_name}: {message}")

    def item(self, value: Any) -> int:
        if self.tell:
            return 0
        chunks = codec.encode([rpc.ITEM, self.cid, value])
        self.server.writer.write(self.server.stream, chunks)
        return sum(map(len, chunks))

    def end(self) -> None:
        self._release()
        if not self.tell:
            self.server.send([rpc.END, self.cid])


class ServerChannel:
    """Calls from one peer to actors on this node."""

    def __init__(self, runtime: Runtime, stream: Stream, conn: Connection, protocol: str = rpc.PROTOCOL) -> None:
        self.runtime = runtime
        self.stream = stream
        self.says_taken = protocol == rpc.PROTOCOL  # the caller's grants say what was taken, and it reads ours that do
        self.conn = conn
        self.peer = conn.remote_peer
        self.circle = trust.STRANGER  # what the caller is to us: set from its identify in serve()
        self.circle_reason = "it has not identified itself"
        self.writer = FrameWriter(runtime.loop)
        self.invocations: dict[int, Invocation] = {}
        self.tell_credits: dict[str, int] = {}
        self._credit_scheduled = False
        self.round_trip = RoundTrip(lambda: conn)  # (streamed arguments' windows are timed against it)

    def send(self, msg: list) -> None:
        self.writer.write(self.stream, codec.encode(msg))

    async def send_spilled(self, cid: int, value: Any, why: FrameTooLarge) -> None:
        """Answer with ``value``'s big values stored here for the caller to fetch by CID."""
        try:
            value = await self.runtime.spills.spill_answer(value, why)
            self.send([rpc.OK, cid, value])
        except LatticaError as e:
            self.send(
                [rpc.ERR, cid, rpc.E_REMOTE, f"lattica.errors.{type(e).__name__}", f"cannot send the result: {e}", ""]
            )

    async def _unspill(self, raw: Any) -> Any:
        """A call whose big arguments travel by CID: them fetched from the caller, in its place
        (calls after it on this channel wait: they run in the order they were made). None when it
        was answered with an error instead."""
        if type(raw) is not list or len(raw) != 8 or raw[0] != rpc.CALL or type(raw[1]) is not int:
            raise ProtocolError("values that travel by CID come only in a call's arguments")
        tell = bool(type(raw[7]) is int and raw[7] & rpc.F_TELL)
        actor = raw[2] if type(raw[2]) is str else "?"
        if self.circle == trust.STRANGER and not self._now_member():
            self.refuse(
                raw[1],
                tell,
                actor,
                rpc.E_DENIED,
                "PermissionDenied",
                f"{self.runtime.peer_id} fetches values that travel by CID only from members of its mesh",
            )
            return None
        if actor not in self.runtime.actors:  # (nothing is fetched for a call that cannot run)
            self.refuse(
                raw[1],
                tell,
                actor,
                rpc.E_NOT_FOUND,
                "ActorNotFound",
                f"no actor named {actor!r} on {self.runtime.peer_id}",
            )
            return None
        try:
            raw[4], raw[5] = await self.runtime.spills.fetch([raw[4], raw[5]], self.peer)
        except LatticaError as e:
            self.refuse(
                raw[1],
                tell,
                actor,
                rpc.E_REMOTE,
                f"lattica.errors.{type(e).__name__}",
                f"the call's arguments that travel by CID did not arrive: {e}",
            )
            return None
        return raw

    def argcred_msg(self, cid: int, index: int, n: int, taken: int) -> list:
        """An ARGCRED granting ``n`` items, ``taken`` of them taken (said only where understood)."""
        return [rpc.ARGCRED, cid, index, n, taken] if self.says_taken else [rpc.ARGCRED, cid, index, n]

    def tell_credit(self, actor: str) -> None:
        self.tell_credits[actor] = self.tell_credits.get(actor, 0) + 1
        if not self._credit_scheduled:
            self._credit_scheduled = True
            self.runtime.loop.call_soon(self._flush_credits)

    def _flush_credits(self) -> None:
        self._credit_scheduled = False
        credits, self.tell_credits = self.tell_credits, {}
        for actor, n in credits.items():
            self.send([rpc.MAILBOX, actor, n])

    async def serve(self) -> None:
        splitter = BudgetedSplitter(MAX_MESSAGE, self.runtime.partials, self.peer, self.runtime.loop, self._overdue)
        info = await self.runtime.host.peer_info(self.conn, IDENTIFY_WAIT)  # who is calling decides what it may call
        if info is not None:
            self.circle, self.circle_reason = info.circle, info.circle_reason
        splitter.stranger = self.circle == "stranger"
        try:
            while True:
                while self._backlog() > CHANNEL_HIGH_WATER:
                    # the caller is not reading its replies: stop reading its calls meanwhile
                    await self._wait_for_room()
                data = await self.stream.read(1 << 20)
                if not data:
                    self.writer.flush()
                    await self.stream.close()  # the caller closed its channel: so do we
                    break
                for frame in splitter.feed(data):
                    if self.circle == trust.STRANGER:
                        await self._strangers_turn(len(frame))
                    before = spill.seen
                    raw = codec.decode(frame)
                    if spill.seen != before:  # it holds values that travel by CID: fetched first, in order
                        raw = await self._unspill(raw)
                        if raw is None:
                            continue
                    self.on_message(raw, len(frame))
        except LatticaError as e:
            if isinstance(e, ProtocolError):
                log.info("closing call channel: peer broke the protocol", peer=str(self.peer), reason=str(e))
                self.stream.reset()
        finally:
            splitter.close()
            for inv in list(self.invocations.values()):  # the caller is gone: stop its work
                inv.actor.cancel(inv)
            self.invocations.clear()

    async def _strangers_turn(self, size: int) -> None:
        """A stranger's frame of ``size`` bytes waits, not decoded, while the strangers' share of
        this node's time is spent (all strangers together; members are never held): the channel
        reads nothing meanwhile, so flow control holds the sender back at no cost to us. A
        channel whose stream or connection goes away meanwhile stops waiting (and serving)."""
        cost = 1 + size / STRANGER_UNIT
        if (
            not await self.runtime.strangers_calls.take(
                self.peer, cost, give_up=lambda: self._gone() or self._now_member()
            )
            and self._gone()
        ):
            raise ConnectionClosed(
                f"call channel from {self.peer} closed while its frame waited for the strangers' share"
            )

    def _gone(self) -> bool:
        """The channel's stream was reset or its connection closed."""
        return self.stream.aborted or self.conn.is_closed

    def _backlog(self) -> int:
        """Replies not yet taken by the connection, on all of the caller's channels on it: one
        caller's many channels must not each hold a high water mark of them."""
        chans = self.runtime.channels_from(self.peer)
        return (
            sum(ch.writer.backlog() for ch in chans if ch.conn is self.conn)
            if len(chans) > 1
            else self.writer.backlog()
        )

    async def _wait_for_room(self) -> None:
        """Until the replies waiting on this channel, and on the caller's other channels on this
        connection, have gone to the connection (the caller reads them, or the channel ends)."""
        self.writer.flush()
        await self.stream.drain()
        for ch in list(self.runtime.channels_from(self.peer)):
            if ch is not self and ch.conn is self.conn and ch.writer.backlog():
                ch.writer.flush()
                try:
                    await ch.stream.drain()
                except LatticaError:  # that channel is over: its serve() ends (its replies stop counting) once it runs
                    await asyncio.sleep(0.01)

    def _overdue(self, why: str) -> None:
        log.info("closing call channel: message overdue", peer=str(self.peer), reason=why)
        self.stream.reset()

    def on_message(self, raw: Any, size: int = 0) -> None:
        try:
            msg = rpc.parse(raw)
        except ProtocolError as e:
            cid = raw[1] if type(raw) is list and len(raw) > 1 and type(raw[1]) is int and raw[0] == rpc.CALL else None
            if cid is None:
                raise
            self.send([rpc.ERR, cid, rpc.E_PROTOCOL, "ProtocolError", str(e), ""])
            return
        kind = msg[0]
        if kind == rpc.CALL:
            self.on_call(msg)
            return
        inv = self.invocations.get(msg[rpc.ID])
        if inv is None:
            return  # finished already (replies and cancels cross on the wire)
        if kind == rpc.CANCEL:
            inv.actor.cancel(inv)
        elif kind == rpc.CREDIT:
            inv.actor.grant(inv, *rpc.grant(msg))
        elif kind == rpc.ARG:
            s = (inv.arg_streams or {}).get(msg[rpc.ARG_INDEX])
            if s is not None:
                s._push(msg[rpc.ARG_ITEM], size)
        elif kind == rpc.ARGEND:
            s = (inv.arg_streams or {}).get(msg[rpc.ARG_INDEX])
            if s is not None:
                s._end()

    def _now_member(self) -> bool:
        """The caller's identify may have come after the channel's wait gave up (a slow relay,
        a loaded node): look again before refusing."""
        info = self.runtime.host.info.get(self.conn)
        if info is not None:
            self.circle, self.circle_reason = info.circle, info.circle_reason
        return self.circle != trust.STRANGER

    def refuse(self, cid: int, tell: bool, actor: str, kind: str, type_name: str, message: str) -> None:
        """Answer a call that will not run: ERR, or for a tell just its credit back."""
        if tell:
            self.tell_credit(actor)
        else:
            self.send([rpc.ERR, cid, kind, type_name, message, ""])

    def on_call(self, msg: list) -> None:
        _, cid, actor_name, method, args, kwargs, timeout, flags = msg
        rt = self.runtime
        tell = bool(flags & rpc.F_TELL)
        actor = rt.actors.get(actor_name)
        if self.circle == trust.STRANGER and (actor is None or method not in actor.public) and not self._now_member():
            # the same answer whether or not the actor exists: strangers learn nothing of what runs here
            why = f"{self.peer} is not a member of this node's mesh: {self.circle_reason}"
            rt.host.note_refusal(self.peer, f"{actor_name}.{method}", why)
            self.refuse(
                cid,
                tell,
                actor_name,
                rpc.E_DENIED,
                "PermissionDenied",
                f"{rt.peer_id} refused {actor_name}.{method}: {why}",
            )
            return
        if actor is None:
            self.refuse(
                cid,
                tell,
                actor_name,
                rpc.E_NOT_FOUND,
                "ActorNotFound",
                f"no actor named {actor_name!r} on {rt.peer_id}",
            )
            return
        if not tell and cid in self.invocations:
            self.send(
                [rpc.ERR, cid, rpc.E_PROTOCOL, "ProtocolError", f"call id {cid} is already in use on this channel", ""]
            )
            return
        if flags & rpc.F_ARGSTREAM:
            indexes = [a.index for a in args if isinstance(a, StreamArg)]
            if len(indexes) > MAX_STREAM_ARGS or len(set(indexes)) != len(indexes):
                self.refuse(
                    cid,
                    tell,
                    actor_name,
                    rpc.E_PROTOCOL,
                    "ProtocolError",
                    f"a call streams at most {MAX_STREAM_ARGS} arguments, each under its own index",
                )
                return
        key = (self.peer, actor_name)
        used = rt.in_flight.get(key, 0)  # per peer, whatever stream its calls come on
        if used >= actor.window:
            self.refuse(
                cid,
                tell,
                actor_name,
                rpc.E_MAILBOX,
                "MailboxFull",
                f"caller exceeded its window of {actor.window} calls to {actor_name!r}",
            )
            return
        rt.in_flight[key] = used + 1
        sink = _ServerSink(self, cid, actor_name, tell)
        deadline = rt.loop.time() + timeout if timeout is not None else None
        inv = Invocation(
            actor, method, args, kwargs, deadline, sink, streaming=bool(flags & rpc.F_STREAM), caller=self.peer
        )
        if not tell:
            self.invocations[cid] = inv
        if flags & rpc.F_ARGSTREAM:
            inv.arg_streams = {}

            def grant(idx: int, n: int, taken: int) -> None:
                self.send(self.argcred_msg(cid, idx, n, taken))

            for i, a in enumerate(args):
                if isinstance(a, StreamArg):
                    s = ArgStream(
                        functools.partial(grant, a.index),
                        self.round_trip if self.says_taken else None,
                    )
                    inv.arg_streams[a.index] = s
                    args[i] = s
                    self.send(self.argcred_msg(cid, a.index, STREAM_WINDOW, 0))
        actor.dispatch(inv)
