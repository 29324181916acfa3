"""DHT records, sans-IO: values with expirations and subkeys, owner signatures, signed peer records,
provider records, and the bounded store a node keeps on behalf of others.

Semantics (hivemind's, with signatures bound to PeerIds):

* A key holds a map of **subkeys**, merged on the storing node, so concurrent writers of different
  subkeys never drop each other. Per subkey the record that expires later wins (ties: the larger
  value, so every replica picks the same one). Expired records are never returned.
* A record is **owned** when its key contains ``[owner:<PeerId>]`` or its subkey is a PeerId: only a
  record signed by that peer's Ed25519 key (inlined in the PeerId) is accepted, by storing nodes
  and again by readers, so neither a storing node nor a cache can forge one.
* A deletion is a tombstone (an empty value) with a later expiration; it wins like any update.
"""

from __future__ import annotations

import math
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from lattica._budget import Buckets, StrangersShare
from lattica._identity import KeyPair, PeerId, verify_signature
from lattica._multiaddr import Multiaddr
from lattica.dht._kademlia import key_id
from lattica.errors import InvalidPeerId, LatticaError, MultiaddrError, RecordRejected
from lattica.trust import Certificate, CertificateError

__all__ = [
    "StoreLimits",
    "Entry",
    "PeerRecord",
    "RecordStore",
    "encode_subkey",
    "decode_subkey",
    "owner_of",
    "sign_entry",
    "check_entry",
    "owned_key",
    "TOMBSTONE",
    "MESH_SCOPE",
    "mesh_scoped",
    "scope_of",
]

_DOMAIN_VALUE = b"lattica-dht-record/1"
_DOMAIN_PEER = b"lattica-peer-record/1"
TOMBSTONE = b""  # an encoded value is never empty, so an empty one marks a deletion
REGISTRY_PREFIX = b"lattica/actor/"  # named actors: key prefix + name, subkey = hosting PeerId
SHARD_PREFIX = b"lattica/shard/"  # shard providers: key prefix + service + shard, subkey = hosting PeerId
REGISTRY_MAX_TTL = 300.0  # a registration (a name, a shard) lives at most this long (its owner refreshes it)
_LIVE_PREFIXES = (REGISTRY_PREFIX, SHARD_PREFIX)
# a key within one mesh: prefix + the hex of the mesh's admission key + "/" + the key; its subkeys
# are members' certificates of that mesh, so strangers cannot write (or fill) it
MESH_SCOPE = b"lattica/mesh/"
_PROVIDER_COST = 96  # bytes charged for one provider record
_OWNER = re.compile(rb"\[owner:([1-9A-HJ-NP-Za-km-z]{32,64})\]")


@dataclass
class StoreLimits:
    """What one node accepts to keep for others (every figure is a hard bound)."""

    max_key: int = 512  # bytes
    max_subkey: int = 256
    max_value: int = 16 * 1024
    max_subkeys: int = 1024  # per key
    max_ttl: float = 24 * 3600.0
    clock_skew: float = 60.0  # seconds an expiration may exceed now + max_ttl (writers' clocks)
    max_records: int = 100_000  # subkey records on this node, all keys together
    max_bytes: int = 256 * 1024 * 1024
    peer_records: int = 4096  # records stored on behalf of one peer
    peer_bytes: int = 16 * 1024 * 1024
    rate: float = 200.0  # stores per second per peer (token bucket)
    burst: float = 400.0
    max_providers: int = 256  # per content id
    max_provider_keys: int = 100_000
    max_addrs: int = 32  # per peer record
    peer_record_ttl: float = 3600.0
    # what all strangers (peers outside our mesh) together may hold or cost, as a share of each
    # bound above (records, bytes, subkeys of one key, providers of one content id): members
    # always find the rest free, however many identities strangers make
    stranger_share: float = 0.25
    stranger_rate: float = 200.0  # stores per second from all strangers together (each is a signature check)
    stranger_burst: float = 400.0
    settled: float = 3600.0  # a provider announcing itself this long, without a gap, ranks above newcomers


# -- subkeys --------------------------------------------------------------------------------------


