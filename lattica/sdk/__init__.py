"""Calling and serving the Lattica SDK's RPC (docs/sdk.md): our node as a peer of an SDK swarm.

    lattica.init(bootstrap=[sdk_node_addr])        # the SDK's swarm: identify "/lattica/1.0.0"
    lattica.sdk.serve(Echo())                      # SDK nodes call "Echo.echo", "Echo.count"
    echo = lattica.sdk.stub(sdk_peer_id, "Echo")   # an SDK node's service
    echo.echo.remote(b"hi").result()               # bytes, or ``returns=MyReply`` (a *_pb2 class)
    for item in echo.count.stream(b"3"): ...       # a streaming method's items (each within 180 s)

Payloads are bytes or protobuf messages; nothing is ever pickled or unpickled (a pickled payload
from an SDK node is refused with :class:`~lattica.errors.PickleRefused`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from lattica._identity import PeerId
from lattica._runtime import on_loop, run_coroutine

if TYPE_CHECKING:
    from lattica._future import Future
    from lattica._node import Node
    from lattica._runtime import Runtime
    from lattica.actors.sdk_rpc import SdkRpcService

__all__ = ["serve", "unserve", "services", "stub", "Stub", "Method", "ItemStream"]


def _service(node: Node | None) -> tuple[Runtime, SdkRpcService]:
    from lattica.services import running_services  # (the table imports every service)

    rt, services = running_services(node)
    return rt, services.sdk_rpc


def serve(instance: Any, name: str | None = None, *, node: Node | None = None) -> str:
    """Let SDK nodes call ``instance``'s public methods as ``name.method`` (``name``: its class's
    name by default, as the SDK names a ``ConnectionHandler``); the name. A method's parameter
    typed with a protobuf class gets the request parsed into it, otherwise the bytes; it returns
    bytes, text, a protobuf message or None; a generator streams its items."""
    rt, svc = _service(node)
    served: str = on_loop(rt, lambda: svc.serve(instance, name))
    return served


def unserve(name: str, *, node: Node | None = None) -> None:
    rt, svc = _service(node)
    on_loop(rt, lambda: svc.unserve(name))


def services(*, node: Node | None = None) -> list[str]:
    """The names this node serves to SDK nodes."""
    rt, svc = _service(node)
    names: list[str] = on_loop(rt, svc.services)
    return names


def stub(peer: PeerId | str, service: str, *, node: Node | None = None) -> Stub:
    """An SDK node's ``service``: ``stub.method.remote(request)``, ``stub.method.stream(request)``."""
    if "." in service or not service:
        raise ValueError(f"an SDK service's name is a word without dots, not {service!r}")
    return Stub(PeerId.from_string(peer) if isinstance(peer, str) else peer, service, node)


class Stub:
    """An SDK node's service; its attributes are its methods (:class:`Method`)."""

    def __init__(self, peer: PeerId, service: str, node: Node | None) -> None:
        self.peer = peer
        self.service = service
        self.node = node

    def __getattr__(self, name: str) -> Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return Method(self, name)

    def __repr__(self) -> str:
        return f"<SDK service {self.service} on {self.peer}>"


class Method:
    """One method of an SDK node's service."""

    def __init__(self, stub: Stub, name: str) -> None:
        self._stub = stub
        self.name = f"{stub.service}.{name}"

    def remote(self, request: Any = None, *, returns: type | None = None, timeout: float = 180.0) -> Future:
        """Call it once (``/rpc/req-resp/1.0.0``); a Future of the answer: bytes, or parsed into
        ``returns`` (a protobuf class). ``request``: bytes, text or a protobuf message."""
        rt, svc = _service(self._stub.node)
        data = _payload(request)
        return run_coroutine(rt, lambda: svc.call(self._stub.peer, self.name, data, timeout), _parser(returns))

    def stream(self, request: Any = None, *, returns: type | None = None, timeout: float = 180.0) -> ItemStream:
        """Call it over the stream protocol (the SDK's ``call_stream_iter``, or ``call_stream``
        for a method that answers once); its items, in order, as they come. Each must come
        within ``timeout`` s of the one before (the first, of the call): else the call is
        cancelled and :class:`~lattica.errors.SdkStreamIdle` raised."""
        rt, svc = _service(self._stub.node)
        items = svc.stream(self._stub.peer, self.name, _payload(request), timeout)
        return ItemStream(rt, items, _parser(returns))


class ItemStream:
    """A streaming answer's items: ``for`` from a thread, ``async for`` on the node's loop;
    ``close()`` (or ``break``) cancels the rest."""

    def __init__(self, rt: Runtime, items: AsyncIterator[bytes], parse: Any) -> None:
        self._rt = rt
        self._items = items
        self._parse = parse or (lambda b: b)

    def __aiter__(self) -> ItemStream:
        return self

    async def __anext__(self) -> Any:
        return self._parse(await self._items.__anext__())

    def __iter__(self) -> ItemStream:
        return self

    def __next__(self) -> Any:
        if threading.get_ident() == self._rt.host.thread_id:
            raise RuntimeError("on the node loop, iterate an SDK stream with `async for`")
        try:
            return self._parse(asyncio.run_coroutine_threadsafe(self._next(), self._rt.loop).result())
        except StopAsyncIteration:
            raise StopIteration from None

    async def _next(self) -> bytes:
        return await self._items.__anext__()

    def close(self) -> None:
        """Cancel the call: the SDK node stops sending."""
        closing = self._items.aclose()  # type: ignore[attr-defined]
        if threading.get_ident() == self._rt.host.thread_id:
            self._rt.loop.create_task(closing)
        else:
            asyncio.run_coroutine_threadsafe(closing, self._rt.loop).result()


def _payload(request: Any) -> bytes:
    if request is None:
        return b""
    if isinstance(request, bytes):
        return request
    if isinstance(request, (bytearray, memoryview)):
        return bytes(request)
    if isinstance(request, str):
        return request.encode()
    serialize = getattr(request, "SerializeToString", None)
    if callable(serialize):
        return bytes(serialize())
    raise TypeError(
        f"an SDK call carries bytes, text or a protobuf message, not {type(request).__name__} (nothing is pickled)"
    )


def _parser(returns: type | None) -> Any:
    if returns is None:
        return None
    if not hasattr(returns, "ParseFromString"):
        raise TypeError(f"returns= takes a protobuf class, not {returns!r}")

    def parse(data: bytes) -> Any:
        message = returns()
        message.ParseFromString(data)
        return message

    return parse
