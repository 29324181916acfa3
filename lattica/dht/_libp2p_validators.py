"""The record validators of libp2p's Kademlia DHT as IPFS runs it, sans-IO: bytes and a clock in,
a verdict out. Issue 49: a libp2p ``Record{key, value}`` carries no expiry or signature of its own;
whether a node stores and serves it is up to the validator of the key's namespace (``/ns/rest``),
and go-libp2p-kad-dht knows two: ``/pk/`` and ``/ipns/``.

- ``/pk/`` + a PeerId's multihash: the value is the peer's protobuf-encoded public key, valid when
  that key names the peer. Any two valid values are the same key, so selection takes the first.
- ``/ipns/`` + a PeerId's multihash: the value is an ``IpnsEntry`` (the IPNS record spec, V2): a
  DAG-CBOR map ``{Value, Validity, ValidityType, Sequence, TTL}`` in ``data``, signed in
  ``signatureV2`` over ``b"ipns-signature:" + data`` by the name's key (inlined in the PeerId, or in
  ``pubKey``), at most 10 KiB, with an EOL validity in the future. The legacy V1 copies in the
  protobuf must equal the signed ones when ``signatureV1`` or ``value`` is present (boxo >= 0.11,
  kubo >= 0.22; older nodes compare them always, so what we write carries them by default).
  Selection: the higher Sequence, then the later EOL, then the larger record bytes (as boxo).
- Networks that store opaque values (the Lattica SDK's bincode) get :class:`OpaqueValidator`.

The DAG-CBOR reader is as lenient as go-ipld-prime's default decoder where leniency is harmless
(map keys in any order, integers not in their shortest form, any float width) and strict where
the DAG-CBOR spec and safety ask: no indefinite lengths, no tags but 42 (a CID), no duplicate
keys, bounded nesting.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Protocol

from cryptography.exceptions import UnsupportedAlgorithm

from lattica._identity import KeyPair, PeerId, public_key_from_protobuf, verify_signature
from lattica._protobuf import decode_fields, encode_fields
from lattica.errors import InvalidPeerId, KeyFileError, RecordRejected

__all__ = [
    "Validator",
    "Validators",
    "PublicKeyValidator",
    "IpnsValidator",
    "OpaqueValidator",
    "IpnsRecord",
    "decode_ipns_record",
    "make_ipns_record",
    "make_pk_record",
    "ipns_key",
    "ipfs_validators",
    "MAX_IPNS_RECORD",
    "MAX_OPAQUE_VALUE",
]

PK_PREFIX = b"/pk/"
IPNS_PREFIX = b"/ipns/"
MAX_IPNS_RECORD = 10 * 1024  # the IPNS spec's size limit (boxo's MaxRecordSize)
MAX_OPAQUE_VALUE = 14 * 1024  # leaves room for a 1 KiB key and the rest of a 16 KiB message we write
MAX_CBOR_DEPTH = 16  # maps and lists within the signed data (the spec suggests data[_ns][field])

_SIGNATURE_V2_PREFIX = b"ipns-signature:"
_V1_VALIDITY_TYPE = b"EOL"  # Go signs V1 over its enum's name, not its number
_EOL = 0  # the only validity type the spec defines
_MAX_INT = 2**63 - 1  # go-ipld-prime reads CBOR integers as int64: larger counts are refused

# IpnsEntry{value = 1, signatureV1 = 2, validityType = 3, validity = 4, sequence = 5, ttl = 6,
# pubKey = 7, signatureV2 = 8, data = 9}
_VALUE, _SIG_V1, _VALIDITY_TYPE, _VALIDITY, _SEQUENCE, _TTL, _PUB_KEY, _SIG_V2, _DATA = range(1, 10)


class Validator(Protocol):
    """Judges the values stored under keys of one namespace (go-libp2p-record's Validator)."""

    def validate(self, key: bytes, value: bytes, now: float) -> None:
        """Return if ``value`` may be stored under ``key`` at unix time ``now``; else raise
        RecordRejected saying why."""
        ...

    def select(self, key: bytes, values: Sequence[bytes]) -> int:
        """The index of the best of ``values`` (all validated, at least one), stable for equals."""
        ...


# -- DAG-CBOR ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CborLink:
    """A CID within DAG-CBOR (tag 42), kept as its bytes (the leading 0x00 removed)."""

    cid: bytes


def _cbor_head(data: bytes, pos: int) -> tuple[int, int, int, int]:
    """An item's head at ``pos``: (major type, additional info, argument, next position)."""
    if pos >= len(data):
        raise ValueError("truncated")
    major, info = data[pos] >> 5, data[pos] & 0x1F
    pos += 1
    if info < 24:
        return major, info, info, pos
    if info == 31:
        raise ValueError("indefinite lengths are not DAG-CBOR")
    if info > 27:
        raise ValueError(f"reserved additional information {info}")
    size = 1 << (info - 24)
    if pos + size > len(data):
        raise ValueError("truncated")
    return major, info, int.from_bytes(data[pos : pos + size], "big"), pos + size


def _cbor_item(data: bytes, pos: int, depth: int) -> tuple[object, int]:
    """The item at ``pos`` and the position after it; ValueError if it is not DAG-CBOR we read."""
    major, info, arg, pos = _cbor_head(data, pos)
    if major == 0:
        return arg, pos
    if major == 1:
        return -1 - arg, pos
    if major in (2, 3):
        if arg > len(data) - pos:
            raise ValueError("truncated")
        raw = data[pos : pos + arg]
        return (raw if major == 2 else raw.decode("utf-8")), pos + arg
    if major in (4, 5):
        if depth >= MAX_CBOR_DEPTH:
            raise ValueError(f"nested deeper than {MAX_CBOR_DEPTH}")
        if major == 4:
            items: list[object] = []
            for _ in range(arg):  # (each item takes a byte at least: the data's size bounds this)
                item, pos = _cbor_item(data, pos, depth + 1)
                items.append(item)
            return items, pos
        entries: dict[str, object] = {}
        for _ in range(arg):
            key, pos = _cbor_item(data, pos, depth + 1)
            if not isinstance(key, str):
                raise ValueError("a map key must be a text string")
            if key in entries:
                raise ValueError(f"map key {key!r} repeated")
            entries[key], pos = _cbor_item(data, pos, depth + 1)
        return entries, pos
    if major == 6:
        if arg != 42:
            raise ValueError(f"tag {arg} is not DAG-CBOR")
        cid, pos = _cbor_item(data, pos, depth + 1)
        if not isinstance(cid, bytes) or cid[:1] != b"\0":
            raise ValueError("a CID (tag 42) must be a byte string starting with 0x00")
        return CborLink(cid[1:]), pos
    # major 7: simple values and floats
    if info in (20, 21):
        return info == 21, pos
    if info in (22, 23):
        return None, pos  # (undefined read as null, as go-ipld-prime does)
    if info in (25, 26, 27):
        size = 1 << (info - 24)
        return struct.unpack(">" + "efd"[info - 25], arg.to_bytes(size, "big"))[0], pos
    raise ValueError(f"simple value {arg} is not DAG-CBOR")


def _cbor_decode_map(data: bytes) -> dict[str, object]:
    """A DAG-CBOR document that must be one map and nothing after it; ValueError otherwise."""
    doc, pos = _cbor_item(data, 0, 0)
    if pos != len(data):
        raise ValueError("bytes after the document")
    if not isinstance(doc, dict):
        raise ValueError("the document is not a map")
    return doc


def _cbor_head_bytes(major: int, n: int) -> bytes:
    """An item's head in its shortest form (DAG-CBOR's canonical one)."""
    if n < 24:
        return bytes([major << 5 | n])
    for info, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * size):
            return bytes([major << 5 | info]) + n.to_bytes(size, "big")
    raise ValueError(f"{n} does not fit in 64 bits")


