"""The ``sdk_rpc`` service: the Lattica SDK's RPC (``/rpc/req-resp/1.0.0``, ``/rpc/stream/1.0.0``;
the wire: ``lattica.sdk._wire``), served and called by our node (issue 50).

**Serving.** ``serve(instance)`` makes its public methods callable by SDK nodes as
``ClassName.method``; ``instance`` may be an actor's ref (an actor anywhere in the mesh, called
by this node on the SDK node's behalf, given the request's bytes). A method's parameter typed with a protobuf class (one with
``ParseFromString``) gets the request parsed into it; otherwise it gets the bytes; one without
parameters gets nothing. It returns bytes, text, a protobuf message or None; a generator (or an
async generator) is a streaming method whose items go out one by one (the SDK's
``call_stream_iter``). Sync methods run in a worker thread, async ones on the node loop. A
request whose data is a pickle (what the SDK sends for a method without protobuf types) is
refused with an error that says so: nothing from the network is unpickled here.

**Calling.** ``call`` asks an SDK node's method over ``/rpc/req-resp/1.0.0`` (a stream per call);
``stream`` over ``/rpc/stream/1.0.0`` (one long-lived stream per peer, calls told apart by id),
the answer's items as they come, each within ``timeout`` of the one before (else the call is
cancelled: :class:`~lattica.errors.SdkStreamIdle`). An error answer raises
:class:`~lattica.errors.SdkCallError`, a pickled answer :class:`~lattica.errors.PickleRefused`.

**Bounds.** What a peer sends is held against the node's budget for partly received messages
(a stranger's share: SDK nodes are strangers to a mesh that does not list them); at most
``MAX_CALLS`` calls of one peer are served at once (``MAX_CALLS_ALL`` in all, of which strangers
hold at most half, and strangers from one address, an IPv6 /64, ``MAX_STRANGER_CALLS_PER_ADDRESS``),
beyond which the caller is told to retry; a request or answer is at most ``MAX_MESSAGE`` bytes; a req-resp
request must start, and keep coming, within the budget's deadline; an answer the caller does not
take within ``SEND_TIMEOUT`` has its stream reset (and its calls' slots freed). Of an object,
only the public functions its class defines are served (``_served_methods``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import os
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, get_type_hints

from lattica._interfaces import addr_host_key
from lattica._runtime.limits import AGEN, GEN, LIFECYCLE_HOOKS
from lattica._runtime.refs import ActorRef
from lattica.errors import (
    FrameTooLarge,
    LatticaError,
    PickleRefused,
    ProtocolError,
    SdkCallError,
    SdkStreamIdle,
    Timeout,
)
from lattica.logging import get_logger
from lattica.sdk import _wire as w

if TYPE_CHECKING:
    from lattica._hostview import HostView
    from lattica._identity import PeerId
    from lattica._runtime.calls import Calls
    from lattica._runtime.partials import PartialMessages
    from lattica.transports.base import Connection, Stream

log = get_logger("lattica.sdk")

__all__ = [
    "SdkRpcService",
    "MAX_MESSAGE",
    "MAX_CALLS",
    "MAX_CALLS_ALL",
    "MAX_STRANGER_CALLS_PER_ADDRESS",
    "CHUNK",
    "SEND_TIMEOUT",
    "TIMEOUT",
]

MAX_MESSAGE = 256 * 1024 * 1024  # bytes of one request or answer (the SDK caps neither)
CHUNK = 16 * 1024 * 1024  # bytes of one Data frame's data (the SDK's chunk size)
MAX_FRAME = CHUNK + 2 * w.MAX_TEXT + 64  # a frame's bytes: a chunk, its id, its header
MAX_CALLS = 16  # calls of one peer served at once
MAX_CALLS_ALL = 256  # and of all peers
# and of strangers from one address (an IPv6 /64; a relayed one, its relay's): identities are
# free, addresses are not, so holding the strangers' half (128) takes 4 of them, however the
# calls are re-issued (hostile review: 8 identities held it for good, re-calling as answers timed out)
MAX_STRANGER_CALLS_PER_ADDRESS = 32
QUEUE = 64  # items of a streaming answer read ahead of its consumer (then the stream waits)
QUEUE_BYTES = 32 * 1024 * 1024  # and their bytes (an item larger still goes, alone)
TIMEOUT = 180.0  # s a call waits for its answer, and a streaming call for each item (the SDK's request timeout)
SEND_TIMEOUT = 30.0  # s an answer waits for the caller's window before its stream is reset
_READ = 1 << 20
PICKLE_REFUSED = (
    "this Lattica node never unpickles: the request's data is a pickle; declare the method's "
    "request and response types as protobuf classes (*_pb2) on the SDK side, or send bytes"
)


class SdkRpcService:
    """Serve SDK calls to this node's registered instances, and call SDK nodes' methods."""

    def __init__(self, runtime: Calls) -> None:
        self.rt = runtime
        self.host: HostView = runtime.host
        self.partials: PartialMessages = runtime.partials
        self._services: dict[str, Any] = {}
        self._methods: dict[str, frozenset[str]] = {}  # what SDK nodes may call of each served object
        self._serving: dict[PeerId, int] = {}
        self._serving_all = 0
        self._as_stranger: dict[PeerId, int] = {}  # of a peer's calls, those taken as a stranger's
        self._serving_strangers = 0
        self._source_of: dict[PeerId, str] = {}  # a stranger's address its calls count against (while it has some)
        self._by_source: dict[str, int] = {}  # strangers' calls by address
        self._out: dict[PeerId, _CallStream] = {}
        self._ids = itertools.count()
        self._prefix = os.urandom(4).hex()
        self.host.set_handler(w.REQ_RESP, self._on_req_resp)
        self.host.set_handler(w.STREAM, self._on_stream)

    # -- the node's side ---------------------------------------------------------------------------

    def serve(self, instance: Any, name: str | None = None) -> str:
        """Serve ``instance``'s public methods as ``name.method`` (its class's name by default);
        the name."""
        if name is None:
            name = instance.name.rsplit("/", 1)[-1] if isinstance(instance, ActorRef) else type(instance).__name__
        if not name or "." in name:
            raise ValueError(f"an SDK service's name is a non-empty word without dots, not {name!r}")
        self._services[name] = instance
        if not isinstance(instance, ActorRef):
            self._methods[name] = _served_methods(type(instance))
        return name

    def unserve(self, name: str) -> None:
        self._services.pop(name, None)
        self._methods.pop(name, None)

    def services(self) -> list[str]:
        return sorted(self._services)

    def _next_id(self) -> str:
        return f"lattica-{self._prefix}-{next(self._ids)}"

    async def call(self, peer: PeerId, method: str, data: bytes, timeout: float = TIMEOUT) -> bytes:
        """Call ``method`` ("Service.method") on ``peer`` over req-resp; its answer's bytes."""
        _check_method(method)
        request_id = self._next_id()
        try:
            async with asyncio.timeout(timeout):
                stream = await self.host.open_stream(peer, w.REQ_RESP)
                try:
                    stream.write(w.encode_message(w.Request(request_id, method, data)))
                    await stream.close()  # (half-close: the SDK reads the request to its end)
                    answer = w.decode_message(await self._read_all(stream, peer, None))
                except BaseException:
                    stream.reset()
                    raise
        except TimeoutError as e:
            if isinstance(e, Timeout):
                raise
            raise Timeout(f"{peer} did not answer {method} within {timeout:.0f} s") from None
        if isinstance(answer, w.Failure):
            raise SdkCallError(f"{peer} answered {method}: {answer.error}")
        if not isinstance(answer, w.Response):
            raise ProtocolError(f"{peer} answered {method} with a request")
        if answer.compression is not None:
            raise ProtocolError(f"{peer} answered {method} compressed; this node reads uncompressed answers only")
        if w.looks_pickled(answer.data):
            raise PickleRefused(
                f"{peer} answered {method} with a pickle, which this node never loads: give the SDK method a "
                "protobuf return type (*_pb2)"
            )
        return answer.data

    async def stream(self, peer: PeerId, method: str, data: bytes, timeout: float = TIMEOUT) -> AsyncIterator[bytes]:
        """Call ``method`` on ``peer`` over the stream protocol; its answer's items as they come
        (one for a method that answers once). Each item (the first counted from the call) must
        come within ``timeout`` s, else the call is cancelled and :class:`SdkStreamIdle` raised:
        a peer that accepts the call and never answers holds the caller no longer."""
        _check_method(method)
        request_id = self._next_id()
        try:
            async with asyncio.timeout(timeout):
                out = self._out.get(peer)
                if out is None or out.broken:
                    conn = await self.host.get_connection(peer)
                    stream = await self.host.open_stream_on(conn, w.STREAM)
                    out = self._out[peer] = _CallStream(self.host, peer, stream, lambda: self._out.pop(peer, None))
                queue = await out.request(request_id, method, data)
        except TimeoutError as e:
            if isinstance(e, Timeout):
                raise
            raise SdkStreamIdle(
                f"{peer} could not be asked {method} within {timeout:g} s; a slow path to it needs a longer "
                "timeout (stub(...).method.stream(request, timeout=...))"
            ) from None
        try:
            while True:
                try:
                    async with asyncio.timeout(timeout):
                        kind, value = await queue.get()
                except TimeoutError:
                    raise SdkStreamIdle(
                        f"{peer} sent no item of {method} for {timeout:g} s, so the call was cancelled; if the "
                        "method pauses longer between items, pass a longer timeout "
                        "(stub(...).method.stream(request, timeout=...))"
                    ) from None
                if kind == "data":
                    out.took(request_id, len(value))
                    if w.looks_pickled(value):
                        raise PickleRefused(
                            f"{peer} answered {method} with a pickle, which this node never loads: give the "
                            "SDK method a protobuf return type (*_pb2)"
                        )
                    yield value
                elif kind == "error":
                    raise SdkCallError(f"{peer} answered {method}: {value}")
                else:
                    return
        finally:
            out.done(request_id)

    # -- serving -----------------------------------------------------------------------------------

    async def _read_all(self, stream: Stream, peer: PeerId, first: float | None) -> bytes:
        """A req-resp message: the stream read to its end, held against the partly-received
        budget, at most MAX_MESSAGE bytes: its first byte within ``first`` seconds (None: as
        long as the caller waits), then no pause longer than the budget's deadline, and the
        whole within that deadline plus its declared size at the budget's minimum rate after
        its first byte, as an actor call's message (hostile review: a request that stalled or
        trickled held its stream for 17 minutes, out of the 512 all strangers share)."""
        stranger = self.host.circle_of(peer) == "stranger"
        got = bytearray()
        budget = self.partials.budget
        loop = asyncio.get_running_loop()
        due = 0.0  # loop time the whole message is due by (from its first byte)
        size: int | None = None
        try:
            while True:
                wait = first if not got else min(budget.deadline, due - loop.time())
                if wait is not None and wait <= 0:
                    raise TimeoutError
                async with asyncio.timeout(wait):
                    chunk = await stream.read(_READ)
                if not chunk:
                    break
                if len(got) + len(chunk) > min(MAX_MESSAGE, size or MAX_MESSAGE):
                    raise FrameTooLarge(f"an SDK RPC message over {size or MAX_MESSAGE} bytes")
                self.partials.change(peer, len(got), len(got) + len(chunk), stranger)
                if not got:
                    due = loop.time() + budget.deadline + MAX_MESSAGE / budget.min_rate
                got += chunk
                if size is None and (size := w.message_size(got)) is not None:
                    if size > MAX_MESSAGE:
                        raise FrameTooLarge(f"an SDK RPC message of {size} bytes declared (at most {MAX_MESSAGE})")
                    due += (size - MAX_MESSAGE) / budget.min_rate
        finally:
            self.partials.change(peer, len(got), 0, stranger)
        return bytes(got)

    def _admit(self, peer: PeerId, conn: Connection) -> str | None:
        """Take a call slot for ``peer`` (None), or say why it is busy. Strangers together take
        at most half of ``MAX_CALLS_ALL``: identities cost nothing, and (hostile review) 16 of
        them held every slot, renewing their hold as fast as answers time out, so every member
        was told "busy". Strangers from one address (``conn``'s: an IPv6 /64, a relay's for a
        relayed peer) take at most ``MAX_STRANGER_CALLS_PER_ADDRESS``: re-issuing calls as
        fast as they end, 8 identities held the strangers' half for good, and every SDK node
        outside the mesh was told "busy"; now that takes 4 addresses."""
        stranger = self.host.circle_of(peer) == "stranger"
        if self._serving.get(peer, 0) >= MAX_CALLS:
            return f"busy: more than {MAX_CALLS} calls from you at once; try again"
        if self._serving_all >= MAX_CALLS_ALL or (stranger and self._serving_strangers >= MAX_CALLS_ALL // 2):
            return "busy: this node serves too many calls; try again"
        if stranger:
            source = self._source_of.get(peer) or addr_host_key(conn.remote_addr)
            if self._by_source.get(source, 0) >= MAX_STRANGER_CALLS_PER_ADDRESS:
                return (
                    f"busy: peers outside this node's mesh hold {MAX_STRANGER_CALLS_PER_ADDRESS} calls from your "
                    "address at once; try again"
                )
            self._source_of[peer] = source
            self._by_source[source] = self._by_source.get(source, 0) + 1
            self._as_stranger[peer] = self._as_stranger.get(peer, 0) + 1
            self._serving_strangers += 1
        self._serving[peer] = self._serving.get(peer, 0) + 1
        self._serving_all += 1
        return None

    def _release(self, peer: PeerId) -> None:
        self._serving_all -= 1
        n = self._serving.get(peer, 1) - 1
        if n:
            self._serving[peer] = n
        else:
            self._serving.pop(peer, None)
        k = self._as_stranger.get(peer, 0)
        if k:
            self._serving_strangers -= 1
            source = self._source_of[peer]
            left = self._by_source[source] - 1
            if left:
                self._by_source[source] = left
            else:
                del self._by_source[source]
            if k > 1:
                self._as_stranger[peer] = k - 1
            else:
                del self._as_stranger[peer]
                del self._source_of[peer]

    async def _on_req_resp(self, stream: Stream, conn: Connection) -> None:
        peer = conn.remote_peer
        try:
            request = w.decode_message(await self._read_all(stream, peer, self.partials.budget.deadline))
            if not isinstance(request, w.Request):
                raise ProtocolError("an SDK RPC stream opened with an answer")
        except (LatticaError, TimeoutError) as e:
            log.info("SDK RPC request refused", peer=str(peer), reason=str(e) or type(e).__name__)
            stream.reset()
            return
        answer: w.Message
        if request.compression is not None:
            answer = w.Failure(request.id, "this node takes uncompressed requests only")
        elif busy := self._admit(peer, conn):
            answer = w.Failure(request.id, busy)
        else:
            try:
                result = await self._invoke(request.method, request.data)
                if not isinstance(result, bytes):
                    await _close(result)
                    raise _Refused(f"{request.method} streams: call it with call_stream_iter")
                answer = w.Response(request.id, result)
            except Exception as e:  # (the method's failure, told to the caller)
                answer = w.Failure(request.id, _describe(e))
            finally:
                self._release(peer)
        try:
            stream.write(w.encode_message(answer))
            await _drain(stream)
            await stream.close()
        except (LatticaError, OSError):
            stream.reset()

    async def _on_stream(self, stream: Stream, conn: Connection) -> None:
        """A peer's call stream: its requests' frames in, each call's answer out as it is ready."""
        peer = conn.remote_peer
        stranger = self.host.circle_of(peer) == "stranger"
        frames = w.Frames(MAX_FRAME)
        pending: dict[str, tuple[str, bytearray]] = {}  # request id -> (method, data so far)
        running: dict[str, asyncio.Task] = {}
        held = 0  # bytes of pending requests and of the frame being read, on the budget
        deadline = self.partials.budget.deadline
        try:
            while True:
                if held:  # (a request on the way must keep coming)
                    async with asyncio.timeout(deadline):
                        chunk = await stream.read(_READ)
                else:
                    chunk = await stream.read(_READ)
                if not chunk:
                    break
                for frame in frames.feed(chunk):
                    if isinstance(frame, w.StreamRequest):
                        if frame.id in pending or frame.id in running:
                            raise ProtocolError(f"an SDK stream request id used twice: {frame.id!r}")
                        if len(pending) + len(running) >= MAX_CALLS:
                            _send(stream, w.Failure(frame.id, f"busy: more than {MAX_CALLS} calls at once"))
                            _send(stream, w.Close(frame.id))
                            continue
                        pending[frame.id] = (frame.method, bytearray(frame.data))
                    elif isinstance(frame, w.Data):
                        entry = pending.get(frame.id)
                        if entry is None:
                            continue  # (a call refused above, or cancelled)
                        if len(entry[1]) + len(frame.data) > MAX_MESSAGE:
                            raise FrameTooLarge(f"an SDK stream request over {MAX_MESSAGE} bytes")
                        entry[1].extend(frame.data)
                        if frame.is_end:
                            del pending[frame.id]
                            running[frame.id] = self.host.spawn(
                                self._serve_stream_call(stream, conn, frame.id, entry[0], bytes(entry[1]), running)
                            )
                    elif isinstance(frame, w.Cancel):
                        pending.pop(frame.id, None)
                        task = running.get(frame.id)
                        if task is not None:
                            task.cancel()
                new = sum(len(d) for _, d in pending.values()) + frames.pending
                self.partials.change(peer, held, new, stranger)
                held = new
        except (LatticaError, TimeoutError) as e:
            log.info("SDK RPC stream dropped", peer=str(peer), reason=str(e) or type(e).__name__)
            stream.reset()
        finally:
            self.partials.change(peer, held, 0, stranger)
            for task in list(running.values()):
                task.cancel()

    async def _serve_stream_call(
        self, stream: Stream, conn: Connection, request_id: str, method: str, data: bytes, running: dict
    ) -> None:
        peer = conn.remote_peer
        if busy := self._admit(peer, conn):
            _send(stream, w.Failure(request_id, busy))
            _send(stream, w.Close(request_id))
            running.pop(request_id, None)
            return
        try:
            result = await self._invoke(method, data)
            if isinstance(result, bytes):
                for at in range(0, len(result), CHUNK):
                    _send(stream, w.Data(request_id, result[at : at + CHUNK], at + CHUNK >= len(result)))
                    await _drain(stream)
            else:
                async for item in _items(result):
                    _send(stream, w.Data(request_id, item, False))
                    await _drain(stream)
            _send(stream, w.Close(request_id))
        except asyncio.CancelledError:
            with contextlib.suppress(LatticaError, OSError):  # (the stream may be gone: then we are done)
                _send(stream, w.Close(request_id))  # (the caller's Cancel)
        except (LatticaError, OSError):
            return  # (the stream broke, or the caller takes nothing: _drain reset it)
        except Exception as e:  # (the method's failure, told to the caller)
            _send(stream, w.Failure(request_id, _describe(e)))
            _send(stream, w.Close(request_id))
        finally:
            self._release(peer)
            running.pop(request_id, None)
        try:
            await _drain(stream)
        except (LatticaError, OSError):
            pass

    async def _invoke(self, method: str, data: bytes) -> Any:
        """Run ``method`` ("Service.method") on ``data``: its answer's bytes, or a (sync or
        async) generator of them for a streaming method."""
        service, _, name = method.partition(".")
        instance = self._services.get(service)
        if instance is None:
            raise _Refused(f"no service {service!r} here (serving: {', '.join(sorted(self._services)) or 'none'})")
        if isinstance(instance, ActorRef):
            return await _on_actor(instance, service, name, data)
        fn = getattr(instance, name, None) if name in self._methods.get(service, ()) else None
        if not callable(fn):
            raise _Refused(f"{service} has no method {name!r}")
        if w.looks_pickled(data):
            raise _Refused(PICKLE_REFUSED)
        args = _arguments(fn, data)
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            return fn(*args)
        if inspect.iscoroutinefunction(fn):
            return _to_bytes(await fn(*args))
        return _to_bytes(await asyncio.to_thread(fn, *args))

    def close(self) -> None:
        for out in list(self._out.values()):
            out.stream.reset()
        self._out.clear()


async def _on_actor(ref: ActorRef, service: str, name: str, data: bytes) -> Any:
    """``name`` of the actor behind ``ref`` called with the request's bytes: its answer, or for a
    generator method an async generator of its items."""
    kind = ref.methods.get(name)
    if kind is None:
        raise _Refused(f"{service} has no method {name!r}")
    if w.looks_pickled(data):
        raise _Refused(PICKLE_REFUSED)
    handle = getattr(ref, name)
    if kind in (GEN, AGEN):
        return (item async for item in handle.stream(data))
    return _to_bytes(await handle.remote(data))


def _served_methods(cls: type) -> frozenset[str]:
    """What SDK nodes may call of an object of ``cls``: the public functions its class defines
    or inherits from Python classes. Never an attribute of the object itself, a builtin's
    method (``dict.clear``), a static or class method, a nested class, or an actor's lifecycle
    hook (hostile review: each of those ran, emptying or replacing the state it served)."""
    return frozenset(
        name
        for name in dir(cls)
        if not name.startswith("_")
        and name not in LIFECYCLE_HOOKS
        and inspect.isfunction(inspect.getattr_static(cls, name, None))
    )


class _Refused(Exception):
    """A call this node will not run (unknown method, pickled data): told to the caller as is."""


class _CallStream:
    """Our long-lived ``/rpc/stream/1.0.0`` stream to one peer: requests out, answers' frames
    dispatched to each call's queue by id (a full queue, ``QUEUE`` items or ``QUEUE_BYTES``,
    holds the reader: the peer waits)."""

    def __init__(self, host: HostView, peer: PeerId, stream: Stream, forget: Callable[[], Any]) -> None:
        self.host = host
        self.peer = peer
        self.stream = stream
        self.broken = False
        self._calls: dict[str, asyncio.Queue] = {}
        self._queued: dict[str, int] = {}  # bytes of each call's items waiting for its consumer
        self._taken = asyncio.Event()  # a consumer took an item (or stopped)
        self._forget = forget
        self._reader = host.spawn(self._read())

    async def request(self, request_id: str, method: str, data: bytes) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue(QUEUE)
        self._calls[request_id] = queue
        try:
            _send(self.stream, w.StreamRequest(request_id, method, b""))
            if not data:
                _send(self.stream, w.Data(request_id, b"", True))
            for at in range(0, len(data), CHUNK):
                _send(self.stream, w.Data(request_id, data[at : at + CHUNK], at + CHUNK >= len(data)))
                await self.stream.drain()
            await self.stream.drain()
        except BaseException:
            self._calls.pop(request_id, None)
            raise
        return queue

    def took(self, request_id: str, n: int) -> None:
        """The consumer of ``request_id`` took an item of ``n`` bytes."""
        left = self._queued.get(request_id, 0) - n
        if left > 0:
            self._queued[request_id] = left
        else:
            self._queued.pop(request_id, None)
        self._taken.set()

    async def _put(self, request_id: str, queue: asyncio.Queue, data: bytes) -> None:
        """An item for ``request_id``'s consumer, once what waits for it leaves room (hostile
        review: items counted alone let a peer's 16 MiB items hold 256 MiB per call)."""
        while (held := self._queued.get(request_id, 0)) and held + len(data) > QUEUE_BYTES:
            if self._calls.get(request_id) is not queue:
                return  # (its consumer stopped meanwhile)
            self._taken.clear()
            await self._taken.wait()
        self._queued[request_id] = self._queued.get(request_id, 0) + len(data)
        await queue.put(("data", data))

    def done(self, request_id: str) -> None:
        """The caller stopped reading ``request_id``: if it was still coming, it is cancelled."""
        self._queued.pop(request_id, None)
        self._taken.set()
        queue = self._calls.pop(request_id, None)
        if queue is None:
            return
        while not queue.empty():  # (a reader waiting to put into it goes on)
            queue.get_nowait()
        if not self.broken:
            try:
                _send(self.stream, w.Cancel(request_id))
            except (LatticaError, OSError):
                pass

    async def _read(self) -> None:
        frames = w.Frames(MAX_FRAME)
        sizes: dict[str, int] = {}
        try:
            while chunk := await self.stream.read(_READ):
                for frame in frames.feed(chunk):
                    queue = self._calls.get(frame.id)
                    if queue is None:
                        continue
                    if isinstance(frame, w.Data):
                        sizes[frame.id] = sizes.get(frame.id, 0) + len(frame.data)
                        if sizes[frame.id] > MAX_MESSAGE:
                            await queue.put(("error", f"an answer over {MAX_MESSAGE} bytes"))
                            self._calls.pop(frame.id, None)
                            continue
                        if frame.data or not frame.is_end:
                            await self._put(frame.id, queue, frame.data)
                    elif isinstance(frame, w.Failure):
                        await queue.put(("error", frame.error))
                    elif isinstance(frame, w.Close):
                        sizes.pop(frame.id, None)
                        await queue.put(("close", None))
        except (LatticaError, TimeoutError, OSError) as e:
            log.info("SDK RPC call stream ended", peer=str(self.peer), reason=str(e) or type(e).__name__)
        finally:
            self.broken = True
            self._forget()
            self.stream.reset()
            for queue in self._calls.values():
                while queue.full():
                    queue.get_nowait()
                queue.put_nowait(("error", "the call stream to the peer ended"))


async def _close(gen: Any) -> None:
    """A streaming method's generator that will not be run: closed, so it never warns."""
    if inspect.isasyncgen(gen):
        await gen.aclose()
    else:
        gen.close()


async def _drain(stream: Stream) -> None:
    """What we wrote on ``stream``, taken by the peer within ``SEND_TIMEOUT``; else the stream
    is reset (TimeoutError): a caller that never reads holds neither our tasks nor its calls'
    slots (hostile review: 16 identities held all 256 for good, and every SDK node was busy)."""
    try:
        async with asyncio.timeout(SEND_TIMEOUT):
            await stream.drain()
    except TimeoutError:
        stream.reset()
        raise


def _send(stream: Stream, frame: w.Frame) -> None:
    stream.write(w.encode_frame(frame))


def _check_method(method: str) -> None:
    service, _, name = method.partition(".")
    if not service or not name or "." in name:
        raise ValueError(f"an SDK method is named 'Service.method', not {method!r}")


def _describe(e: BaseException) -> str:
    if isinstance(e, _Refused):
        return str(e)
    return f"{type(e).__name__}: {e}"[: w.MAX_TEXT // 2]


def _is_protobuf(t: Any) -> bool:
    return isinstance(t, type) and hasattr(t, "ParseFromString") and hasattr(t, "SerializeToString")


def _arguments(fn: Callable[..., Any], data: bytes) -> tuple:
    """What ``fn`` is called with: nothing, the request parsed into its parameter's protobuf
    class, or the bytes."""
    params = [
        p for p in inspect.signature(fn).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if not params:
        return ()
    try:
        hint = get_type_hints(fn).get(params[0].name)
    except Exception:  # (hints naming what cannot be resolved: take bytes)
        hint = None
    if hint is not None and _is_protobuf(hint):
        message = hint()
        try:
            message.ParseFromString(data)
        except Exception as e:
            raise _Refused(f"the request is not a {hint.__name__}: {e}") from None
        return (message,)
    return (data,)


def _to_bytes(value: Any) -> bytes:
    """A method's answer on the wire: bytes as they are, text as UTF-8, a protobuf message
    serialized, None as nothing."""
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    serialize = getattr(value, "SerializeToString", None)
    if callable(serialize):
        return bytes(serialize())
    raise TypeError(f"an SDK method returns bytes, text, a protobuf message or None, not {type(value).__name__}")


async def _items(gen: Any) -> AsyncIterator[bytes]:
    """A streaming method's items as bytes: an async generator's on the loop, a sync generator's
    each taken in a worker thread (a blocking producer must not stall the node)."""
    if inspect.isasyncgen(gen):
        async for item in gen:
            yield _to_bytes(item)
        return
    done = object()
    try:
        while (item := await asyncio.to_thread(next, gen, done)) is not done:
            yield _to_bytes(item)
    finally:
        gen.close()
