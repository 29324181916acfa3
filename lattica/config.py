"""The settings of a node's services, in one place: what ``Node(...)`` keyword arguments turn
into and what each service reads. Plain dataclasses, no behaviour; the modules that use them
re-export them (``from lattica.actors.dht import DhtConfig`` keeps working)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lattica._multiaddr import Multiaddr
from lattica.dht._kademlia import ALPHA, K
from lattica.dht._records import StoreLimits

if TYPE_CHECKING:
    from lattica.transports.memory import MemoryNetwork

__all__ = [
    "ContentConfig",
    "CrdtConfig",
    "DashboardConfig",
    "DhtConfig",
    "InboundBudget",
    "KadConfig",
    "MembershipConfig",
    "NatConfig",
    "NodeConfig",
    "PubSubConfig",
    "RelayConfig",
    "RendezvousConfig",
    "dashboard_config",
]

MiB = 1 << 20
GiB = 1 << 30


@dataclass
class DhtConfig:
    """Tuning of one node's DHT. Times are seconds."""

    k: int = K
    alpha: int = ALPHA
    replication: int = K  # replicas a put stores to (the k closest)
    request_timeout: float = 3.0
    first_contact_timeout: float = (
        2.0  # a request to a peer we never heard from (a hint in an answer): dial, handshake and call, ~4 round trips
    )
    lookup_timeout: float = 20.0  # a whole lookup; then it settles for the closest peers so far
    ping_after: float = 30.0  # a full bucket's oldest peer is pinged only if silent this long
    refresh_interval: float = 600.0  # buckets with no lookup for this long are refreshed
    republish_interval: float = 300.0  # the owner re-stores its records, providers, peer record
    name_ttl: float = 60.0  # named-actor registrations; refreshed every name_ttl / 3
    cache_on_get: bool = True  # store a found record at the closest peer that lacked it
    persist_path: str | None = None  # file-backed store (``dht_path=``)
    persist_interval: float = 5.0
    limits: StoreLimits = field(default_factory=StoreLimits)


IPFS_KAD = "/ipfs/kad/1.0.0"  # the IPFS (Amino) DHT's protocol id
HOUR = 3600.0


@dataclass
class KadConfig:
    """The libp2p Kademlia networks a node joins beside its own DHT (docs/protocols.md, "libp2p
    Kademlia"): IPFS's, and a Lattica SDK swarm's, whose protocol id is its identify
    ``protocolVersion``. Lifetimes are IPFS's. Times are seconds."""

    # protocol ids; None: IPFS's and the node's protocol_version (the SDK's convention)
    networks: tuple[str, ...] | None = None
    server: bool = True  # answer requests and advertise the protocols (a client only asks)
    k: int = K
    alpha: int = ALPHA
    request_timeout: float = 5.0
    lookup_timeout: float = 20.0
    refresh_interval: float = 600.0  # buckets no lookup went into for this long are refreshed
    provider_ttl: float = 48 * HOUR  # what we keep of others' provider records
    provider_republish: float = 22 * HOUR  # how often we re-announce what we provide
    record_ttl: float = 36 * HOUR  # others' values (go's MaxRecordAge)
    record_republish: float = 22 * HOUR  # how often we re-put our own values
    max_records: int = 10_000  # values held for others, all keys
    max_value: int = 10 * 1024  # bytes of one value (IPNS's cap; our packets are 16 KiB)
    peer_records: int = 256  # values one peer may have stored here
    request_rate: float = 20.0  # requests a second one peer may make (token bucket)
    request_burst: float = 100.0
    stranger_rate: float = 400.0  # requests a second all peers outside our mesh may make together
    stranger_burst: float = 800.0


@dataclass
class MembershipConfig:
    """Detector settings. Defaults: a silent (frozen) member is suspected after about 1 s and
    declared dead about 1 s later; heartbeats every 0.5 s to 5 watchers, gossip to 3."""

    interval: float = 0.5
    monitors: int = 5
    fanout: int = 3
    phi_suspect: float = 8.0
    min_std: float = 0.1  # seconds: floor on the spread of heartbeat intervals
    acceptable_pause: float = 0.3  # seconds of extra delay that is never suspicious
    max_silence: float = 2.0  # suspect after this long without a heartbeat, whatever phi says
    suspect_timeout: float = 1.0
    sync_interval: float = 2.0  # a full view goes to one random member this often (anti-entropy)
    forget_after: float = 60.0  # a dead or left member is forgotten after this long


