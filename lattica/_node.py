"""The node: one event loop thread that owns every socket, connection and protocol object.

``Node`` is the thread-safe handle users hold (sync methods, plus ``a``-prefixed coroutine versions
usable from any event loop). The ``Host`` (``lattica/_host/``) lives on the node loop and does the
work; ``Node`` starts it on a loop thread of its own (or a shared loop) and bridges calls to it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import dataclasses
import os
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from lattica._code.library import ACCEPT
from lattica._host import Host, StreamProtocolHandler, check_protocol_name
from lattica._identify import PeerInfo
from lattica._identity import KeyPair, PeerId
from lattica._loop import DEFAULT_BUSY_POLL_US, new_loop
from lattica._multiaddr import Multiaddr
from lattica._placement import RESOURCES
from lattica.config import (
    AGENT_VERSION,
    DEFAULT_SPILL_LIMIT,
    DRAIN_GRACE,
    LIBP2P_PROTOCOL_VERSION,
    ContentConfig,
    CrdtConfig,
    DashboardConfig,
    DhtConfig,
    InboundBudget,
    KadConfig,
    MembershipConfig,
    NatConfig,
    NodeConfig,
    PubSubConfig,
    RelayConfig,
    RendezvousConfig,
    SdkConfig,
    dashboard_config,
)
from lattica.errors import NodeClosed, Timeout
from lattica.logging import get_logger
from lattica.nat._manager import NatStatus
from lattica.transports.base import Stream
from lattica.trust import Credential, Trust, load_trust

if TYPE_CHECKING:
    from lattica.transports.memory import MemoryNetwork

__all__ = ["Node", "PeerInfo"]

log = get_logger("lattica.node")
T = TypeVar("T")


_THREADED: weakref.WeakSet[Node] = weakref.WeakSet()  # nodes running on a loop thread of their own


def _with_sdk_topic(pubsub: PubSubConfig | None, sdk: SdkConfig | None) -> PubSubConfig | None:
    """Pub-sub's configuration with an SDK swarm's relay topic opened to strangers and published
    as libp2p does (SDK nodes are strangers, and speak only that form)."""
    if pubsub is None or sdk is None:
        return pubsub
    topic = sdk.relay_topic
    return dataclasses.replace(
        pubsub,
        open_topics=tuple(dict.fromkeys((*pubsub.open_topics, topic))),
        libp2p_topics=tuple(dict.fromkeys((*pubsub.libp2p_topics, topic))),
    )


@atexit.register
def _stop_threaded_nodes() -> None:
    """At interpreter exit, stop every node a script started and never stopped: its actors'
    on_stop hooks run and peers see a goodbye instead of a dead connection."""
    for node in list(_THREADED):
        try:
            node.stop()
        except Exception:
            log.exception("error while stopping a node at exit")


class Node:
    """A Lattica node: identity, listeners, connections, on its own event-loop thread.

    Use as a context manager or call :meth:`start` / :meth:`stop`. Sync methods may be called from
    any thread except the node loop; the ``a``-prefixed coroutines may be awaited from any loop.
    """

    def __init__(
        self,
        listen: Iterable[str | Multiaddr] = ("/ip4/127.0.0.1/tcp/0",),
        *,
        key_path: str | os.PathLike[str] | None = None,
        keypair: KeyPair | None = None,
        max_connections: int = 512,
        idle_timeout: float = 300.0,
        identify_timeout: float = 10.0,
        inbound: InboundBudget | None = None,
        dial_timeout: float = 10.0,
        agent_version: str = AGENT_VERSION,
        protocol_version: str = LIBP2P_PROTOCOL_VERSION,
        busy_poll_us: float = DEFAULT_BUSY_POLL_US,
        use_uvloop: bool | None = None,
        transport_options: dict[str, dict[str, Any]] | None = None,
        memory_network: MemoryNetwork | None = None,
        allow: Iterable[str] = (),
        code: Iterable[str] | bool | None = None,
        code_excludes: Iterable[str] = (),
        accept_code: str = "admins",
        dht_path: str | os.PathLike[str] | None = None,
        dht: DhtConfig | None = None,
        kad: bool | KadConfig | None = True,
        channel_idle: float = 60.0,
        spill_limit: int = DEFAULT_SPILL_LIMIT,
        drain_grace: float = DRAIN_GRACE,
        relay: bool | RelayConfig | None = False,
        relays: Iterable[str | Multiaddr] = (),
        nat: NatConfig | None = None,
        mdns: bool | None = None,
        labels: dict[str, str] | None = None,
        resources: dict[str, float] | None = None,
        membership: bool | MembershipConfig | None = True,
        mesh: Credential | list[Credential] | tuple[Credential, ...] | None = None,
        members: Iterable[PeerId | str] = (),
        content: bool | ContentConfig | None = True,
        pubsub: bool | PubSubConfig | None = True,
        sdk: bool | SdkConfig | None = None,
        crdt: bool | CrdtConfig | None = True,
        dashboard: bool | str | DashboardConfig | None = None,
        rendezvous: bool | RendezvousConfig | None = True,
    ) -> None:
        if keypair is not None and key_path is not None:
            raise ValueError("give key_path or keypair, not both")
        self.keypair = keypair or (KeyPair.load_or_create(key_path) if key_path else KeyPair.generate())
        self.peer_id: PeerId = self.keypair.peer_id
        # who may use this node beyond what the open network needs (docs/security.md): the mesh
        # key or certificate (default: LATTICA_MESH, else the user's key file), PeerIds by name
        self.trust: Trust = load_trust(self.peer_id, mesh, members)
        if accept_code not in ACCEPT:
            raise ValueError(f"accept_code must be one of {ACCEPT}, not {accept_code!r}")
        if not channel_idle > 0:
            raise ValueError("channel_idle must be > 0 seconds")
        if type(spill_limit) is not int or spill_limit < 0:
            raise ValueError(
                "spill_limit is a number of bytes (0: a call over the message cap fails instead of spilling)"
            )
        if not drain_grace > 0:
            raise ValueError("drain_grace must be > 0 seconds")
        if resources is not None and (set(resources) - set(RESOURCES) or any(v < 0 for v in resources.values())):
            raise ValueError(f"resources map {list(RESOURCES)} to amounts >= 0")
        dht_config: DhtConfig = dht or DhtConfig()
        if dht_path is not None:
            dht_config.persist_path = os.fspath(dht_path)
        sdk_config = (SdkConfig() if sdk is True else sdk) or None
        # a service's keyword: True (its defaults), a config of its own, or False/None (off)
        self.config = NodeConfig(
            listen=[Multiaddr(a) for a in listen],
            max_connections=max_connections,
            idle_timeout=idle_timeout,
            identify_timeout=identify_timeout,
            inbound=inbound or InboundBudget(),
            dial_timeout=dial_timeout,
            agent_version=agent_version,
            protocol_version=protocol_version,
            transport_options=transport_options or {},
            memory_network=memory_network,
            allow=list(allow),
            code=code if code is None or isinstance(code, bool) else [os.fspath(c) for c in code],
            code_excludes=list(code_excludes),
            accept_code=accept_code,
            channel_idle=channel_idle,
            spill_limit=spill_limit,
            drain_grace=drain_grace,
            relays=[Multiaddr(a) for a in relays],
            mdns=mdns,
            labels=dict(labels or {}),
            resources=dict(resources or {}),
            nat=nat or NatConfig(),
            dht=dht_config,
            kad=(KadConfig() if kad is True else kad) or None,
            relay=(RelayConfig() if relay is True else relay) or None,
            membership=(MembershipConfig() if membership is True else membership) or None,
            content=(ContentConfig() if content is True else content) or None,
            pubsub=_with_sdk_topic((PubSubConfig() if pubsub is True else pubsub) or None, sdk_config),
            sdk=sdk_config,
            crdt=(CrdtConfig() if crdt is True else crdt) or None,
            dashboard=dashboard_config(dashboard),
            rendezvous=(RendezvousConfig() if rendezvous is True else rendezvous) or None,
        )
        self._busy_poll_us = busy_poll_us
        self._use_uvloop = use_uvloop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._host: Host | None = None
        self._lock = threading.Lock()
        self._starting: asyncio.Future[None] | None = None  # an astart in progress
        self.started_at: float | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Node:
        """Start the loop thread and listen on every address; returns once listening."""
        with self._lock:
            if self._thread is not None:
                return self
            if self._host is not None or self._starting is not None:
                raise RuntimeError("this node runs on a shared loop (astart); it cannot also start a thread")
            t0 = time.perf_counter()
            loop = new_loop(self._busy_poll_us, self._use_uvloop)
            ready: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._loop = loop
            self._thread = threading.Thread(
                target=self._run, args=(loop, ready), name=f"lattica-node-{self.peer_id.short()}", daemon=True
            )
            self._thread.start()
            try:
                ready.result()
            except BaseException:
                self._thread.join()
                self._thread = self._loop = self._host = None
                raise
            self.started_at = time.perf_counter() - t0
            _THREADED.add(self)
            log.info("node started", peer_id=str(self.peer_id), addrs=[str(a) for a in self.addrs])
            return self

    def _run(self, loop: asyncio.AbstractEventLoop, ready: concurrent.futures.Future[None]) -> None:
        asyncio.set_event_loop(loop)

        async def boot() -> None:
            self._host = Host(self.config, self.keypair, self.trust)
            await self._host.start(self.config.listen)

        try:
            loop.run_until_complete(boot())
        except BaseException as e:
            if self._host is not None:
                loop.run_until_complete(self._host.stop())
            loop.close()
            ready.set_exception(e)
            return
        ready.set_result(None)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def stop(self) -> None:
        """Close every connection and listener, then end the loop thread."""
        with self._lock:
            if self._thread is None and self._host is not None:
                raise RuntimeError("this node runs on a shared loop (astart): stop it with `await node.astop()`")
            if self._thread is None or self._loop is None:
                return
            loop, thread, host = self._loop, self._thread, self._host
            if threading.current_thread() is thread:
                raise RuntimeError("Node.stop() cannot be called from the node's own loop")
            try:
                asyncio.run_coroutine_threadsafe(host.stop(), loop).result(10)  # type: ignore[union-attr]
            except Exception:
                log.exception("error while stopping the node")
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            self._thread = self._loop = self._host = None

    async def astart(self) -> Node:
        """Start on the running event loop instead of a loop thread of its own: for simulations
        (many nodes on one loop over the in-memory transport) and for embedding in an asyncio
        program. Blocking methods then cannot be used from that loop; use the ``a``-prefixed ones."""
        with self._lock:  # never held across an await: a second astart must not block the loop
            starting = self._starting
            if starting is None and (self._host is not None or self._thread is not None):
                return self
            if starting is None:
                self._loop = asyncio.get_running_loop()
                self._starting = starting = self._loop.create_future()
                owner = True
            else:
                owner = False
        if not owner:
            await asyncio.shield(starting)  # the first astart's outcome (raises its error)
            return self
        t0 = time.perf_counter()
        host = Host(self.config, self.keypair, self.trust)
        outcome: BaseException | None = NodeClosed("the node did not start")
        try:
            await host.start(self.config.listen)
            self._host = host
            self.started_at = time.perf_counter() - t0
            outcome = None
        except BaseException as e:
            outcome = e if not isinstance(e, asyncio.CancelledError) else NodeClosed("starting the node was cancelled")
            self._loop = None
            try:
                await host.stop()
            except Exception:
                log.exception("cleanup after a failed astart failed")
            raise
        finally:
            self._starting = None
            if outcome is None:
                starting.set_result(None)
            else:
                starting.set_exception(outcome)
                starting.exception()
        return self

    async def astop(self) -> None:
        """Stop a node started with :meth:`astart` (awaited on that same loop)."""
        if self._thread is not None:
            raise RuntimeError("this node runs its own loop thread: stop it with stop()")
        if self._starting is not None:
            await asyncio.shield(self._starting)
        if self._host is not None and asyncio.get_running_loop() is not self._loop:
            raise RuntimeError("astop() must be awaited on the loop the node was started on")
        host, self._host = self._host, None
        if host is not None:
            await host.stop()
        self._loop = None

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._host is not None

    @property
    def host(self) -> Host | None:
        """The running host (connections, runtime, services), None while stopped: for Lattica's
        own modules and tools (``lattica.dht``, the benchmarks, ``doctor``), not for applications."""
        return self._host

    # -- bridging to the loop -------------------------------------------------------------------

    def _submit(self, fn: Callable[[Host], Coroutine[Any, Any, T]]) -> concurrent.futures.Future[T]:
        loop, host = self._loop, self._host
        if loop is None or host is None:
            raise NodeClosed("the node is not running; call start() or use it as a context manager")
        return asyncio.run_coroutine_threadsafe(fn(host), loop)

    def _call(self, fn: Callable[[Host], Coroutine[Any, Any, T]]) -> T:
        host = self._host
        if host is not None and threading.get_ident() == host.thread_id:
            raise RuntimeError("blocking Node methods cannot run on the node loop; await the a-prefixed version")
        return self._submit(fn).result()

    async def _acall(self, fn: Callable[[Host], Coroutine[Any, Any, T]]) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running is self._loop:
            if self._host is None:
                raise NodeClosed("the node is not running")
            return await fn(self._host)
        return await asyncio.wrap_future(self._submit(fn))

    # -- public API -----------------------------------------------------------------------------

    @property
    def addrs(self) -> list[Multiaddr]:
        """Listen addresses, each ending in ``/p2p/<our PeerId>`` (dialable as they are)."""
        host = self._host
        if host is None:
            return []
        return [a.with_peer_id(self.peer_id) for a in host.listen_addrs]

    def _parse_target(self, target: str | Multiaddr | Iterable[str | Multiaddr]) -> list[Multiaddr]:
        if isinstance(target, (str, Multiaddr)):
            return [Multiaddr(target)]
        return [Multiaddr(a) for a in target]

    def connect(self, addr: str | Multiaddr | Iterable[str | Multiaddr], timeout: float | None = None) -> PeerInfo:
        """Dial the peer at ``addr`` (one or several multiaddrs ending in its /p2p/ id), authenticate
        and identify it; return what it told us. Reuses an existing connection."""
        addrs = self._parse_target(addr)
        return self._call(lambda h: h.connect(addrs, None, timeout or self.config.dial_timeout))

    async def aconnect(
        self, addr: str | Multiaddr | Iterable[str | Multiaddr], timeout: float | None = None
    ) -> PeerInfo:
        addrs = self._parse_target(addr)
        return await self._acall(lambda h: h.connect(addrs, None, timeout or self.config.dial_timeout))

    def ping(self, peer: PeerId | str, count: int = 1, timeout: float | None = None) -> float:
        """Median round-trip time to ``peer`` in seconds over ``count`` pings on one stream.
        Raises Timeout if they take longer than ``timeout`` (default 10 s + 10 ms per ping)."""
        rtts = self.ping_many(peer, count, timeout)
        return sorted(rtts)[len(rtts) // 2]

    def ping_many(self, peer: PeerId | str, count: int, timeout: float | None = None) -> list[float]:
        """Every round-trip time (seconds) of ``count`` sequential pings on one stream."""
        pid = PeerId.from_string(peer) if isinstance(peer, str) else peer
        limit = timeout if timeout is not None else 10.0 + 0.01 * count
        return self._call(lambda h: h.ping(pid, count, limit))

    async def aping(self, peer: PeerId | str, count: int = 1, timeout: float | None = None) -> float:
        pid = PeerId.from_string(peer) if isinstance(peer, str) else peer
        limit = timeout if timeout is not None else 10.0 + 0.01 * count
        rtts = await self._acall(lambda h: h.ping(pid, count, limit))
        return sorted(rtts)[len(rtts) // 2]

    def nat_status(self, refresh: bool = False) -> NatStatus:
        """Whether peers can dial us (AutoNAT), our NAT's mapping type, observed addresses and
        relay reservations. ``refresh``: run an AutoNAT round now instead of reporting the last."""
        return self._call(lambda h: h.nat_status(refresh))

    async def anat_status(self, refresh: bool = False) -> NatStatus:
        return await self._acall(lambda h: h.nat_status(refresh))

    @property
    def dashboard_url(self) -> str | None:
        """The dashboard's address, with its access token when one is needed (None: not served)."""
        host = self._host
        svc = host.services.dashboard if host is not None else None
        return svc.url if svc is not None else None

    def nodes(self) -> list[dict[str, Any]]:
        """The live membership view, this node first: one dict per member with ``peer_id``,
        ``state`` (alive, suspect, dead, left), ``incarnation``, ``cpu``, ``memory``, ``gpus``,
        ``labels`` and ``load``. Dead and departed members stay listed for a minute."""

        async def get(h: Host) -> list[dict[str, Any]]:
            return h.services.membership.nodes() if h.services.membership is not None else []

        return self._call(get)

    def peers(self) -> list[PeerInfo]:
        """Connected peers (one entry per peer, its primary connection)."""

        async def get(h: Host) -> list[PeerInfo]:
            return h.peers()

        return self._call(get)

    def disconnect(self, peer: PeerId | str) -> None:
        """Close every connection to ``peer``."""
        pid = PeerId.from_string(peer) if isinstance(peer, str) else peer

        async def close(h: Host) -> None:
            for conn in [c for c in h.all_conns if c.remote_peer == pid]:
                await conn.close()

        self._call(close)

    # -- for protocols built on the node (actors, DHT, ...) -------------------------------------

    def set_stream_handler(self, protocol: str, handler: StreamProtocolHandler) -> None:
        """Serve ``protocol``: ``await handler(stream, connection)`` runs on the node loop for each
        inbound stream that names it. Call before connecting, so identify advertises it."""
        check_protocol_name(protocol)

        async def put(h: Host) -> None:
            h.handlers[protocol] = handler

        self._call(put)

    async def aopen_stream(self, peer: PeerId, protocol: str) -> Stream:
        """Open a stream to ``peer`` speaking ``protocol`` (must be awaited on the node loop)."""
        if self._host is None or asyncio.get_running_loop() is not self._loop:
            raise RuntimeError("streams belong to the node loop; open them from coroutines running there")
        return await self._host.open_stream(peer, protocol)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the node loop from another thread and return its result; raises
        Timeout if it takes longer than ``timeout`` seconds (it is cancelled then)."""

        async def bounded(h: Host) -> T:
            try:
                return await asyncio.wait_for(coro, timeout)
            except TimeoutError:
                raise Timeout(f"operation did not finish within {timeout} s") from None

        return self._call(bounded)