def encode_subkey(subkey: Any) -> bytes:
    """The canonical bytes of a subkey: None, str, bytes, int, PeerId or a mesh Certificate
    (tagged by type; a PeerId or a certificate makes the record owned by that peer)."""
    if subkey is None:
        return b""
    if isinstance(subkey, PeerId):
        return b"p" + subkey.to_bytes()
    if isinstance(subkey, str):
        return b"s" + subkey.encode()
    if isinstance(subkey, (bytes, bytearray, memoryview)):
        return b"b" + bytes(subkey)
    if isinstance(subkey, Certificate):
        return b"c" + subkey.to_bytes()
    if isinstance(subkey, int) and not isinstance(subkey, bool):
        return b"i" + str(subkey).encode()
    raise TypeError(f"a subkey is None, str, bytes, int or PeerId, not {type(subkey).__name__}")


def mesh_scoped(key: bytes, mesh: bytes) -> bytes:
    """``key`` within the mesh of admission key ``mesh``: its records are kept only under a
    member's certificate of that mesh as subkey (``encode_subkey(certificate)``), which storing
    nodes and readers verify, so strangers to the mesh cannot write or fill it."""
    return MESH_SCOPE + mesh.hex().encode() + b"/" + key


def scope_of(key: bytes) -> tuple[bytes, bytes] | None:
    """``(mesh admission key, key within it)`` for a mesh-scoped key, else None."""
    if not key.startswith(MESH_SCOPE):
        return None
    head, sep, inner = key[len(MESH_SCOPE) :].partition(b"/")
    try:
        mesh = bytes.fromhex(head.decode())
    except (UnicodeDecodeError, ValueError):
        raise RecordRejected("malformed mesh-scoped key") from None
    if not sep or len(mesh) != 32:
        raise RecordRejected("malformed mesh-scoped key")
    return mesh, inner


def decode_subkey(raw: bytes) -> Any:
    """The subkey ``encode_subkey`` made; RecordRejected for bytes it cannot have made."""
    if not raw:
        return None
    tag, body = raw[:1], raw[1:]
    try:
        if tag == b"p":
            return PeerId.from_bytes(body)
        if tag == b"s":
            return body.decode()
        if tag == b"b":
            return body
        if tag == b"c":
            return Certificate.from_bytes(body)
        if tag == b"i" and (body.isdigit() or (body[:1] == b"-" and body[1:].isdigit())):
            return int(body)
    except (LatticaError, ValueError) as e:  # (UnicodeDecodeError is a ValueError)
        raise RecordRejected(f"malformed subkey: {e}") from None
    raise RecordRejected(f"malformed subkey (tag {tag!r})")


def owned_key(name: str, owner: PeerId) -> str:
    """A key only ``owner`` may write: ``name[owner:<PeerId>]``."""
    return f"{name}[owner:{owner}]"


def owner_of(key: bytes, subkey: bytes) -> PeerId | None:
    """Who must sign a record: the key's ``[owner:...]``, else a PeerId subkey, else nobody."""
    m = _OWNER.search(key)
    try:
        if m is not None:
            return PeerId.from_string(m.group(1).decode())
        if subkey[:1] == b"p":
            return PeerId.from_bytes(subkey[1:])
        if subkey[:1] == b"c":  # a mesh certificate: owned by the member it names
            return Certificate.from_bytes(subkey[1:]).peer
    except (InvalidPeerId, CertificateError) as e:
        raise RecordRejected(f"the record names an invalid owner: {e}") from None
    return None


# -- value records --------------------------------------------------------------------------------


@dataclass(slots=True)
class Entry:
    """One subkey's record: the encoded value (``TOMBSTONE`` when deleted), when it expires (unix
    seconds) and, for owned records, the owner's signature."""

    value: bytes
    expiration: float
    signature: bytes = b""

    def wins_over(self, other: Entry) -> bool:
        return (self.expiration, self.value) > (other.expiration, other.value)


def _payload(key: bytes, subkey: bytes, value: bytes, expiration: float) -> bytes:
    return msgpack.packb([_DOMAIN_VALUE, key, subkey, value, float(expiration)], use_bin_type=True)


def sign_entry(keypair: KeyPair, key: bytes, subkey: bytes, value: bytes, expiration: float) -> Entry:
    """A record signed by ``keypair`` when the key or subkey is owned by it (else unsigned)."""
    owner = owner_of(key, subkey)
    if owner is None:
        return Entry(value, expiration)
    if owner != keypair.peer_id:
        raise RecordRejected(f"this record is owned by {owner}; only that peer can write it")
    return Entry(value, expiration, keypair.sign(_payload(key, subkey, value, expiration)))


