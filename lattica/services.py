"""The system services a node runs, in one table: what each is, in which order it starts, and
which part of the node's configuration turns it on.

A service is an object that owns one job (the DHT, relaying, hole punching, ...) and, in most
cases, a system actor peers call by a well-known name (``dht``, ``relay``, ...). Each row also
declares the service's exposure: which of its actor's methods **strangers** (authenticated peers
outside our mesh, ``lattica.trust``) may call; members may call them all. This table is the one
place that says what the open network may use (docs/security.md). The host builds
the services in table order when it starts and closes them in reverse order when it stops; a
service is reached afterwards by name (``services["dht"]``). Adding a service is one module with
a ``build`` function and one line in :data:`SERVICES`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lattica.actors.autonat import AutoNatActor, AutoNatServer
from lattica.actors.checkpoints import CheckpointStore
from lattica.actors.content import ContentActor, ContentService
from lattica.actors.crdt import CrdtService
from lattica.actors.dashboard import DashboardActor, DashboardService
from lattica.actors.dht import DhtActor, DhtService
from lattica.actors.holepunch import HolePunchActor, HolePunchService
from lattica.actors.membership import MembershipActor, MembershipService
from lattica.actors.pubsub import PubSubActor, PubSubService
from lattica.actors.shards import ShardsActor, ShardsService
from lattica.actors.spawner import Spawner
from lattica.code.library import CodeLibrary
from lattica.code.shipper import Shipper
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica.identity import PeerId
    from lattica.node import Node
    from lattica.runtime import Runtime

__all__ = ["ServiceSpec", "Built", "Services", "SERVICES"]

log = get_logger("lattica.services")


@dataclass(slots=True)
class Built:
    """What building a service gives: the service object (reached by name afterwards) and the
    system actor instance that serves it to peers (None for a service without one)."""

    service: Any
    actor: Any = None


@dataclass(slots=True)
class ServiceSpec:
    """One row of the table: ``build(runtime, node, services)`` makes the service from the node's
    configuration (``services``: the ones built before it), or returns None when it is off."""

    name: str
    build: Callable[[Runtime, Node, Mapping[str, Any]], Built | None]
    public: frozenset[str] | bool = frozenset()  # methods strangers may call (True: all)


def _spawner(rt: Runtime, node: Node, services: Mapping[str, Any]) -> Built:
    spawner = Spawner(rt)
    return Built(spawner, spawner)


def _checkpoints(rt: Runtime, node: Node, services: Mapping[str, Any]) -> Built:
    store = CheckpointStore(rt)
    return Built(store, store)


def _dht(rt: Runtime, node: Node, services: Mapping[str, Any]) -> Built:
    dht = DhtService(rt, node.dht_config)
    rt.host.set_peer_routing(dht)  # dialing by PeerId alone looks the peer's record up
    return Built(dht, DhtActor(dht))


def _autonat(rt: Runtime, node: Node, services: Mapping[str, Any]) -> Built:
    server = AutoNatServer(rt)
    return Built(server, AutoNatActor(server))


def _holepunch(rt: Runtime, node: Node, services: Mapping[str, Any]) -> Built:
    service = HolePunchService(rt)
    return Built(service, HolePunchActor(service))


def _membership(rt: Runtime, node: Node, services: Mapping[str, Any]) -> Built | None:
    if node.membership_config is None:
        return None
    service = MembershipService(rt, node.membership_config, node.labels, node.resources, node.accept_code, node.allow)
    service.on_down.append(rt.member_down)  # calls waiting on a dead peer fail, monitors fire
    service.on_self_downed.append(services["spawner"].bindings.stop_all)
    service.on_down.append(services["spawner"].jobs.ended)  # actors end with the job that spawned them
    return Built(service, MembershipActor(service))


def _shards(rt: Runtime, node: Node, services: Mapping[str, Any]) -> Built:
    service = ShardsService(rt)
    return Built(service, ShardsActor(service))


def _content(rt: Runtime, node: Node, services: Mapping[str, Any]) -> Built | None:
    if node.content_config is None:
        return None
    service = ContentService(rt, node.content_config)
    return Built(service, ContentActor(service))


def _relay(rt: Runtime, node: Node, services: Mapping[str, Any]) -> Built | None:
    if node.relay_config is None:
        return None
    from lattica.actors.relay import RelayActor, RelayService  # (only a node that relays loads it: most never do)

    service = RelayService(rt, node.relay_config)
    return Built(service, RelayActor(service))


def _code(rt: Runtime, node: Node, services: Mapping[str, Any]) -> Built | None:
    """Code that travels: the packages this node runs for others (through its spawner) and the one
    it ships with its own spawns; both move through the content plane."""
    content = services.get("content")
    if content is None:
        return None

    async def fetch(cid: str, max_size: int, sender: PeerId | None = None) -> bytes:
        from lattica.content.cid import Cid  # (hashlib loads with the first package, not at start)

        root = Cid.parse(cid)
        await content.fetch(root, None, max_size, source=sender)  # (its sender holds it: asked at once)
        return await content.read(root)

    def put(data: bytes) -> str:
        return str(content.put_now(data))

    library = CodeLibrary(rt.peer_id, node.trust, node.accept_code, fetch)
    services["spawner"].code = library
    return Built(
        CodeService(
            library,
            Shipper(node.keypair, node.trust.presented, put, node.code, node.code_excludes, admin=node.trust.admin),
        )
    )


@dataclass(slots=True)
class CodeService:
    """The ``code`` service: ``library`` (what this node runs for others) and ``shipper`` (what it sends)."""

    library: CodeLibrary
    shipper: Shipper

    def close(self) -> None:
        self.library.close()


def _pubsub(rt: Runtime, node: Node, services: Mapping[str, Any]) -> Built | None:
    if node.pubsub_config is None:
        return None
    service = PubSubService(rt, node.pubsub_config)
    return Built(service, PubSubActor(service))


def _dashboard(rt: Runtime, node: Node, services: Mapping[str, Any]) -> Built:
    service = DashboardService(rt, node.dashboard_config)
    return Built(service, DashboardActor(service))


def _crdt(rt: Runtime, node: Node, services: Mapping[str, Any]) -> Built | None:
    if node.crdt_config is None or node.pubsub_config is None:
        return None  # (documents replicate over pub-sub)
    return Built(CrdtService(rt, node.crdt_config))  # (each open document has its own actor)


#: Every system service, in start order (a service may use the ones above it).
SERVICES: tuple[ServiceSpec, ...] = (
    # strangers may look up an actor by name (they get it only if it is open to them), and tell
    # us that an actor of theirs we monitor went down (only its own node's notice counts)
    ServiceSpec("spawner", _spawner, public=frozenset({"lookup", "down"})),
    ServiceSpec("checkpoints", _checkpoints),  # members only: supervisors' state
    ServiceSpec("dht", _dht, public=True),  # the open network's routing and records
    # strangers may ask to be dialed back (at their own IP, rate-limited); dial_for, which dials a
    # third party, serves members only
    ServiceSpec("autonat", _autonat, public=frozenset({"check"})),
    ServiceSpec("holepunch", _holepunch),  # its actor is diagnostics; the punch is a stream protocol
    ServiceSpec("membership", _membership),  # members only: gossip and the view
    ServiceSpec("relay", _relay, public=frozenset({"reserve"})),  # within RelayConfig limits
    ServiceSpec("shards", _shards),  # members only: which of our actors serve which shards
    # serving content is what the open network needs; answers are bounded per peer and in all
    ServiceSpec("content", _content, public=True),
    ServiceSpec("code", _code),  # no actor: packages travel by CID through content, with spawns
    # a mesh's topics are its own: members only, but for the topics a node opens to strangers
    # (PubSubConfig.open_topics), which they reach through ``open_rpc`` (refused when none are)
    ServiceSpec("pubsub", _pubsub, public=frozenset({"open_rpc"})),
    # documents are their mesh's: each one's replica actor (``crdt/<id>``) serves members only
    ServiceSpec("crdt", _crdt),
    # every node reports itself to its mesh's dashboards (members only: a stranger learns nothing
    # of our actors or peers); the HTTP side runs only where Node(dashboard=...) asks for it
    ServiceSpec("dashboard", _dashboard),
)


class Services(Mapping[str, Any]):
    """The services one node runs, by name, in the order they started."""

    def __init__(self) -> None:
        self._running: dict[str, Any] = {}

    def start(self, runtime: Runtime, node: Node, table: tuple[ServiceSpec, ...] | None = None) -> None:
        """Build every service of ``table`` (default: :data:`SERVICES`) that ``node``'s
        configuration turns on, in order, and spawn its system actor."""
        for spec in SERVICES if table is None else table:
            built = spec.build(runtime, node, self._running)
            if built is None:
                continue
            self._running[spec.name] = built.service
            if built.actor is not None:
                cls = type(built.actor)
                runtime.create(cls, [], None, cls.NAME, instance=built.actor, public=spec.public)

    async def astart(self) -> None:
        """Once the node listens: run each service's ``astart`` coroutine, if it has one (a
        listener of its own to bind), in start order; a failure fails the node's start."""
        for service in list(self._running.values()):
            astart = getattr(service, "astart", None)
            if astart is not None:
                await astart()

    async def aclose(self) -> None:
        """Before the actors stop: run each service's ``aclose`` coroutine, if it has one, in
        reverse start order (what ``astart`` opened)."""
        for name, service in reversed(list(self._running.items())):
            aclose = getattr(service, "aclose", None)
            if aclose is None:
                continue
            try:
                await aclose()
            except Exception:
                log.exception("error while closing a service", service=name)

    def close(self) -> None:
        """Close the services in reverse start order (their actors were stopped with the runtime)."""
        for name, service in reversed(list(self._running.items())):
            close = getattr(service, "close", None)
            if close is None:
                continue
            try:
                close()
            except Exception:
                log.exception("error while closing a service", service=name)

    def __getitem__(self, name: str) -> Any:
        return self._running[name]

    def get(self, name: str, default: Any = None) -> Any:  # one dict lookup: the call path asks per call
        return self._running.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._running

    def __iter__(self) -> Iterator[str]:
        return iter(self._running)

    def __len__(self) -> int:
        return len(self._running)