def _cbor_encode_map(fields: Mapping[str, int | bytes]) -> bytes:
    """A canonical DAG-CBOR map of non-negative integers and byte strings: keys ordered by
    length, then bytewise (RFC 7049's order, which the signature depends on)."""
    keys = sorted((k.encode() for k in fields), key=lambda k: (len(k), k))
    out = bytearray(_cbor_head_bytes(5, len(keys)))
    for k in keys:
        out += _cbor_head_bytes(3, len(k)) + k
        value = fields[k.decode()]
        if isinstance(value, int):
            out += _cbor_head_bytes(0, value)
        else:
            out += _cbor_head_bytes(2, len(value)) + value
    return bytes(out)


# -- RFC 3339 timestamps -------------------------------------------------------------------------

_RFC3339 = re.compile(rb"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(?:Z|([+-])(\d\d):(\d\d))")
_EPOCH_DAY = date(1970, 1, 1).toordinal()


def _parse_rfc3339(text: bytes) -> int:
    """Nanoseconds since the epoch of an RFC 3339 timestamp, as Go's RFC3339Nano parser reads it
    (fractions past nanoseconds are cut); ValueError if it is not one."""
    m = _RFC3339.fullmatch(text)
    if m is None:
        raise ValueError(f"{text[:40]!r} is not an RFC 3339 timestamp")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if hour > 23 or minute > 59 or second > 59:
        raise ValueError(f"{text[:40]!r} has a time of day out of range")
    days = date(year, month, day).toordinal() - _EPOCH_DAY  # (ValueError for a day no calendar has)
    offset = 0
    if m[8] is not None:
        off_hour, off_minute = int(m[9]), int(m[10])
        if off_hour > 23 or off_minute > 59:
            raise ValueError(f"{text[:40]!r} has a time zone offset out of range")
        offset = (off_hour * 3600 + off_minute * 60) * (1 if m[8] == b"+" else -1)
    fraction = int((m[7] or b"")[:9].ljust(9, b"0"))
    return (days * 86400 + hour * 3600 + minute * 60 + second - offset) * 1_000_000_000 + fraction