@dataclass
class NatConfig:
    """How a node finds out whether peers can dial it, and what it does about it."""

    autonat: bool = True  # probe reachability (only when we have a non-loopback address)
    reachability: str | None = None  # force "public" or "private" instead of probing
    max_relays: int = 2  # reservations a private node keeps
    recheck: float = 600.0  # seconds between AutoNAT rounds once known
    retry: float = 5.0  # seconds between attempts while unknown or short of relays
    servers: int = 3  # peers asked per round


@dataclass
class RelayConfig:
    """What a relay accepts. ``None`` for a circuit limit means unlimited (the default: relayed
    calls must not fail because the path is relayed)."""

    reservation_ttl: float = 3600.0
    max_reservations: int = 1024
    max_reservations_per_ip: int = 16  # a flood of throwaway identities from one host stops here
    max_circuits: int = 1024
    max_circuits_per_peer: int = 64  # as source or as target
    circuit_duration: float | None = None
    circuit_bytes: int | None = None
    # a circuit with no member of our mesh at either end: enough to connect and hole-punch, not
    # to carry strangers' traffic on our bandwidth (None: unlimited, as for members)
    stranger_circuit_duration: float | None = 120.0
    stranger_circuit_bytes: int | None = 4 * MiB
    max_circuits_per_stranger: int = 4  # circuits one stranger may open (strangers together: half of max_circuits)
    max_stranger_circuits_per_ip: int = 16  # circuits strangers may open from one IP (an IPv6 /64): identities are free
    splice: bool = True  # offer circuits their own sockets (no re-encryption here); see transports/splice.py


@dataclass(frozen=True)
class InboundBudget:
    """Limits on partially received messages (``Node(inbound=...)``): bytes held for one peer and
    for all, and seconds from a message's first byte to its last (docs/security.md)."""

    per_peer: int = 192 * MiB  # three of the largest messages in flight at once from one peer
    per_node: int = 768 * MiB
    # seconds from a message's first byte to its last: ``deadline`` plus its declared length at
    # ``min_rate`` bytes/s (a 1 KiB call: 30 s; a 64 MiB one: 286 s)
    deadline: float = 30.0
    min_rate: float = 256 * 1024
    # strangers (identities cost nothing) share a small part, so they can never crowd out members
    per_stranger: int = 16 * MiB
    strangers: int = 128 * MiB


@dataclass
class ContentConfig:
    """The content plane of one node (``Node(content=...)``, docs/content.md): where its blocks
    live, how it fetches and what it serves. Times are seconds."""

    # a directory, "memory", or None: $LATTICA_BLOCKS, else ~/.lattica/blocks (a node that finds
    # that directory in use by another node takes a private one, removed when it stops)
    blocks: str | None = None
    capacity: int = 16 * GiB  # bytes of blocks kept; least recently used unpinned ones go first
    chunk_size: int = MiB  # of what this node publishes (at most 2 MiB)
    window: int = 64 * MiB  # bytes one fetch has requested and not yet stored
    block_timeout: float = 10.0  # a block requested and not received by then is asked of another peer
    provider_ttl: float = 3600.0  # of provider records; re-announced at half of it while held
    find_timeout: float = 20.0  # a fetch with no provider for this long fails with BlockNotFound
    max_get_bytes: int = 2 * GiB  # the largest object get() returns in memory; larger ones go to a path
    # serving: one answer holds at most this many blocks and bytes; a peer has at most
    # ``serve_per_peer`` answers being read at once, all peers ``serve_total``
    max_request_blocks: int = 64
    max_request_bytes: int = 8 * MiB
    serve_per_peer: int = 4
    serve_total: int = 32


