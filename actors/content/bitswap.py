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

from lattica._framing import read_delimited, write_delimited
from lattica._identity import PeerId
from lattica._rpc import PROTOCOL as RPC_PROTOCOL
from lattica.content._bitswap_wire import MAX_MESSAGE, PROTOCOL, BitswapMessage, Want, decode, encode
from lattica.content._cid import Cid
from lattica.errors import ContentError, LatticaError, ProtocolError, StreamClosed, Timeout
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica.actors.content.service import ContentService
    from lattica.transports.base import Connection, Stream

__all__ = ["Bitswap", "PROTOCOL"]

log = get_logger("lattica.bitswap")

IDLE = 300.0  # s a peer's stream may stay silent (Bitswap peers keep one open)
BLOCKS_IN_FLIGHT = 2  # want-blocks outstanding per peer and request: the SDK sends every pending block in one message
MESSAGE_BLOCK_BYTES = 2 * 1024 * 1024  # blocks we put in one message (messages stay under 4 MiB)
_SERVE_BATCH = 16  # want-blocks read from the blockstore at once


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
        self._waiting: dict[tuple[PeerId, Cid], list[_Waiter]] = collections.defaultdict(list)
        self.received_blocks = 0
        self.received_bytes = 0

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
                write_delimited(stream, encode(msg))
                await stream.drain()
            except BaseException:
                self._out.pop(peer, None)
                stream.reset()
                raise

    def _unsent(self, peer: PeerId) -> int:
        stream = self._out.get(peer)
        return stream.write_buffer_size() if stream is not None else 0

    def forget(self, peer: PeerId) -> None:
        """``peer``'s last connection closed: its stream goes."""
        stream = self._out.pop(peer, None)
        self._locks.pop(peer, None)
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
                async with asyncio.timeout(IDLE):
                    data = await read_delimited(stream, MAX_MESSAGE)
                msg = decode(data)
            except StreamClosed:
                await stream.close()
                return
            except (TimeoutError, LatticaError) as e:  # idle, over 4 MiB, or malformed
                if isinstance(e, ProtocolError) or not isinstance(e, TimeoutError):
                    log.info("Bitswap stream dropped", peer=str(peer), reason=str(e) or type(e).__name__)
                stream.reset()
                return
            self._answers(peer, msg)
            if msg.wants:
                try:
                    await self._serve(peer, msg.wants)
                except LatticaError as e:
                    log.info("Bitswap wants not served", peer=str(peer), reason=str(e))

    def _answers(self, peer: PeerId, msg: BitswapMessage) -> None:
        """Blocks and presences ``peer`` sent: to the requests waiting for them (a block nobody
        asked this peer for is dropped)."""
        for cid, data in msg.blocks:
            for w in self._waiting.get((peer, cid), ()):
                w.answers[cid] = data if w.want_block else True
                w.event.set()
        for cid in msg.haves:
            for w in self._waiting.get((peer, cid), ()):
                if not w.want_block:
                    w.answers[cid] = True
                    w.event.set()
        for cid in msg.dont_haves:
            for w in self._waiting.get((peer, cid), ()):
                w.answers.setdefault(cid, False)
                w.event.set()

    # -- serving ---------------------------------------------------------------------------------

    async def _serve(self, peer: PeerId, wants: tuple[Want, ...]) -> None:
        """Answer a wantlist: HAVE or DONT_HAVE for want-haves, blocks (or DONT_HAVE) for
        want-blocks. Cancels need nothing: every want is answered as it comes."""
        asked = [w for w in wants if not w.cancel]
        if not asked:
            return
        self.svc.charge_named(peer, len(asked))
        store = self.svc.store
        haves, dont = [], []
        for w in asked:
            if w.have:
                if store.has(w.cid):
                    haves.append(w.cid)
                elif w.send_dont_have:
                    dont.append(w.cid)
        if haves or dont:
            await self._send(peer, BitswapMessage(haves=tuple(haves), dont_haves=tuple(dont)))
        blocks = [w for w in asked if not w.have]
        for i in range(0, len(blocks), _SERVE_BATCH):
            await self._serve_blocks(peer, blocks[i : i + _SERVE_BATCH])

    async def _serve_blocks(self, peer: PeerId, wants: list[Want]) -> None:
        todo = list(wants)
        while todo:
            got = await self.svc.serve_blocks(peer, [w.cid for w in todo], lambda: self._unsent(peer))
            batch: list[tuple[Cid, bytes]] = []
            size = 0
            dont = []
            for w, b in zip(todo, got):
                if isinstance(b, (bytes, bytearray, memoryview)):
                    if batch and size + len(b) > MESSAGE_BLOCK_BYTES:
                        await self._send(peer, BitswapMessage(blocks=tuple(batch)))
                        batch, size = [], 0
                    batch.append((w.cid, bytes(b)))
                    size += len(b)
                elif w.send_dont_have:
                    dont.append(w.cid)  # (None: not held; a fellow's id: only our own swarms pass on)
            if batch or dont:
                await self._send(peer, BitswapMessage(blocks=tuple(batch), dont_haves=tuple(dont)))
            todo = todo[len(got) :] if got else []  # (an answer cut short at the byte budget: the rest next)

    # -- asking ----------------------------------------------------------------------------------

    async def have(self, peer: PeerId, cids: list[Cid], timeout: float) -> list[bool]:
        """Per CID, whether ``peer`` holds it (want-have, asking for DONT_HAVE); the CIDs it
        said nothing of by ``timeout`` count as not held, Timeout if it said nothing at all."""
        waiter = _Waiter(want_block=False)
        try:
            self._wait_for(peer, cids, waiter)
            async with asyncio.timeout(timeout):  # (a peer not reading our stream holds up the send too)
                await self._send(peer, BitswapMessage(wants=tuple(Want(c, have=True) for c in cids)))
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
        again). At most BLOCKS_IN_FLIGHT are wanted at once; the rest are cancelled if we stop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        waiter = _Waiter(want_block=True)
        asked: list[Cid] = []
        try:
            self._wait_for(peer, cids, waiter)
            while len(waiter.answers) < len(cids):
                open_ = [c for c in asked if c not in waiter.answers]
                more = [c for c in cids[len(asked) :]][: max(BLOCKS_IN_FLIGHT - len(open_), 0)]
                if more:
                    asked.extend(more)
                    try:
                        async with asyncio.timeout_at(deadline):  # (as in have)
                            await self._send(peer, BitswapMessage(wants=tuple(Want(c) for c in more)))
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
                peer, BitswapMessage(wants=tuple(Want(c, cancel=True, send_dont_have=False) for c in cids))
            )
        except LatticaError:
            pass  # (the peer is gone: nothing to cancel there)

    def _wait_for(self, peer: PeerId, cids: list[Cid], waiter: _Waiter) -> None:
        for c in cids:
            self._waiting[(peer, c)].append(waiter)

    def _done(self, peer: PeerId, cids: list[Cid], waiter: _Waiter) -> None:
        for c in cids:
            ws = self._waiting.get((peer, c))
            if ws is not None:
                if waiter in ws:
                    ws.remove(waiter)
                if not ws:
                    del self._waiting[(peer, c)]