def _format_rfc3339(when: datetime) -> bytes:
    """A timezone-aware time in UTC as Go's RFC3339Nano writes it (no trailing zeros)."""
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError("an IPNS record's EOL must be a timezone-aware datetime")
    u = when.astimezone(UTC)
    text = f"{u.year:04d}-{u.month:02d}-{u.day:02d}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}"
    if u.microsecond:
        text += "." + f"{u.microsecond:06d}".rstrip("0")
    return (text + "Z").encode()


# -- /pk/ ----------------------------------------------------------------------------------------


def _read_public_key(pb: bytes) -> bytes:
    """A libp2p protobuf public key in _identity's form; RecordRejected if it is not one."""
    try:
        return public_key_from_protobuf(pb)
    except KeyFileError as e:
        raise RecordRejected(f"unreadable public key: {e}") from None
    except UnsupportedAlgorithm:  # (DER of an algorithm cryptography does not know)
        raise RecordRejected("unreadable public key: an unsupported algorithm") from None


def make_pk_record(keypair: KeyPair) -> tuple[bytes, bytes]:
    """The ``/pk/`` record of our key: (``/pk/`` + PeerId multihash, protobuf public key)."""
    return PK_PREFIX + keypair.peer_id.to_bytes(), keypair.public_key_protobuf()


class PublicKeyValidator:
    """``/pk/`` + multihash: the value must be the public key whose PeerId is that multihash."""

    def validate(self, key: bytes, value: bytes, now: float) -> None:
        """RecordRejected unless ``value`` is a public key that hashes to the key's multihash."""
        if not key.startswith(PK_PREFIX):
            raise RecordRejected("a public key record's key must start with /pk/")
        public_key = _read_public_key(value)
        if PeerId.from_public_key(public_key).to_bytes() != key[len(PK_PREFIX) :]:
            raise RecordRejected("the public key does not match the multihash of its key")

    def select(self, key: bytes, values: Sequence[bytes]) -> int:
        """The first: every valid value under a key is the same public key."""
        _check_some(values)
        return 0


