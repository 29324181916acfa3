"""Bitswap 1.2.0 (``/ipfs/bitswap/1.2.0``) with libp2p peers, over the content service's
blockstore and fetch sessions (issue 49).

Lattica nodes exchange blocks through the ``content`` actor; a peer that speaks Bitswap and not
our actor calls (go, rust and js libp2p nodes, the Lattica SDK, IPFS) is served and asked here
with the same shapes the fetch already uses: ``have(peer, cids)`` answers a bool per CID and
``blocks(peer, cids)`` a block or None per CID, so a fetch session mixes both kinds of provider.

Messages travel on a stream their **sender** opens: we read a peer's wants and answers on the
streams it opened, and write ours on one long-lived stream we open to it on the connection we
have (never dialing to answer). Serving runs within the content service's budgets: the CIDs a
peer may name a second, and the serving gate's share per peer and for strangers together.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING

from lattica._framing import write_delimited
from lattica._identity import PeerId
from lattica._rpc import PROTOCOL as RPC_PROTOCOL
from lattica._runtime.partials import PartialMessages
from lattica.errors import ContentError, LatticaError, ProtocolError, StreamClosed, Timeout
from lattica.logging import get_logger

if TYPE_CHECKING:
    from types import ModuleType

    from lattica.actors.content.service import ContentService
    from lattica.content._bitswap_wire import BitswapMessage, Name, Want
    from lattica.content._cid import Cid
    from lattica.transports.base import Connection, Stream

__all__ = ["Bitswap", "PROTOCOL"]

PROTOCOL = "/ipfs/bitswap/1.2.0"  # (the codec says the same: lattica.content._bitswap_wire)

log = get_logger("lattica.bitswap")


def _wire() -> ModuleType:
    """The message codec, loaded with the first Bitswap message (it loads hashlib: not at start)."""
    from lattica.content import _bitswap_wire  # (see the docstring)

    return _bitswap_wire


IDLE = 300.0  # s a peer's stream may stay silent (Bitswap peers keep one open)
# want-blocks outstanding per peer, across all our requests to it: the SDK sends every pending
# block in one message, and we read 4 MiB at most (two blocks of up to 2 MiB)
BLOCKS_IN_FLIGHT = 2
MESSAGE_BLOCK_BYTES = 2 * 1024 * 1024  # blocks we put in one message (messages stay under 4 MiB)
_SERVE_BATCH = 16  # want-blocks read from the blockstore at once
SEND_TIMEOUT = 30.0  # s a message we send may wait for the peer's window before our stream to it is reset


class _Waiter:
    """What one request waits for: an answer (block, HAVE or DONT_HAVE) per CID."""

    __slots__ = ("want_block", "answers", "event")

    def __init__(self, want_block: bool) -> None:
        self.want_block = want_block
        self.answers: dict[Cid, bytes | bool] = {}
        self.event = asyncio.Event()


class Bitswap:
    """Bitswap 1.2.0, client and server, for peers that speak it instead of our actor calls."""

    def __init__(self, svc: ContentService) -> None:
        self.svc = svc
        self.host = svc.host
        self.host.set_handler(PROTOCOL, self._on_stream)
        self._out: dict[PeerId, Stream] = {}  # the stream we write our messages to each peer on
        self._locks: dict[PeerId, asyncio.Lock] = {}
        self._slots: dict[PeerId, asyncio.Semaphore] = {}  # each peer's BLOCKS_IN_FLIGHT want-blocks
        self._waiting: dict[tuple[PeerId, Cid], list[_Waiter]] = collections.defaultdict(list)
        self.received_blocks = 0
        self.received_bytes = 0
        self._asking: dict[PeerId, int] = {}  # requests of ours waiting on each peer (its answers are read)
        # what a peer's half-read messages may hold of our memory: the node's budget for partly
        # received messages (the runtime's, shared with actor calls)
        self.partials: PartialMessages = svc.rt.partials

    def speaks_only_bitswap(self, peer: PeerId) -> bool:
        """``peer`` (identified) serves Bitswap and no actor calls: a libp2p node, not a Lattica one."""
        conn = self.host.conns.get(peer)
        info = self.host.info.get(conn) if conn is not None else None
        return info is not None and PROTOCOL in info.protocols and RPC_PROTOCOL not in info.protocols

    def implementation(self, peer: PeerId) -> str:
        """What ``peer`` says it runs (identify's agent version), for progress lines."""
        conn = self.host.conns.get(peer)
        info = self.host.info.get(conn) if conn is not None else None
        return (info.agent_version if info is not None else "")[:64]

    # -- sending ---------------------------------------------------------------------------------

    async def _send(self, peer: PeerId, msg: BitswapMessage) -> None:
        """Write ``msg`` on our stream to ``peer`` (opened on the connection we have: we never
        dial to send). LatticaError if there is none or it broke."""
        lock = self._locks.setdefault(peer, asyncio.Lock())
        async with lock:
            stream = self._out.get(peer)
            if stream is None or stream.aborted:
                conn = self.host.conns.get(peer)
                if conn is None or conn.is_closed:
                    raise ContentError(f"no connection to {peer} to send Bitswap messages on")
                stream = self._out[peer] = await self.host.open_stream_on(conn, PROTOCOL)
            try:
                write_delimited(stream, _wire().encode(msg))
                async with asyncio.timeout(SEND_TIMEOUT):  # (a peer that takes nothing loses the stream)
                    await stream.drain()
            except asyncio.CancelledError:
                raise  # (our caller gave up: the message is queued whole and goes out, the stream stays)
            except BaseException as e:
                self._out.pop(peer, None)
                stream.reset()
                if isinstance(e, TimeoutError):
                    raise Timeout(f"{peer} took nothing of our Bitswap stream for {SEND_TIMEOUT:.0f} s") from None
                raise

    def _unsent(self, peer: PeerId) -> int:
        stream = self._out.get(peer)
        return stream.write_buffer_size() if stream is not None else 0

    def forget(self, peer: PeerId) -> None:
        """``peer``'s last connection closed: its stream goes."""
        stream = self._out.pop(peer, None)
        self._locks.pop(peer, None)
        self._slots.pop(peer, None)
        if stream is not None:
            stream.reset()

    # -- receiving -------------------------------------------------------------------------------

    async def _on_stream(self, stream: Stream, conn: Connection) -> None:
        """A peer's messages: answers to our wants go to who waits for them, its wants are
        served one message at a time (the next is not read before, so a peer that asks faster
        than we serve is held back by its own stream)."""
        peer = conn.remote_peer
        while True:
            try:
                wants = self._take(peer, await self._read(stream, peer))
            except StreamClosed:
                await stream.close()
                return
            except (TimeoutError, LatticaError) as e:  # idle, over 4 MiB or the budget, slow, or malformed
                if isinstance(e, ProtocolError) or not isinstance(e, TimeoutError):
                    log.info("Bitswap stream dropped", peer=str(peer), reason=str(e) or type(e).__name__)
                stream.reset()
                return
            if wants:
                try:
                    await self._serve(peer, wants)
                except LatticaError as e:
                    log.info("Bitswap wants not served", peer=str(peer), reason=str(e))

    async def _read(self, stream: Stream, peer: PeerId) -> bytes:
        """One message of ``peer``'s: its length (the stream may be idle IDLE s before it), then
        its bytes, held against the node's budget for partly received messages (a stranger's
        share and the strangers' together: MessageBudgetExceeded past it) and within its
        deadline (the budget's, plus the length at its least rate). Without them, a stranger's
        streams each held up to 4 MiB half-read for IDLE s."""
        wire = _wire()
        return await self.partials.read_delimited(
            stream, peer, wire.MAX_MESSAGE, "Bitswap message", self.svc.is_stranger, IDLE
        )

    def _take(self, peer: PeerId, data: bytes) -> tuple[Want, ...]:
        """A message's answers, to who waits for them (read only while we ask ``peer``
        something), and its wants, to serve: parsed only once the CIDs they name are charged to
        the peer's budget (counted unread; over the budget they are refused unread: parsing
        1,024 wants takes milliseconds)."""
        n = _wire().count_wants(data)
        parse = True
        if n:
            try:
                self.svc.charge_named(peer, n)
            except ContentError as e:
                log.info("Bitswap wants not served", peer=str(peer), reason=str(e))
                parse = False
        msg = _wire().decode(data, wants=parse, answers=peer in self._asking)
        self._answers(peer, msg)
        return msg.wants

    def _answers(self, peer: PeerId, msg: BitswapMessage) -> None:
        """Blocks and presences ``peer`` sent: to the requests waiting for them (a block nobody
        asked this peer for is dropped)."""
        for name, data in msg.blocks:
            cid = _wire().cid_of(name)
            for w in self._waiting.get((peer, cid), ()):
                w.answers[cid] = data if w.want_block else True
                w.event.set()
        for name in msg.haves:
            cid = _wire().cid_of(name)
            for w in self._waiting.get((peer, cid), ()):
                if not w.want_block:
                    w.answers[cid] = True
                    w.event.set()
        for name in msg.dont_haves:
            cid = _wire().cid_of(name)
            for w in self._waiting.get((peer, cid), ()):
                w.answers.setdefault(cid, False)
                w.event.set()

    # -- serving ---------------------------------------------------------------------------------

    async def _serve(self, peer: PeerId, wants: tuple[Want, ...]) -> None:
        """Answer a wantlist: HAVE or DONT_HAVE for want-haves, blocks (or DONT_HAVE) for
        want-blocks. Cancels need nothing: every want is answered as it comes."""
        asked = [w for w in wants if not w.cancel]  # (charged to the peer as they were read: _take)
        if not asked:
            return
        store = self.svc.store
        haves: list[Name] = []
        dont: list[Name] = []
        for w in asked:
            if w.have:
                if store.has(w.cid):
                    haves.append(w.name)
                elif w.send_dont_have:
                    dont.append(w.name)
        if haves or dont:
            await self._send(peer, _wire().BitswapMessage(haves=tuple(haves), dont_haves=tuple(dont)))
        blocks = [w for w in asked if not w.have]
        for i in range(0, len(blocks), _SERVE_BATCH):
            await self._serve_blocks(peer, blocks[i : i + _SERVE_BATCH])

    async def _serve_blocks(self, peer: PeerId, wants: list[Want]) -> None:
        todo = list(wants)
        while todo:
            got = await self.svc.serve_blocks(peer, [w.cid for w in todo], lambda: self._unsent(peer))
            batch: list[tuple[Name, bytes]] = []
            size = 0
            dont: list[Name] = []
            for w, b in zip(todo, got):
                if isinstance(b, (bytes, bytearray, memoryview)):
                    if batch and size + len(b) > MESSAGE_BLOCK_BYTES:
                        await self._send(peer, _wire().BitswapMessage(blocks=tuple(batch)))
                        batch, size = [], 0
                    batch.append((w.name, bytes(b)))
                    size += len(b)
                elif w.send_dont_have:
                    dont.append(w.name)  # (None: not held; a fellow's id: only our own swarms pass on)
            if batch or dont:
                await self._send(peer, _wire().BitswapMessage(blocks=tuple(batch), dont_haves=tuple(dont)))
            todo = todo[len(got) :] if got else []  # (an answer cut short at the byte budget: the rest next)

    # -- asking ----------------------------------------------------------------------------------

    async def have(self, peer: PeerId, cids: list[Cid], timeout: float) -> list[bool]:
        """Per CID, whether ``peer`` holds it (want-have, asking for DONT_HAVE); the CIDs it
        said nothing of by ``timeout`` count as not held, Timeout if it said nothing at all."""
        waiter = _Waiter(want_block=False)
        try:
            self._wait_for(peer, cids, waiter)
            async with asyncio.timeout(timeout):  # (a peer not reading our stream holds up the send too)
                await self._send(peer, _wire().BitswapMessage(wants=tuple(_wire().Want(c, have=True) for c in cids)))
                while len(waiter.answers) < len(cids):
                    waiter.event.clear()
                    await waiter.event.wait()
        except TimeoutError:
            pass
        finally:
            self._done(peer, cids, waiter)
        if not waiter.answers:
            raise Timeout(f"{peer} answered no want-have within {timeout:.1f} s")
        return [waiter.answers.get(c) is True for c in cids]

    async def blocks(self, peer: PeerId, cids: list[Cid], timeout: float) -> list[bytes | None]:
        """Per CID in order, the block ``peer`` sent or None if it said it lacks it; the answer
        stops at the first block still missing at ``timeout`` (the fetch asks for the rest
        again). At most BLOCKS_IN_FLIGHT are wanted of the peer at once, whatever else asks it
        (its other requests wait for a slot); the rest are cancelled if we stop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        waiter = _Waiter(want_block=True)
        slots = self._slots.setdefault(peer, asyncio.Semaphore(BLOCKS_IN_FLIGHT))
        asked: list[Cid] = []
        held: list[Cid] = []  # asked and not answered yet: each holds one of the peer's slots
        try:
            self._wait_for(peer, cids, waiter)
            while len(waiter.answers) < len(cids):
                for c in [c for c in held if c in waiter.answers]:
                    held.remove(c)
                    slots.release()
                more: list[Cid] = []
                while len(asked) + len(more) < len(cids) and not slots.locked():
                    await slots.acquire()  # (free: at once)
                    more.append(cids[len(asked) + len(more)])
                if not held and not more and len(asked) < len(cids):
                    try:  # every slot is the peer's other requests': wait for one
                        async with asyncio.timeout_at(deadline):
                            await slots.acquire()
                    except TimeoutError:
                        break
                    more.append(cids[len(asked)])
                if more:
                    asked.extend(more)
                    held.extend(more)
                    try:
                        async with asyncio.timeout_at(deadline):  # (as in have)
                            await self._send(peer, _wire().BitswapMessage(wants=tuple(_wire().Want(c) for c in more)))
                    except TimeoutError:
                        break
                left = deadline - loop.time()
                if left <= 0:
                    break
                waiter.event.clear()
                if len(waiter.answers) < len(asked):
                    try:
                        async with asyncio.timeout(left):
                            await waiter.event.wait()
                    except TimeoutError:
                        break
        finally:
            for _ in held:
                slots.release()
            self._done(peer, cids, waiter)
            unanswered = [c for c in asked if c not in waiter.answers]
            if unanswered:
                self.host.spawn(self._cancel(peer, unanswered))
        out: list[bytes | None] = []
        for c in cids:
            a = waiter.answers.get(c)
            if a is None:
                break
            if isinstance(a, bytes):
                self.received_blocks += 1
                self.received_bytes += len(a)
                out.append(a)
            else:
                out.append(None)
        return out

    async def _cancel(self, peer: PeerId, cids: list[Cid]) -> None:
        try:
            await self._send(
                peer,
                _wire().BitswapMessage(wants=tuple(_wire().Want(c, cancel=True, send_dont_have=False) for c in cids)),
            )
        except LatticaError:
            pass  # (the peer is gone: nothing to cancel there)

    def _wait_for(self, peer: PeerId, cids: list[Cid], waiter: _Waiter) -> None:
        self._asking[peer] = self._asking.get(peer, 0) + 1
        for c in cids:
            self._waiting[(peer, c)].append(waiter)

    def _done(self, peer: PeerId, cids: list[Cid], waiter: _Waiter) -> None:
        left = self._asking.pop(peer, 1) - 1
        if left:
            self._asking[peer] = left
        for c in cids:
            ws = self._waiting.get((peer, c))
            if ws is not None:
                if waiter in ws:
                    ws.remove(waiter)
                if not ws:
                    del self._waiting[(peer, c)]