def check_entry(key: Any, subkey: Any, entry: Any, now: float, limits: StoreLimits) -> Entry:
    """Validate a record from the network; returns it normalized or raises RecordRejected."""
    if type(key) is not bytes or type(subkey) is not bytes:
        raise RecordRejected("key and subkey must be bytes")
    if not isinstance(entry, Entry):
        raise RecordRejected("malformed record")
    if type(entry.value) is not bytes or type(entry.signature) is not bytes:
        raise RecordRejected("record value and signature must be bytes")
    if (
        isinstance(entry.expiration, bool)
        or not isinstance(entry.expiration, (int, float))
        or not math.isfinite(entry.expiration)
    ):
        raise RecordRejected("record expiration must be a finite number (unix seconds)")
    if not 0 < len(key) <= limits.max_key:
        raise RecordRejected(f"key is {len(key)} bytes (1..{limits.max_key} allowed)")
    if len(subkey) > limits.max_subkey:
        raise RecordRejected(f"subkey is {len(subkey)} bytes (at most {limits.max_subkey})")
    if len(entry.value) > limits.max_value:
        raise RecordRejected(f"value is {len(entry.value)} bytes (at most {limits.max_value})")
    if entry.expiration <= now:
        raise RecordRejected("record has already expired")
    if entry.expiration > now + limits.max_ttl + limits.clock_skew:
        raise RecordRejected(f"record expires more than {limits.max_ttl:.0f} s from now")
    scope = scope_of(key)
    live = (scope[1] if scope else key).startswith(_LIVE_PREFIXES)
    if live and entry.expiration > now + REGISTRY_MAX_TTL + limits.clock_skew:
        raise RecordRejected(f"a registration (an actor name, a shard) lives at most {REGISTRY_MAX_TTL:.0f} s")
    if live and scope is None and owner_of(key, subkey) is None:
        # (a name's or a shard's key held unsigned junk: 1,024 subkeys from one identity filled it)
        raise RecordRejected(
            "a registration (an actor name, a shard) is stored under the PeerId of the node that makes it, signed by it"
        )
    if scope is not None:
        if subkey[:1] != b"c":
            raise RecordRejected("a mesh-scoped key holds records under members' certificates only")
        try:
            cert = Certificate.from_bytes(subkey[1:])
        except CertificateError as e:
            raise RecordRejected(f"malformed certificate subkey: {e}") from None
        problem = _cert_problem(cert, subkey, scope[0], now)
        if problem is not None:
            raise RecordRejected(f"not a member of the key's mesh: {problem}")
    owner = owner_of(key, subkey)
    if owner is None:
        return Entry(entry.value, float(entry.expiration))
    pub = owner.public_key()
    if (
        pub is None
        or len(entry.signature) != 64
        or not verify_signature(pub, entry.signature, _payload(key, subkey, entry.value, entry.expiration))
    ):
        raise RecordRejected(f"record owned by {owner} is not signed by that peer")
    return Entry(entry.value, float(entry.expiration), entry.signature)


_CERTS_VERIFIED: dict[bytes, None] = {}  # certificate subkeys whose signature verified (bounded)
_CERTS_LOCK = threading.Lock()  # (the nodes of one process check on their own threads)


def _cert_problem(cert: Certificate, raw: bytes, mesh: bytes, now: float) -> str | None:
    """Why ``cert`` does not make its peer a member of ``mesh`` now (None: it does); a signature
    is verified once per certificate (every refresh of a registration carries it again)."""
    known = raw in _CERTS_VERIFIED
    problem = cert.problem(cert.peer, (mesh,), now, signature_checked=known)
    if problem is None and not known:
        with _CERTS_LOCK:
            if len(_CERTS_VERIFIED) >= 4096:
                _CERTS_VERIFIED.pop(next(iter(_CERTS_VERIFIED)), None)
            _CERTS_VERIFIED[raw] = None
    return problem


def check_provider(key: bytes, provider: PeerId, cert: Any, now: float) -> None:
    """RecordRejected unless ``provider`` may provide ``key``: anyone for a plain key; for a
    mesh-scoped one (a pub-sub topic of a mesh) a member, by ``cert``, its certificate of it."""
    scope = scope_of(key)
    if scope is None:
        return
    if type(cert) is not bytes or not cert:
        raise RecordRejected("a provider of a mesh-scoped key shows its certificate of the mesh")
    try:
        parsed = Certificate.from_bytes(cert)
    except CertificateError as e:
        raise RecordRejected(f"malformed certificate: {e}") from None
    if parsed.peer != provider:
        raise RecordRejected(
            f"not a member of the key's mesh: the certificate was issued to {parsed.peer.short()}, not to the provider"
        )
    problem = _cert_problem(parsed, cert, scope[0], now)
    if problem is not None:
        raise RecordRejected(f"not a member of the key's mesh: {problem}")