@dataclass
class PubSubConfig:
    """Pub-sub on one node (``Node(pubsub=...)``, docs/pubsub.md): the router's degrees and
    timing, and the bounds on what it holds. Times are seconds."""

    d: int = 6  # the mesh degree per topic (kept between d_lo and d_hi)
    d_lo: int = 4
    d_hi: int = 12
    heartbeat: float = 1.0
    max_message_bytes: int = 1 << 20  # of a message's encoded data
    peer_queue: int = 4096  # messages waiting to be sent to one peer (gossip dropped first, then the oldest)
    peer_queue_bytes: int = (
        32 << 20
    )  # and their bytes (a message published in a burst is a bundle of up to max_message_bytes)
    in_flight: int = 2  # batches on the way to one peer at once
    subscription_queue: int = 10_000  # messages a subscription holds for its reader (the oldest dropped)
    subscription_bytes: int = 64 << 20  # and their bytes (as they came: the codec's)
    # seconds a message's seqno (its author's clock) may be off ours; less than the router's seen
    # cache (120 s), so a message old enough to be forgotten is refused as stale, not delivered again
    clock_skew: float = 60.0
    # bundles (a message, or the messages published together) from one author checked and passed
    # on per second, as many at once; beyond, ignored (docs/pubsub.md: the seen cache's bound)
    author_rate: float = 1000.0
    # topics strangers may join, publish to and read through us ("name", or "prefix*"): their
    # authors need not be members; nothing else of ours reaches a stranger (docs/pubsub.md)
    open_topics: tuple[str, ...] = ()
    # messages (bundles) of the open topics that all strangers together may make us check, pass on
    # and deliver per second, twice that at once; beyond, dropped unread (what a flood under many
    # identities costs us; a node serving a busy public topic raises it)
    strangers_messages: float = 100.0
    # topics whose messages we publish as libp2p GossipSub does ("name", or "prefix*"): each signed
    # on its own (StrictSign), its data bytes, so go-, js- and rust-libp2p members get them too;
    # other topics' go as our signed bundles, to Lattica nodes only (docs/pubsub.md)
    libp2p_topics: tuple[str, ...] = ()
    # find the topic's other subscribers through the DHT (provider records under the topic's key)
    # and connect to some while fewer than d_lo are known; off: only peers connected otherwise
    discover: bool = True
    validate_timeout: float = 10.0  # an async validator that takes longer: the message is ignored
    max_validating: int = 1024  # async validations at once; beyond, messages are ignored


@dataclass
class SdkConfig:
    """Taking part in a Lattica SDK swarm (``Node(sdk=...)``, docs/sdk.md) beyond what every node
    does (its identify, Kademlia, Bitswap, relays and RPC): the GossipSub topic where SDK nodes
    tell each other their relayed addresses. Times are seconds."""

    # the topic (the SDK's; opened to strangers and published in libp2p's form on this node)
    relay_topic: str = "p2p-circuit-broadcast"
    # our relayed addresses are published when we get them, and again this often while we hold
    # them (the SDK publishes once, so a node that joins later would not learn them otherwise)
    republish: float = 300.0


@dataclass
class RendezvousConfig:
    """libp2p rendezvous (``Node(rendezvous=...)``, docs/protocols.md): every node can register
    with and discover from rendezvous points (``lattica.rendezvous``); ``serve=True`` makes this
    node one. The limits are the point's; TTLs are whole seconds (the spec's: 2 h to 72 h)."""

    serve: bool = False  # be a rendezvous point (serve /rendezvous/1.0.0)
    min_ttl: int = 2 * 3600  # a registration's TTL: at least (the spec's recommendation, rust's)
    max_ttl: int = 72 * 3600  # and at most
    max_registrations: int = 10_000  # held in all (rust's default)
    max_per_peer: int = 32  # held for one peer, across namespaces (rust's default)
    max_per_namespace: int = 1000  # held in one namespace
    # held for peers outside our mesh registering from one address (an IPv6 /64): identities are free
    max_per_address: int = 64
    max_discover: int = 1000  # registrations one discovery answer holds (the spec's recommendation)
    request_rate: float = 2.0  # requests a second one peer may make (token bucket)
    request_burst: float = 20.0
    stranger_rate: float = 200.0  # requests a second all peers outside our mesh may make together
    stranger_burst: float = 400.0
    # our own registrations are renewed at 3/4 of the TTL granted, and again when our addresses
    # change, until unregistered (False: each lasts its TTL)
    refresh: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.min_ttl <= self.max_ttl:
            raise ValueError("rendezvous: 0 < min_ttl <= max_ttl (seconds)")
        counts = (self.max_registrations, self.max_per_peer, self.max_per_namespace, self.max_per_address)
        if min(counts) < 1 or self.max_discover < 1:
            raise ValueError("rendezvous: the limits on registrations and answers are >= 1")
        if self.request_rate <= 0 or self.request_burst < 1 or self.stranger_rate <= 0 or self.stranger_burst < 1:
            raise ValueError("rendezvous: request rates are > 0 and bursts >= 1")