# -- /ipns/ --------------------------------------------------------------------------------------


def ipns_key(peer: PeerId) -> bytes:
    """The DHT key of a peer's IPNS name: ``/ipns/`` + its PeerId's binary multihash."""
    return IPNS_PREFIX + peer.to_bytes()


@dataclass(frozen=True)
class IpnsRecord:
    """An IPNS record read (not yet verified): its signed fields from ``data``, and what verifying
    it needs."""

    value: bytes
    sequence: int
    validity: bytes  # the EOL as signed (RFC 3339 text)
    eol_ns: int  # ... in nanoseconds since the epoch
    ttl_ns: int
    pub_key: bytes  # the protobuf public key the record carries, or b""
    data: bytes = field(repr=False)
    signature_v2: bytes = field(repr=False)
    # the protobuf's V1 copies (value, validity, validityType, sequence, ttl; absent ones as 0 or
    # b""), kept when the record has a V1 signature or value, which makes them binding
    legacy: tuple[bytes, bytes, int, int, int] | None = field(default=None, repr=False)


def _signed_int(doc: Mapping[str, object], name: str) -> int:
    value = doc.get(name)
    if type(value) is not int or not 0 <= value <= _MAX_INT:
        raise RecordRejected(f"the IPNS record's data[{name}] must be an integer from 0 to 2**63-1")
    return value


def _signed_bytes(doc: Mapping[str, object], name: str) -> bytes:
    value = doc.get(name)
    if not isinstance(value, bytes):
        raise RecordRejected(f"the IPNS record's data[{name}] must be a byte string")
    return value


def _pb_bytes(entry: Mapping[int, int | bytes], number: int) -> bytes:
    value = entry.get(number, b"")
    if not isinstance(value, bytes):
        raise RecordRejected(f"the IPNS record's field {number} must be bytes")
    return value


def _pb_int(entry: Mapping[int, int | bytes], number: int) -> int:
    value = entry.get(number, 0)
    if not isinstance(value, int):
        raise RecordRejected(f"the IPNS record's field {number} must be an integer")
    return value


def decode_ipns_record(raw: bytes) -> IpnsRecord:
    """Read an ``IpnsEntry`` (size, protobuf, DAG-CBOR data and its fields, an EOL validity) without
    checking its signature or clock; RecordRejected saying what is wrong."""
    if len(raw) > MAX_IPNS_RECORD:
        raise RecordRejected(f"an IPNS record of {len(raw)} bytes (at most {MAX_IPNS_RECORD})")
    try:
        entry = decode_fields(raw)
    except ValueError as e:
        raise RecordRejected(f"malformed IPNS record: {e}") from None
    legacy_value, signature_v1, pub_key = (_pb_bytes(entry, n) for n in (_VALUE, _SIG_V1, _PUB_KEY))
    signature_v2, data, legacy_validity = (_pb_bytes(entry, n) for n in (_SIG_V2, _DATA, _VALIDITY))
    legacy_type, legacy_sequence, legacy_ttl = (_pb_int(entry, n) for n in (_VALIDITY_TYPE, _SEQUENCE, _TTL))
    if not signature_v2:
        raise RecordRejected("the IPNS record has no signatureV2 (V1-only records are not accepted)")
    if not data:
        raise RecordRejected("the IPNS record has no data")
    try:
        doc = _cbor_decode_map(data)
    except ValueError as e:
        raise RecordRejected(f"the IPNS record's data is not a DAG-CBOR map: {e}") from None
    value, validity = _signed_bytes(doc, "Value"), _signed_bytes(doc, "Validity")
    validity_type, sequence, ttl = (_signed_int(doc, k) for k in ("ValidityType", "Sequence", "TTL"))
    if validity_type != _EOL:
        raise RecordRejected(f"the IPNS record's validity type {validity_type} is not EOL (0)")
    try:
        eol_ns = _parse_rfc3339(validity)
    except ValueError as e:
        raise RecordRejected(f"the IPNS record's validity: {e}") from None
    legacy = None
    if signature_v1 or legacy_value:
        legacy = (legacy_value, legacy_validity, legacy_type, legacy_sequence, legacy_ttl)
    return IpnsRecord(value, sequence, validity, eol_ns, ttl, pub_key, data, signature_v2, legacy)