def is_authentic(key: bytes, subkey: bytes, entry: Entry) -> bool:
    """Well-typed, and signed by its owner if it has one (expiration and size not checked: a
    reader skips a record that expired on the way, it does not blame the peer that sent it)."""
    if type(subkey) is not bytes or type(entry.value) is not bytes or type(entry.signature) is not bytes:
        return False
    if (
        isinstance(entry.expiration, bool)
        or not isinstance(entry.expiration, (int, float))
        or not math.isfinite(entry.expiration)
    ):
        return False
    try:
        owner = owner_of(key, subkey)
    except RecordRejected:
        return False
    if owner is None:
        return True
    pub = owner.public_key()
    return (
        pub is not None
        and len(entry.signature) == 64
        and verify_signature(pub, entry.signature, _payload(key, subkey, entry.value, entry.expiration))
    )


def entry_to_wire(subkey: bytes, e: Entry) -> list:
    return [subkey, e.value, e.expiration, e.signature]


def entry_from_wire(obj: Any) -> tuple[bytes, Entry]:
    """``[subkey, value, expiration, signature]`` -> (subkey, Entry); types checked by check_entry."""
    if type(obj) is not list or len(obj) != 4:
        raise RecordRejected("a record is [subkey, value, expiration, signature]")
    subkey, value, expiration, signature = obj
    return subkey, Entry(value, expiration, signature)


# -- peer records -------------------------------------------------------------------------------


class PeerRecord:
    """A peer's own signed list of addresses, with a sequence number (newer replaces older)."""

    __slots__ = ("peer", "seq", "addrs", "texts", "signature")

    def __init__(
        self, peer: PeerId, seq: int, addrs: list[Multiaddr], signature: bytes, texts: list[str] | None = None
    ) -> None:
        self.peer = peer
        self.seq = seq
        self.addrs = addrs
        self.texts = texts if texts is not None else [str(a) for a in addrs]  # exactly as signed
        self.signature = signature

    @property
    def size(self) -> int:
        return sum(len(t) for t in self.texts) + len(self.signature) + 128

    @staticmethod
    def _payload(peer: PeerId, seq: int, addrs: list[str]) -> bytes:
        return msgpack.packb([_DOMAIN_PEER, peer.to_bytes(), seq, addrs], use_bin_type=True)

    @classmethod
    def create(cls, keypair: KeyPair, addrs: list[Multiaddr], seq: int | None = None) -> PeerRecord:
        seq = time.time_ns() // 1000 if seq is None else seq  # microseconds: grows across restarts
        texts = [str(a) for a in addrs]
        return cls(keypair.peer_id, seq, list(addrs), keypair.sign(cls._payload(keypair.peer_id, seq, texts)), texts)

    def to_wire(self) -> list:
        return [self.peer.to_bytes(), self.seq, list(self.texts), self.signature]

    @classmethod
    def from_wire(cls, obj: Any, limits: StoreLimits) -> PeerRecord:
        """Parse and verify; raises RecordRejected."""
        if type(obj) is not list or len(obj) != 4:
            raise RecordRejected("a peer record is [peer, seq, addrs, signature]")
        raw_peer, seq, addrs, sig = obj
        if type(raw_peer) is not bytes or type(seq) is not int or type(addrs) is not list or type(sig) is not bytes:
            raise RecordRejected("malformed peer record fields")
        if (
            not 0 <= seq < 1 << 63
            or len(addrs) > limits.max_addrs
            or not all(type(a) is str and len(a) <= 1024 for a in addrs)
        ):
            raise RecordRejected(
                f"peer record has a bad sequence number or too many addresses (at most {limits.max_addrs})"
            )
        try:
            peer = PeerId.from_bytes(raw_peer)
            parsed = [Multiaddr(a) for a in addrs]
        except (InvalidPeerId, MultiaddrError) as e:
            raise RecordRejected(f"malformed peer record: {e}") from None
        pub = peer.public_key()
        if pub is None or len(sig) != 64 or not verify_signature(pub, sig, cls._payload(peer, seq, addrs)):
            raise RecordRejected(f"peer record of {peer} is not signed by that peer")
        return cls(peer, seq, parsed, sig, list(addrs))


