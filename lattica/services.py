"""The system services a node runs, in one typed table: :class:`NodeServices`, one attribute per
service, in the order they start; each row says how the service is built and which of its actor's
methods **strangers** (authenticated peers outside our mesh, ``lattica.trust``) may call (members
may call them all). This table is the one place that says what the open network may use
(docs/security.md).

Every builder receives the :class:`ServiceContext` (who we are, the loop, the host as services see
it, the node's configuration, the runtime) and the services built above it, and hands each
service what it uses as arguments: no service looks another up by name. The host starts the
services in table order and closes them in reverse. Adding a service is one module with a
``build`` function and one row here (docs/architecture.md, "Adding a service").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from lattica import _interfaces as interfaces
from lattica._code.library import CodeLibrary
from lattica._code.shipper import Shipper
from lattica._hostview import HostView
from lattica._monitors import Monitors
from lattica._runtime import current_runtime
from lattica._runtime.calls import Calls
from lattica.actors.content import ContentActor, ContentService
from lattica.actors.crdt import CrdtService
from lattica.actors.dashboard import DashboardActor, DashboardService
from lattica.actors.dht import DhtActor, DhtService
from lattica.actors.dht.libp2p import KadNetwork, KadNetworks
from lattica.actors.membership import MembershipActor, MembershipService
from lattica.actors.nat.autonat import AutoNatActor, AutoNatServer
from lattica.actors.nat.autonat_client import LibP2PAutoNatClient
from lattica.actors.nat.holepunch import HolePunchActor, HolePunchService
from lattica.actors.pubsub import PubSubActor, PubSubService
from lattica.actors.rendezvous import RendezvousService
from lattica.actors.sdk_rpc import SdkRpcService
from lattica.actors.sdk_swarm import SdkSwarm
from lattica.actors.shards import ShardsActor, ShardsService
from lattica.actors.spawner import Spawner
from lattica.actors.supervisor import CheckpointStore
from lattica.config import IPFS_KAD
from lattica.dht._libp2p_validators import OpaqueValidator, ipfs_validators
from lattica.errors import NodeClosed
from lattica.logging import get_logger
from lattica.nat._manager import NatManager

if TYPE_CHECKING:
    from lattica._context import NodeHandle
    from lattica._host.mdns import MdnsService
    from lattica._identity import KeyPair, PeerId
    from lattica._runtime import Runtime
    from lattica.actors.nat.relay import RelayService
    from lattica.config import NodeConfig
    from lattica.trust import Trust

# what a service's author needs: the context, the two narrow views of the node, the table
__all__ = [
    "ServiceContext",
    "HostView",
    "Calls",
    "ServiceSpec",
    "Built",
    "NodeServices",
    "SERVICES",
    "running_services",
]

log = get_logger("lattica.services")


@dataclass(frozen=True, slots=True)
class ServiceContext:
    """What every service is built from: who this node is, its loop, the host as services see it
    (:class:`lattica._hostview.HostView`), the node's configuration and the runtime that makes and
    routes calls."""

    peer_id: PeerId
    keypair: KeyPair
    trust: Trust
    loop: asyncio.AbstractEventLoop
    host: HostView
    config: NodeConfig
    runtime: Runtime


@dataclass(slots=True)
class Built:
    """What building a service gives: the service object (the row's attribute afterwards) and the
    system actor instance that serves it to peers (None for a service without one)."""

    service: Any
    actor: Any = None


Builder = Callable[[ServiceContext, "NodeServices"], "Built | None"]


@dataclass(slots=True)
class ServiceSpec:
    """One row of the table: ``build(context, services)`` makes the service from the node's
    configuration and the services above it, or returns None when the configuration turns it off."""

    name: str
    build: Builder
    public: frozenset[str] | bool = frozenset()  # methods strangers may call (True: all)


def _row(build: Builder, public: frozenset[str] | bool = frozenset()) -> Any:
    """A row of :class:`NodeServices`: the attribute holds the service once it is built."""
    return field(default=None, metadata={"build": build, "public": public})


# -- the builders, in table order ---------------------------------------------------------------


def _monitors(ctx: ServiceContext, s: NodeServices) -> Built:
    monitors = Monitors(ctx.runtime)
    ctx.runtime.monitors = monitors  # the runtime fires them when actors end
    return Built(monitors)


def _spawner(ctx: ServiceContext, s: NodeServices) -> Built:
    spawner = Spawner(ctx.runtime)
    return Built(spawner, spawner)


def _membership(ctx: ServiceContext, s: NodeServices) -> Built | None:
    cfg = ctx.config
    if cfg.membership is None:
        return None
    service = MembershipService(
        ctx.runtime, cfg.membership, cfg.labels, cfg.resources, cfg.accept_code, cfg.allow, s.spawner.reserved_total
    )
    ctx.runtime.use_membership(service)  # placement reads the view, calls ask it whether a peer is up
    service.on_down.append(ctx.runtime.member_down)  # calls waiting on a dead peer fail, monitors fire
    s.spawner.membership = service  # reservations are gossiped as load
    service.on_self_downed.append(s.spawner.bindings.stop_all)
    service.on_down.append(s.spawner.jobs.ended)  # actors end with the job that spawned them
    return Built(service, MembershipActor(service))


def _checkpoints(ctx: ServiceContext, s: NodeServices) -> Built:
    store = CheckpointStore(ctx.runtime)
    return Built(store, store)


def _dht(ctx: ServiceContext, s: NodeServices) -> Built:
    dht = DhtService(ctx.runtime, ctx.config.dht)
    ctx.host.set_peer_routing(dht)  # dialing by PeerId alone looks the peer's record up
    ctx.runtime.use_names(dht)  # named actors register and resolve through it
    return Built(dht, DhtActor(dht))


def _kad(ctx: ServiceContext, s: NodeServices) -> Built | None:
    cfg = ctx.config.kad
    if cfg is None:
        return None
    protocols = cfg.networks if cfg.networks is not None else (IPFS_KAD, ctx.config.protocol_version)
    networks = [
        KadNetwork(ctx.host, p, ipfs_validators() if p == IPFS_KAD else OpaqueValidator(cfg.max_value), cfg)
        for p in dict.fromkeys(protocols)
    ]
    return Built(KadNetworks(networks))


def _autonat(ctx: ServiceContext, s: NodeServices) -> Built:
    server = AutoNatServer(ctx.runtime)
    return Built(server, AutoNatActor(server))


def _holepunch(ctx: ServiceContext, s: NodeServices) -> Built:
    service = HolePunchService(ctx.runtime)
    ctx.host.set_puncher(service)  # a relayed connection's peer is punched to directly
    return Built(service, HolePunchActor(service))


def _relay(ctx: ServiceContext, s: NodeServices) -> Built | None:
    if ctx.config.relay is None:
        return None
    # only a node that relays loads it: most never do
    from lattica.actors.nat.relay import RelayActor, RelayService

    service = RelayService(ctx.runtime, ctx.config.relay, ctx.keypair)
    return Built(service, RelayActor(service))


def _shards(ctx: ServiceContext, s: NodeServices) -> Built:
    service = ShardsService(ctx.runtime, s.dht, s.spawner)
    return Built(service, ShardsActor(service))


def _content(ctx: ServiceContext, s: NodeServices) -> Built | None:
    if ctx.config.content is None:
        return None
    kad = s.kad.by_protocol.get(IPFS_KAD) if s.kad is not None else None
    service = ContentService(ctx.runtime, ctx.config.content, s.dht, kad)
    ctx.runtime.use_blocks(service)  # call arguments and answers over the message cap travel by CID
    return Built(service, ContentActor(service))


def _code(ctx: ServiceContext, s: NodeServices) -> Built | None:
    """Code that travels: the packages this node runs for others (through its spawner) and the one
    it ships with its own spawns; both move through the content plane."""
    content = s.content
    if content is None:
        return None

    async def fetch(cid: str, max_size: int, sender: PeerId | None = None) -> bytes:
        from lattica.content._cid import Cid  # (hashlib loads with the first package, not at start)

        root = Cid.parse(cid)
        await content.fetch(root, None, max_size, source=sender)  # (its sender holds it: asked at once)
        return await content.read(root)

    def put(data: bytes) -> str:
        return str(content.put_now(data))

    cfg, trust = ctx.config, ctx.trust
    library = CodeLibrary(ctx.peer_id, trust, cfg.accept_code, fetch)
    s.spawner.code = library
    shipper = Shipper(ctx.keypair, trust.presented, put, cfg.code, cfg.code_excludes, admin=trust.admin)
    return Built(CodeService(library, shipper))


@dataclass(slots=True)
class CodeService:
    """The ``code`` service: ``library`` (what this node runs for others) and ``shipper`` (what it sends)."""

    library: CodeLibrary
    shipper: Shipper

    def close(self) -> None:
        self.library.close()


def _pubsub(ctx: ServiceContext, s: NodeServices) -> Built | None:
    if ctx.config.pubsub is None:
        return None
    service = PubSubService(ctx.runtime, ctx.config.pubsub, s.dht)
    return Built(service, PubSubActor(service))


def _crdt(ctx: ServiceContext, s: NodeServices) -> Built | None:
    if ctx.config.crdt is None or s.pubsub is None:
        return None  # (documents replicate over pub-sub)
    return Built(CrdtService(ctx.runtime, ctx.config.crdt, s.pubsub))  # (each open document has its own actor)


def _sdk_rpc(ctx: ServiceContext, s: NodeServices) -> Built:
    return Built(SdkRpcService(ctx.runtime))


def _sdk_swarm(ctx: ServiceContext, s: NodeServices) -> Built | None:
    if ctx.config.sdk is None or s.pubsub is None:
        return None  # (the relay addresses travel over pub-sub)
    return Built(SdkSwarm(ctx.host, s.pubsub, ctx.config.sdk, ctx.config.protocol_version))


def _rendezvous(ctx: ServiceContext, s: NodeServices) -> Built | None:
    cfg = ctx.config.rendezvous
    if cfg is None:
        return None
    return Built(RendezvousService(ctx.host, cfg))  # (a stream protocol, no actor: serves only with serve=True)


def _dashboard(ctx: ServiceContext, s: NodeServices) -> Built:
    service = DashboardService(ctx.runtime, ctx.config, s)
    return Built(service, DashboardActor(service))


def _nat(ctx: ServiceContext, s: NodeServices) -> Built:
    cfg = ctx.config
    # asking libp2p peers (AutoNAT v2's and v1's client, with its dial-back handler) only when we probe
    probing = cfg.nat is None or (cfg.nat.autonat and cfg.nat.reachability is None)
    client = LibP2PAutoNatClient(ctx.host) if probing else None
    # a part of the host (it keeps the host's observed and relayed addresses), built as a service
    return Built(
        NatManager(ctx.runtime.host, cfg.nat, cfg.relays, relaying=cfg.relay is not None, libp2p_autonat=client)
    )


def _mdns(ctx: ServiceContext, s: NodeServices) -> Built | None:
    """mDNS on the LAN: on when asked, or by default when we listen on a non-loopback address."""
    want = ctx.config.mdns
    lan = any(interfaces.is_lan(a) for bound in ctx.config.listen for a in interfaces.expand(bound))
    if want is False or (want is None and not lan):
        return None
    from lattica._host.mdns import MdnsService  # here: only LAN nodes run it

    return Built(MdnsService(ctx.host))


# -- the table ----------------------------------------------------------------------------------


@dataclass(eq=False)
class NodeServices:
    """The services one node runs: one attribute per service, in start order (a service may use
    the ones above it); None for one its configuration turns off."""

    # the runtime's watchers of actors (lattica._monitors): every service's actors may be watched
    monitors: Monitors = _row(_monitors)
    # strangers may look up an actor by name (they get it only if it is open to them), and tell
    # us that an actor of theirs we monitor went down (only its own node's notice counts)
    spawner: Spawner = _row(_spawner, public=frozenset({"lookup", "down"}))
    membership: MembershipService | None = _row(_membership)  # members only: gossip and the view
    checkpoints: CheckpointStore = _row(_checkpoints)  # members only: supervisors' state
    dht: DhtService = _row(_dht, public=True)  # the open network's routing and records
    # libp2p Kademlia networks (IPFS's, an SDK swarm's): stream protocols with budgets of their own
    kad: KadNetworks | None = _row(_kad)
    # strangers may ask to be dialed back (at their own IP, rate-limited); dial_for, which dials a
    # third party, serves members only
    autonat: AutoNatServer = _row(_autonat, public=frozenset({"check"}))
    holepunch: HolePunchService = _row(_holepunch)  # its actor is diagnostics; the punch is a stream protocol
    relay: RelayService | None = _row(_relay, public=frozenset({"reserve"}))  # within RelayConfig limits
    shards: ShardsService = _row(_shards)  # members only: which of our actors serve which shards
    # serving content is what the open network needs; answers are bounded per peer and in all
    content: ContentService | None = _row(_content, public=True)
    code: CodeService | None = _row(_code)  # no actor: packages travel by CID through content, with spawns
    # a mesh's topics are its own: members only, but for the topics a node opens to strangers
    # (PubSubConfig.open_topics), which they reach through ``open_rpc`` (refused when none are)
    pubsub: PubSubService | None = _row(_pubsub, public=frozenset({"open_rpc"}))
    # documents are their mesh's: each one's replica actor (``crdt/<id>``) serves members only
    crdt: CrdtService | None = _row(_crdt)
    # the Lattica SDK's RPC: stream protocols, no actor; it serves only what the application
    # serves to SDK nodes (lattica.sdk.serve), within budgets of its own (docs/sdk.md)
    sdk_rpc: SdkRpcService = _row(_sdk_rpc)
    # Node(sdk=...): the SDK swarm's relay-address topic (opened to strangers by the node's
    # pub-sub configuration; an address is kept only for the author that signed it)
    sdk_swarm: SdkSwarm | None = _row(_sdk_swarm)
    # libp2p rendezvous: every node registers and discovers; a point (serve=True) answers anyone
    # within its budgets (a peer's requests, the strangers' share, registrations per peer and address)
    rendezvous: RendezvousService | None = _row(_rendezvous)
    # every node reports itself to its mesh's dashboards (members only: a stranger learns nothing
    # of our actors or peers); the HTTP side runs only where Node(dashboard=...) asks for it
    dashboard: DashboardService = _row(_dashboard)
    nat: NatManager = _row(_nat)  # reachability (AutoNAT), reservations on relays, the mapping type
    mdns: MdnsService | None = _row(_mdns)  # peers on the LAN, found without a bootstrap
    started: list[tuple[str, Any]] = field(default_factory=list, repr=False)  # (name, service), in start order

    def start(self, ctx: ServiceContext) -> None:
        """Build every service of :data:`SERVICES` that the configuration turns on, in order, and
        spawn its system actor."""
        for spec in SERVICES:
            built = spec.build(ctx, self)
            if built is None:
                continue
            setattr(self, spec.name, built.service)
            self.started.append((spec.name, built.service))
            if built.actor is not None:
                cls = type(built.actor)
                ctx.runtime.create(cls, [], None, cls.NAME, instance=built.actor, public=spec.public)

    async def astart(self) -> None:
        """Once the node listens: run each service's ``astart`` coroutine, if it has one (a
        listener of its own to bind, a loop to begin), in start order; a failure fails the node's start."""
        for _, service in list(self.started):
            astart = getattr(service, "astart", None)
            if astart is not None:
                await astart()

    async def aclose(self) -> None:
        """Before the actors stop: run each service's ``aclose`` coroutine, if it has one, in
        reverse start order (what ``astart`` opened)."""
        for name, service in reversed(self.started):
            aclose = getattr(service, "aclose", None)
            if aclose is None:
                continue
            try:
                await aclose()
            except Exception:
                log.exception("error while closing a service", service=name)

    def close(self) -> None:
        """Close the services in reverse start order (their actors were stopped with the runtime)."""
        for name, service in reversed(self.started):
            close = getattr(service, "close", None)
            if close is None:
                continue
            try:
                close()
            except Exception:
                log.exception("error while closing a service", service=name)

    def __iter__(self) -> Iterator[str]:
        """The names of the services running, in start order."""
        return iter([name for name, _ in self.started])


#: Every system service, in start order: the rows of :class:`NodeServices`.
SERVICES: tuple[ServiceSpec, ...] = tuple(
    ServiceSpec(f.name, f.metadata["build"], f.metadata["public"]) for f in fields(NodeServices) if f.metadata
)


def running_services(node: NodeHandle | None) -> tuple[Runtime, NodeServices]:
    """The runtime and the services of ``node`` (None: the node calls from this thread go
    through), for the public API of a service; NodeClosed when that node is not running."""
    if node is None:
        rt = current_runtime()
    else:
        host = node.host
        if host is None or host.runtime is None:
            raise NodeClosed("the node is not running")
        rt = host.runtime
    return rt, rt.host.services