_LEGACY_NAMES = ("value", "validity", "validityType", "sequence", "ttl")
_SIGNED_NAMES = ("Value", "Validity", "ValidityType", "Sequence", "TTL")


class IpnsValidator:
    """``/ipns/`` + PeerId multihash: an IPNS record signed (V2) by that peer's key, unexpired."""

    def __init__(self, public_keys: Callable[[PeerId], bytes | None] | None = None) -> None:
        """``public_keys`` finds the key of a peer whose id does not inline it (an RSA name whose
        record omits ``pubKey``), in _identity's form, as go's peerstore does; None for none."""
        self._public_keys = public_keys

    def _signer(self, name: PeerId, record: IpnsRecord) -> bytes:
        """The public key that must have signed ``record``: its ``pubKey`` (which must be the
        name's), the key inlined in the name, or the one ``public_keys`` knows."""
        if record.pub_key:
            key: bytes | None = _read_public_key(record.pub_key)
        else:
            key = name.public_key()
            if key is None and self._public_keys is not None:
                key = self._public_keys(name)
        if key is None:
            raise RecordRejected("the IPNS name does not inline its public key and the record carries none")
        if PeerId.from_public_key(key) != name:
            raise RecordRejected("the IPNS record's public key is not the one its name is the hash of")
        return key

    def validate(self, key: bytes, value: bytes, now: float) -> None:
        """RecordRejected unless ``value`` is an IPNS record for the name in ``key``, signed by its
        key, with V1 copies (if binding) equal to the signed fields and an EOL after ``now``."""
        if not key.startswith(IPNS_PREFIX):
            raise RecordRejected("an IPNS record's key must start with /ipns/")
        try:
            name = PeerId.from_bytes(key[len(IPNS_PREFIX) :])
        except InvalidPeerId as e:
            raise RecordRejected(f"an IPNS key must end in a PeerId: {e}") from None
        record = decode_ipns_record(value)
        signer = self._signer(name, record)
        if not verify_signature(signer, record.signature_v2, _SIGNATURE_V2_PREFIX + record.data):
            raise RecordRejected("the IPNS record's signatureV2 is not valid")
        if record.legacy is not None:
            signed = (record.value, record.validity, _EOL, record.sequence, record.ttl_ns)
            for legacy_name, signed_name, old, new in zip(_LEGACY_NAMES, _SIGNED_NAMES, record.legacy, signed):
                if old != new:
                    raise RecordRejected(f"the IPNS record's {legacy_name} does not match its data[{signed_name}]")
        if record.eol_ns <= int(now * 1_000_000_000):
            raise RecordRejected(f"the IPNS record expired at {record.validity.decode()}")

    def select(self, key: bytes, values: Sequence[bytes]) -> int:
        """The record with the highest Sequence, then the latest EOL, then the larger bytes (as
        boxo); the first of equals. RecordRejected if a value cannot be read."""
        _check_some(values)
        ranks = []
        for raw in values:
            record = decode_ipns_record(raw)
            ranks.append((record.sequence, record.eol_ns, raw))
        return max(range(len(values)), key=ranks.__getitem__)