# -- the store ----------------------------------------------------------------------------------


class _KeyRecords:
    __slots__ = ("key", "subs", "by")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.subs: dict[bytes, Entry] = {}
        self.by: dict[bytes, PeerId] = {}  # which peer stored each subkey (its quota pays for it)


def _size(key: bytes, subkey: bytes, e: Entry) -> int:
    return len(key) + len(subkey) + len(e.value) + len(e.signature) + 64


class RecordStore:
    """What this node holds for the DHT: value records, provider records and peer records, each
    bounded in total, per key and per storing peer, with a per-peer store rate limit."""

    def __init__(
        self,
        limits: StoreLimits | None = None,
        local: PeerId | None = None,
        clock: Callable[[], float] = time.time,
        member: Callable[[PeerId], bool] | None = None,
    ) -> None:
        self.limits = limits or StoreLimits()
        self.local = local  # our own stores bypass quotas and rate limits
        self.clock = clock
        # who is a member of our mesh (None: everyone; the store then knows no strangers)
        self._member = member
        self._values: dict[int, _KeyRecords] = {}
        self._providers: dict[int, dict[PeerId, list[float]]] = {}  # kid -> provider -> [expires, since]
        self._peers: dict[PeerId, tuple[PeerRecord, float, PeerId]] = {}  # peer -> (record, kept until, stored by)
        # peer -> [records, bytes, 1 if it was a stranger when it stored its first record they
        # count: its class holds until it holds nothing here]
        self._usage: dict[PeerId, list[int]] = {}
        self._count = 0
        self._bytes = 0
        self._stranger_use = [0, 0]  # records, bytes held for strangers, all together
        lim = self.limits
        self._rates = Buckets(lim.rate, max(lim.burst, 1), max_keys=10_000)
        self._strangers_rate = StrangersShare(lim.stranger_rate, max(lim.stranger_burst, 1), self.is_stranger)
        self.version = 0  # bumped on every change (persistence saves when it moved)

    # -- strangers as a class ----------------------------------------------------------------

    def is_stranger(self, peer: PeerId) -> bool:
        """``peer`` counts in the strangers' share: its class when it stored what it holds here,
        else what it is to us now."""
        if peer == self.local or self._member is None:
            return False
        use = self._usage.get(peer)
        return bool(use[2]) if use is not None else not self._member(peer)

    def _share(self, bound: int) -> int:
        return max(1, int(bound * self.limits.stranger_share))

    def _check_stranger_room(self, size: int, new: bool) -> None:
        """RecordRejected when one more stranger's record of ``size`` bytes would pass the
        strangers' share of this node's store."""
        lim = self.limits
        n, b = self._stranger_use
        if (new and n + 1 > self._share(lim.max_records)) or b + size > self._share(lim.max_bytes):
            self.purge()
            n, b = self._stranger_use
            if (new and n + 1 > self._share(lim.max_records)) or b + size > self._share(lim.max_bytes):
                raise RecordRejected(
                    "this node's room for records of peers outside its mesh is full (members keep the rest)"
                )

    # -- rate limit --------------------------------------------------------------------------

    def admit(self, peer: PeerId) -> None:
        """Charge one store to ``peer``'s token bucket; RecordRejected when it is empty."""
        if peer == self.local:
            return
        if not self._rates.take(peer):
            raise RecordRejected(f"store rate limit: at most {self.limits.rate:.0f} stores per second per peer")
        if not self._strangers_rate.take(peer):
            raise RecordRejected(
                f"store rate limit: at most {self.limits.stranger_rate:.0f} stores per second from all peers outside this node's mesh"
            )

    # -- values ------------------------------------------------------------------------------

    def put(self, key: bytes, subkey: bytes, entry: Entry, sender: PeerId) -> bool:
        """Validate and merge one record; True if it changed what we hold, False if we already had
        it. Raises RecordRejected (with the reason) when refused."""
        now = self.clock()
        entry = check_entry(key, subkey, entry, now, self.limits)
        kid = key_id(key)
        rec = self._values.get(kid)
        old = rec.subs.get(subkey) if rec is not None else None
        if old is not None and old.expiration <= now:
            self._drop(rec, subkey)  # type: ignore[arg-type]
            old = None
        if old is not None:
            if old.expiration == entry.expiration and old.value == entry.value:
                return False
            if not entry.wins_over(old):
                raise RecordRejected("a newer record for this subkey is already stored (it expires later)")
        elif rec is not None and len(rec.subs) >= self.limits.max_subkeys:
            self._purge_key(kid, rec, now)
            if len(rec.subs) >= self.limits.max_subkeys:
                raise RecordRejected(f"key already holds {self.limits.max_subkeys} subkeys")
            rec = self._values.get(kid)  # the purge may have emptied and dropped the key
        stranger = sender != self.local and self.is_stranger(sender)
        if stranger and old is None and rec is not None and len(rec.subs) >= self._share(self.limits.max_subkeys):
            if sum(1 for by in rec.by.values() if self.is_stranger(by)) >= self._share(self.limits.max_subkeys):
                raise RecordRejected(
                    f"key already holds {self._share(self.limits.max_subkeys)} subkeys of peers outside this node's mesh (members keep the rest)"
                )
        size = _size(key, subkey, entry)
        old_size = _size(key, subkey, old) if old is not None else 0
        lim = self.limits
        if self._bytes - old_size + size > lim.max_bytes or (old is None and self._count >= lim.max_records):
            self.purge()
            if self._bytes - old_size + size > lim.max_bytes or (old is None and self._count >= lim.max_records):
                raise RecordRejected("this node's record store is full")
            rec = self._values.get(kid)
        if sender != self.local:
            use = self._usage.get(sender, [0, 0])
            prev_owner = rec.by.get(subkey) if rec is not None and old is not None else None
            credit_n, credit_b = (1, old_size) if prev_owner == sender else (0, 0)
            if use[0] - credit_n + 1 > lim.peer_records or use[1] - credit_b + size > lim.peer_bytes:
                raise RecordRejected(
                    f"store quota of {sender} exhausted ({lim.peer_records} records / {lim.peer_bytes} bytes)"
                )
            if stranger:
                freed = old_size if prev_owner is not None and self.is_stranger(prev_owner) else 0
                self._check_stranger_room(size - freed, new=old is None or not freed)
        if rec is None:
            rec = self._values[kid] = _KeyRecords(key)
        if old is not None:
            self._drop(rec, subkey)
        rec.subs[subkey] = entry
        rec.by[subkey] = sender
        self._charge(sender, 1, size)
        self.version += 1
        return True

    def _charge(self, peer: PeerId, n: int, size: int) -> None:
        self._count += n
        self._bytes += size
        use = self._usage.get(peer)
        if use is None:
            use = self._usage[peer] = [0, 0, int(self.is_stranger(peer))]
        use[0] += n
        use[1] += size
        if use[2]:
            self._stranger_use[0] += n
            self._stranger_use[1] += size
        if use[0] <= 0:
            del self._usage[peer]

    def _drop(self, rec: _KeyRecords, subkey: bytes) -> None:
        e = rec.subs.pop(subkey)
        by = rec.by.pop(subkey)
        self._charge(by, -1, -_size(rec.key, subkey, e))
        self.version += 1

    def _purge_key(self, kid: int, rec: _KeyRecords, now: float) -> None:
        for sk in [sk for sk, e in rec.subs.items() if e.expiration <= now]:
            self._drop(rec, sk)
        if not rec.subs:
            del self._values[kid]

    def get(self, kid: int) -> tuple[bytes, dict[bytes, Entry]] | None:
        """The raw key and its live records (tombstones included), or None."""
        rec = self._values.get(kid)
        if rec is None:
            return None
        self._purge_key(kid, rec, self.clock())
        if not rec.subs:
            return None
        return rec.key, dict(rec.subs)

    def keys(self) -> Iterator[tuple[int, bytes]]:
        return ((kid, r.key) for kid, r in list(self._values.items()))

    def purge(self) -> None:
        """Forget every expired record."""
        now = self.clock()
        for kid, rec in list(self._values.items()):
            self._purge_key(kid, rec, now)
        for cid, provs in list(self._providers.items()):
            for p in [p for p, (exp, _) in provs.items() if exp <= now]:
                self._drop_provider(provs, p)
            if not provs:
                del self._providers[cid]
        for peer in [p for p, (_, exp, _) in self._peers.items() if exp <= now]:
            self._drop_peer_record(peer)

    @property
    def record_count(self) -> int:
        return self._count

    def usage(self, peer: PeerId) -> tuple[int, int]:
        u = self._usage.get(peer)
        return (u[0], u[1]) if u else (0, 0)

    @property
    def stranger_usage(self) -> tuple[int, int]:
        """Records and bytes held for strangers, all together."""
        return self._stranger_use[0], self._stranger_use[1]

    # -- providers ---------------------------------------------------------------------------

    def add_provider(self, cid: bytes, provider: PeerId, ttl: float, cert: bytes = b"") -> None:
        """Keep ``provider`` as a provider of ``cid`` for ``ttl`` seconds; under a mesh-scoped
        key only with ``cert``, the provider's certificate of that mesh (RecordRejected else)."""
        lim = self.limits
        if type(cid) is not bytes or not 0 < len(cid) <= lim.max_key:
            raise RecordRejected(f"content id must be 1..{lim.max_key} bytes")
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= lim.max_ttl:
            raise RecordRejected(f"provider ttl must be in (0, {lim.max_ttl:.0f}] seconds")
        now = self.clock()
        check_provider(cid, provider, cert, now)
        kid = key_id(cid)
        provs = self._providers.get(kid)
        if provs is None:
            if len(self._providers) >= lim.max_provider_keys:
                self.purge()
                if len(self._providers) >= lim.max_provider_keys:
                    raise RecordRejected("this node's provider store is full")
            provs = self._providers[kid] = {}
        held = provs.get(provider)
        if held is not None and held[0] <= now:  # it lapsed: it announces itself anew
            self._drop_provider(provs, provider)
            held = None
        if held is None:
            if len(provs) >= lim.max_providers:
                for p in [p for p, (exp, _) in provs.items() if exp <= now]:
                    self._drop_provider(provs, p)
                if len(provs) >= lim.max_providers:
                    raise RecordRejected(f"content already has {lim.max_providers} providers")
            stranger = self.is_stranger(provider)
            if stranger and len(provs) >= self._share(lim.max_providers):
                if sum(1 for p in provs if self.is_stranger(p)) >= self._share(lim.max_providers):
                    raise RecordRejected(
                        f"content already has {self._share(lim.max_providers)} providers outside this node's mesh (members keep the rest)"
                    )
            self._check_room(provider, _PROVIDER_COST)
            if stranger:
                self._check_stranger_room(_PROVIDER_COST, new=True)
            self._charge(provider, 1, _PROVIDER_COST)
            provs[provider] = [now + ttl, now]
        else:
            held[0] = max(held[0], now + ttl)
        self.version += 1

    def _drop_provider(self, provs: dict[PeerId, list[float]], provider: PeerId) -> None:
        del provs[provider]
        self._charge(provider, -1, -_PROVIDER_COST)

    def _check_room(self, sender: PeerId, size: int) -> None:
        """RecordRejected unless one more record of ``size`` bytes fits, in total and in the
        quota of ``sender`` (our own records only count towards the totals)."""
        lim = self.limits
        if self._count + 1 > lim.max_records or self._bytes + size > lim.max_bytes:
            self.purge()
            if self._count + 1 > lim.max_records or self._bytes + size > lim.max_bytes:
                raise RecordRejected("this node's record store is full")
        if sender != self.local:
            use = self._usage.get(sender, [0, 0])
            if use[0] + 1 > lim.peer_records or use[1] + size > lim.peer_bytes:
                raise RecordRejected(
                    f"store quota of {sender} exhausted ({lim.peer_records} records / {lim.peer_bytes} bytes)"
                )

    def providers(self, cid: bytes) -> list[tuple[PeerId, float]]:
        now = self.clock()
        provs = self._providers.get(key_id(cid), {})
        return [(p, exp) for p, (exp, _) in provs.items() if exp > now]

    def ranked_providers(self, cid: bytes, rng: random.Random | None = None) -> list[PeerId]:
        """The live providers of ``cid``, best first: members of our mesh, then providers
        announcing themselves for ``settled`` seconds, then newcomers, each group in random order
        (so arrival order, which many fresh identities can win, hides nobody)."""
        now = self.clock()
        settled = now - self.limits.settled
        provs = self._providers.get(key_id(cid), {})
        groups: tuple[list[PeerId], list[PeerId], list[PeerId]] = ([], [], [])
        for p, (exp, since) in provs.items():
            if exp > now:
                groups[0 if not self.is_stranger(p) else 1 if since <= settled else 2].append(p)
        shuffle = (rng or random).shuffle
        for g in groups:
            shuffle(g)
        return groups[0] + groups[1] + groups[2]

    # -- peer records ------------------------------------------------------------------------

    def put_peer_record(self, rec: PeerRecord, sender: PeerId | None = None) -> bool:
        """Keep ``rec`` (already verified) unless we hold a newer one. True if it changed. The
        record counts against the quota of ``sender`` (who stored it; default: its peer)."""
        sender = sender or rec.peer
        held = self._peers.get(rec.peer)
        now = self.clock()
        if held is not None and held[1] > now:
            if held[0].seq > rec.seq:
                raise RecordRejected("a newer peer record is already stored")
            if held[0].seq == rec.seq:
                self._peers[rec.peer] = (held[0], now + self.limits.peer_record_ttl, held[2])
                return False
        if held is not None:
            self._drop_peer_record(rec.peer)
        self._check_room(sender, rec.size)
        if sender != self.local and self.is_stranger(sender):
            self._check_stranger_room(rec.size, new=True)
        self._charge(sender, 1, rec.size)
        self._peers[rec.peer] = (rec, now + self.limits.peer_record_ttl, sender)
        self.version += 1
        return True

    def _drop_peer_record(self, peer: PeerId) -> None:
        rec, _, sender = self._peers.pop(peer)
        self._charge(sender, -1, -rec.size)

    def peer_record(self, peer: PeerId) -> PeerRecord | None:
        held = self._peers.get(peer)
        if held is None or held[1] <= self.clock():
            return None
        return held[0]

    # -- persistence -------------------------------------------------------------------------

    def dump(self) -> bytes:
        """Everything held, as msgpack (for ``dht_path``)."""
        now = self.clock()
        values = [
            [r.key, sk, e.value, e.expiration, e.signature, r.by[sk].to_bytes()]
            for r in self._values.values()
            for sk, e in r.subs.items()
            if e.expiration > now
        ]
        providers = []
        for kid, provs in self._providers.items():
            providers.append(
                [
                    kid.to_bytes(32, "big"),
                    [[p.to_bytes(), exp, since] for p, (exp, since) in provs.items() if exp > now],
                ]
            )
        peers = [[rec.to_wire(), exp] for rec, exp, _ in self._peers.values() if exp > now]
        return msgpack.packb({"v": 1, "values": values, "providers": providers, "peers": peers}, use_bin_type=True)

    def load(self, data: bytes) -> int:
        """Restore a dump, re-validating every record (a file is input too: malformed rows are
        skipped, never fatal). Returns how many records were kept."""
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
        if type(obj) is not dict or obj.get("v") != 1:
            raise ValueError("not a Lattica DHT store file")
        kept = 0
        now = self.clock()
        lim = self.limits
        for row in _rows(obj.get("values")):
            try:
                key, sk, value, exp, sig, by = row
                self.put(key, sk, Entry(value, exp, sig), PeerId.from_bytes(by))
                kept += 1
            except Exception:  # noqa: BLE001 -- any malformed row is skipped
                continue
        for row in _rows(obj.get("providers")):
            try:
                kid_bytes, provs = row
                cid_kid = int.from_bytes(kid_bytes, "big")
                items = list(_rows(provs))
            except Exception:  # noqa: BLE001
                continue
            for item in items:
                try:
                    raw, exp, since = item if len(item) == 3 else (*item, now)
                    if not now < exp <= now + lim.max_ttl + lim.clock_skew:
                        continue
                    if isinstance(since, bool) or not isinstance(since, (int, float)) or not math.isfinite(since):
                        continue
                    provider = PeerId.from_bytes(raw)
                    held = self._providers.setdefault(cid_kid, {})
                    if (
                        provider not in held
                        and len(held) < lim.max_providers
                        and len(self._providers) <= lim.max_provider_keys
                    ):
                        self._check_room(provider, _PROVIDER_COST)
                        self._charge(provider, 1, _PROVIDER_COST)
                        held[provider] = [exp, min(float(since), now)]
                        kept += 1
                except Exception:  # noqa: BLE001
                    continue
        for row in _rows(obj.get("peers")):
            try:
                wire, exp = row
                rec = PeerRecord.from_wire(wire, lim)
                if now < exp <= now + lim.peer_record_ttl + lim.clock_skew and self.put_peer_record(rec):
                    kept += 1
            except Exception:  # noqa: BLE001
                continue
        return kept


def _rows(obj: Any) -> list:
    return obj if type(obj) is list else []