@dataclass
class CrdtConfig:
    """The CRDT store of one node (``Node(crdt=...)``, docs/crdt.md): where documents persist,
    how replicas meet, and the bounds on what a peer may make a replica hold. Times are seconds."""

    # a directory, "memory", or None: $LATTICA_CRDT, else ~/.lattica/crdt (a node that finds it
    # in use by another node on this machine takes a private one, removed when it stops)
    path: str | None = None
    fsync: bool = (
        True  # commit() returns once the change is on disk (else: once written; a crash of the machine may lose it)
    )
    max_update_bytes: int = MiB  # of one envelope's update (a transaction's changes)
    max_document_bytes: int = 256 * MiB  # of a document's log; beyond, updates are refused
    author_rate: float = (
        500.0  # envelopes per second one author may make a replica check (as many at once); beyond, ignored
    )
    sync_interval: float = 10.0  # anti-entropy with one replica peer of each document this often
    snapshot_every: int = 2000  # envelopes applied between snapshots of a document
    max_held: int = 4096  # envelopes a document holds while they wait for a gap or a dependency
    # a replica proposes a checkpoint once its log holds this many envelopes after the last one;
    # taken, it replaces them (0: never propose; checkpoints made by others are still taken)
    compact_every: int = 10_000
    # members whose signatures a mesh document's checkpoint needs before a replica that cannot
    # check it (a newcomer) takes it; an owner document's needs its owner's
    checkpoint_quorum: int = 2


@dataclass
class DashboardConfig:
    """Where the dashboard listens and what it allows. A bind address that is not loopback needs
    an access token (``token``; generated at start when None, and printed); on loopback none is
    needed unless one is given. Pictures of the mesh are taken every ``every`` seconds while a
    page watches, each member's report awaited up to ``report_timeout``."""

    bind: str = "127.0.0.1:8265"
    token: str | None = None
    every: float = 2.0
    report_timeout: float = 2.0
    max_channels: int = 16  # live channels (open pages) at once
    max_nodes: int = 1024  # members shown
    max_request_bytes: int = 16 * 1024  # a request's body (the dashboard takes none)

    def __post_init__(self) -> None:
        split_bind(self.bind)  # (raises on a malformed address)
        if self.every <= 0 or self.report_timeout <= 0 or self.max_channels < 1 or self.max_nodes < 1:
            raise ValueError("dashboard: every and report_timeout must be > 0, max_channels and max_nodes >= 1")
        if self.token is not None and len(self.token) < 16:
            raise ValueError("dashboard: an access token needs at least 16 characters")

    @property
    def host(self) -> str:
        return split_bind(self.bind)[0]

    @property
    def port(self) -> int:
        return split_bind(self.bind)[1]