def make_ipns_record(
    keypair: KeyPair, value: bytes, seq: int, eol: datetime, ttl_ns: int, *, v1_compatible: bool = True
) -> bytes:
    """A signed IPNS record (V2) of ``value`` (a path such as ``b"/ipfs/bafy..."``), valid until
    ``eol`` (timezone-aware). ``v1_compatible`` adds the V1 copies and signatureV1 as boxo does by
    default: nodes before kubo 0.22 refuse records without the copies. Our Ed25519 key is inlined
    in our PeerId, so ``pubKey`` is left out. ValueError for what no reader would accept."""
    if not 0 <= seq <= _MAX_INT or not 0 <= ttl_ns <= _MAX_INT:
        raise ValueError("an IPNS record's sequence and TTL must be integers from 0 to 2**63-1")
    validity = _format_rfc3339(eol)
    data = _cbor_encode_map(
        {"Value": value, "Validity": validity, "ValidityType": _EOL, "Sequence": seq, "TTL": ttl_ns}
    )
    fields: list[tuple[int, int | bytes]] = []
    if v1_compatible:
        signature_v1 = keypair.sign(value + validity + _V1_VALIDITY_TYPE)
        fields += [(_VALUE, value), (_SIG_V1, signature_v1), (_VALIDITY_TYPE, _EOL), (_VALIDITY, validity)]
        fields += [(_SEQUENCE, seq), (_TTL, ttl_ns)]
    fields += [(_SIG_V2, keypair.sign(_SIGNATURE_V2_PREFIX + data)), (_DATA, data)]
    record = encode_fields(fields)
    if len(record) > MAX_IPNS_RECORD:
        raise ValueError(f"an IPNS record of {len(record)} bytes (at most {MAX_IPNS_RECORD})")
    return record


# -- opaque values, and the namespaces ------------------------------------------------------------


class OpaqueValidator:
    """Any value up to a size: for networks whose values only their applications read (the
    Lattica SDK's bincode); the first of several is kept."""

    def __init__(self, max_size: int = MAX_OPAQUE_VALUE) -> None:
        self.max_size = max_size

    def validate(self, key: bytes, value: bytes, now: float) -> None:
        """RecordRejected if ``value`` is over the size cap."""
        if len(value) > self.max_size:
            raise RecordRejected(f"a value of {len(value)} bytes (at most {self.max_size})")

    def select(self, key: bytes, values: Sequence[bytes]) -> int:
        """The first: opaque values cannot be ordered."""
        _check_some(values)
        return 0


def _check_some(values: Sequence[bytes]) -> None:
    if not values:
        raise ValueError("nothing to select from")


class Validators:
    """Dispatches by a key's namespace (``/ns/rest``) as go-libp2p-record's NamespacedValidator
    does; a key of another namespace, or of none, goes to ``default`` or is rejected."""

    def __init__(self, validators: Mapping[str, Validator], default: Validator | None = None) -> None:
        self._validators = dict(validators)
        self._default = default

    def validator_for(self, key: bytes) -> Validator:
        """The validator of ``key``'s namespace; RecordRejected if there is none."""
        end = key.find(b"/", 1)
        if key[:1] == b"/" and end > 1:
            try:
                found = self._validators.get(key[1:end].decode())
            except UnicodeDecodeError:
                found = None
            if found is not None:
                return found
        if self._default is not None:
            return self._default
        raise RecordRejected(f"no validator for the namespace of key {key[:32]!r}")

    def validate(self, key: bytes, value: bytes, now: float) -> None:
        """The namespace's validator's verdict."""
        self.validator_for(key).validate(key, value, now)

    def select(self, key: bytes, values: Sequence[bytes]) -> int:
        """The namespace's validator's choice."""
        return self.validator_for(key).select(key, values)


def ipfs_validators(public_keys: Callable[[PeerId], bytes | None] | None = None) -> Validators:
    """What go-libp2p-kad-dht accepts by default: ``/pk/`` and ``/ipns/`` records, nothing else."""
    return Validators({"pk": PublicKeyValidator(), "ipns": IpnsValidator(public_keys)})