def split_bind(bind: str) -> tuple[str, int]:
    """``"127.0.0.1:8265"`` or ``"[::1]:8265"`` -> (host, port); ValueError if malformed."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not host or int(port) > 65535:
        raise ValueError(f"dashboard address {bind!r}: give HOST:PORT, e.g. 127.0.0.1:8265")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def dashboard_config(value: Any) -> DashboardConfig | None:
    """``Node(dashboard=...)``: None/False (off), True (the default address), ``"HOST:PORT"``, or
    a DashboardConfig."""
    if value is None or value is False:
        return None
    if value is True:
        return DashboardConfig()
    if isinstance(value, str):
        return DashboardConfig(bind=value)
    if isinstance(value, DashboardConfig):
        return value
    raise ValueError(f"dashboard: give True, 'HOST:PORT' or a DashboardConfig, not {type(value).__name__}")


AGENT_VERSION = "lattica-py/0.1.0"  # what identify tells peers we run
LIBP2P_PROTOCOL_VERSION = "/lattica/1.0.0"  # identify's protocolVersion to libp2p peers (the Lattica SDK's default)
DRAIN_GRACE = 300.0  # seconds a connection going away waits for the streams on it to end
DEFAULT_SPILL_LIMIT = 1 << 30  # bytes of one message's spilled objects (Node(spill_limit=...))


@dataclass
class NodeConfig:
    """Everything ``Node(...)`` was told, typed and checked: what the host and each service read
    (a service's own section is ``None`` when the node runs without it). ``Node`` builds it from
    its keyword arguments; docs/api.md says what each one means."""

    listen: list[Multiaddr] = field(default_factory=lambda: [Multiaddr("/ip4/127.0.0.1/tcp/0")])
    max_connections: int = 512
    idle_timeout: float = 300.0
    identify_timeout: float = 10.0  # a connection whose peer has not identified by then closes
    inbound: InboundBudget = field(default_factory=InboundBudget)  # partial messages held
    dial_timeout: float = 10.0
    agent_version: str = AGENT_VERSION
    # what identify tells libp2p peers we speak: some networks close connections on a mismatch (the
    # Lattica SDK's, whose default this is; IPFS nodes do not look)
    protocol_version: str = LIBP2P_PROTOCOL_VERSION
    transport_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # per transport: keywords
    memory_network: MemoryNetwork | None = None  # the in-memory transport's network (simulations)
    allow: list[str] = field(default_factory=list)  # class-path patterns peers may spawn here (fnmatch)
    # code that travels (docs/api.md): what this node ships with its spawns (None: its script's
    # directory; False: nothing; else directories and module names), and whose code it runs
    code: list[str] | bool | None = None
    code_excludes: list[str] = field(default_factory=list)
    accept_code: str = "admins"
    channel_idle: float = 60.0  # an idle call channel closes after this, freeing its connection
    # a call's arguments or result over the message cap travel by CID, up to this many bytes
    spill_limit: int = DEFAULT_SPILL_LIMIT
    # a connection this node replaces (a relayed path that became direct, a duplicate, idle) goes
    # away: calls already on it get this long to finish there (docs/nat.md)
    drain_grace: float = DRAIN_GRACE
    relays: list[Multiaddr] = field(default_factory=list)  # relays to hold reservations with (else found ones)
    mdns: bool | None = None  # mDNS on the LAN: None = on when we listen on a non-loopback address
    labels: dict[str, str] = field(default_factory=dict)  # what this node says about itself to placement
    resources: dict[str, float] = field(default_factory=dict)  # offered to placement instead of detected
    nat: NatConfig = field(default_factory=NatConfig)
    dht: DhtConfig = field(default_factory=DhtConfig)
    kad: KadConfig | None = field(default_factory=KadConfig)  # libp2p Kademlia (IPFS, SDK swarms)
    relay: RelayConfig | None = None  # serve reservations and circuits for private peers
    membership: MembershipConfig | None = field(default_factory=MembershipConfig)
    content: ContentConfig | None = field(default_factory=ContentConfig)
    pubsub: PubSubConfig | None = field(default_factory=PubSubConfig)
    sdk: SdkConfig | None = None  # a Lattica SDK swarm's relay-address topic (needs pub-sub)
    crdt: CrdtConfig | None = field(default_factory=CrdtConfig)  # documents need pub-sub too
    dashboard: DashboardConfig | None = None  # serve the mesh in a browser (docs/dashboard.md)
    # libp2p rendezvous: the client always (None: not even that), a rendezvous point with serve=True
    rendezvous: RendezvousConfig | None = field(default_factory=RendezvousConfig)
