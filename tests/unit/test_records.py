"""DHT records: subkey encoding, owner binding and signatures, validation limits, and the bounded
RecordStore (merging, tombstones, quotas, rate limit, providers, peer records, dump/load)."""

import time

import msgpack
import pytest

from lattica._identity import KeyPair, PeerId
from lattica._multiaddr import Multiaddr
from lattica.dht import _records as records
from lattica.dht._kademlia import key_id
from lattica.dht._records import (
    TOMBSTONE,
    Entry,
    PeerRecord,
    RecordStore,
    StoreLimits,
    check_entry,
    decode_subkey,
    encode_subkey,
    owned_key,
    owner_of,
    sign_entry,
)
from lattica.errors import RecordRejected

NOW = 1_700_000_000.0
A = KeyPair.from_seed(bytes([1]) * 32)
B = KeyPair.from_seed(bytes([2]) * 32)
C = KeyPair.from_seed(bytes([3]) * 32)
ADDRS = [Multiaddr("/ip4/1.2.3.4/tcp/4001"), Multiaddr("/ip4/1.2.3.4/udp/4001/quic-v1")]


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def akey(name: str = "cfg", owner: KeyPair = A) -> bytes:
    return owned_key(name, owner.peer_id).encode()


def store(clock: Clock | None = None, **limits) -> RecordStore:
    return RecordStore(StoreLimits(**limits), clock=clock or Clock())


def held(s: RecordStore, key: bytes) -> dict[bytes, Entry]:
    got = s.get(key_id(key))
    return got[1] if got is not None else {}


# -- subkeys -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", "name", "héllo", b"", b"\x00\xff raw", 0, 7, -17, 2**80, A.peer_id])
def test_subkey_round_trip(value):
    raw = encode_subkey(value)
    assert type(raw) is bytes
    back = decode_subkey(raw)
    assert back == value and type(back) is type(value)


def test_subkeys_of_different_types_never_collide():
    forms = [None, "1", b"1", 1, A.peer_id, "", b""]
    assert len({encode_subkey(v) for v in forms}) == len(forms)


def test_byte_like_subkeys_decode_as_bytes():
    assert decode_subkey(encode_subkey(bytearray(b"ab"))) == b"ab"
    assert decode_subkey(encode_subkey(memoryview(b"ab"))) == b"ab"


@pytest.mark.parametrize("value", [1.5, True, False, [1], (1,), {"a": 1}, object()])
def test_other_subkey_types_raise_type_error(value):
    with pytest.raises(TypeError):
        encode_subkey(value)


@pytest.mark.parametrize("raw", [b"x123", b"s\xff", b"i12a", b"i", b"p\x00"])
def test_malformed_subkeys_are_refused(raw):
    with pytest.raises(RecordRejected, match="malformed subkey"):
        decode_subkey(raw)


# -- owners and signatures ---------------------------------------------------------------------


def test_owner_of_a_key_marker_or_a_peer_id_subkey():
    assert owner_of(akey("cfg", A), b"") == A.peer_id
    assert owner_of(b"prefix/" + akey("x", B) + b"/suffix", encode_subkey("s")) == B.peer_id
    assert owner_of(b"plain", encode_subkey(B.peer_id)) == B.peer_id
    assert owner_of(akey("cfg", A), encode_subkey(B.peer_id)) == A.peer_id  # the key's marker wins
    assert owner_of(b"plain", encode_subkey("s")) is None
    assert owner_of(b"plain", b"") is None


def test_an_invalid_owner_is_rejected():
    with pytest.raises(RecordRejected):
        owner_of(b"k[owner:" + b"1" * 40 + b"]", b"")  # base58 of zero bytes: not a multihash
    with pytest.raises(RecordRejected):
        owner_of(b"k", b"p\x00garbage")


def test_a_signed_owned_record_is_accepted():
    lim = StoreLimits()
    key = akey()
    e = sign_entry(A, key, b"", b"value", NOW + 60)
    assert len(e.signature) == 64
    got = check_entry(key, b"", e, NOW, lim)
    assert got == Entry(b"value", NOW + 60, e.signature)
    sk = encode_subkey(A.peer_id)
    e2 = sign_entry(A, b"plain", sk, b"value", NOW + 60)
    assert check_entry(b"plain", sk, e2, NOW, lim).signature == e2.signature


def test_an_int_expiration_verifies_like_the_float_it_was_signed_as():
    e = sign_entry(A, akey(), b"", b"v", NOW + 60)
    check_entry(akey(), b"", Entry(b"v", int(NOW + 60), e.signature), NOW, StoreLimits())


def test_unowned_records_need_no_signature_and_keep_none():
    e = sign_entry(A, b"plain", b"sfree", b"v", NOW + 60)
    assert e.signature == b""
    got = check_entry(b"plain", b"sfree", Entry(b"v", NOW + 60, b"junk"), NOW, StoreLimits())
    assert got == Entry(b"v", NOW + 60, b"")


@pytest.mark.parametrize(
    "key, subkey, value, expiration",
    [
        (akey(), b"", b"other value", NOW + 60),
        (akey(), b"", b"value", NOW + 61),
        (akey(), encode_subkey("s"), b"value", NOW + 60),
        (akey("another name"), b"", b"value", NOW + 60),
    ],
    ids=["value", "expiration", "subkey", "key"],
)
def test_a_tampered_record_is_rejected(key, subkey, value, expiration):
    signed = sign_entry(A, akey(), b"", b"value", NOW + 60)
    with pytest.raises(RecordRejected, match="not signed"):
        check_entry(key, subkey, Entry(value, expiration, signed.signature), NOW, StoreLimits())


def test_a_record_owned_by_a_cannot_be_signed_by_b():
    with pytest.raises(RecordRejected):
        sign_entry(B, akey(owner=A), b"", b"v", NOW + 60)
    # B's signature over exactly this record's payload
    forged = B.sign(records._payload(akey(owner=A), b"", b"v", NOW + 60))
    with pytest.raises(RecordRejected, match="not signed"):
        check_entry(akey(owner=A), b"", Entry(b"v", NOW + 60, forged), NOW, StoreLimits())
    sk = encode_subkey(A.peer_id)
    forged = B.sign(records._payload(b"plain", sk, b"v", NOW + 60))
    with pytest.raises(RecordRejected, match="not signed"):
        check_entry(b"plain", sk, Entry(b"v", NOW + 60, forged), NOW, StoreLimits())


@pytest.mark.parametrize("signature", [b"", b"\x00" * 64, b"\x01" * 63])
def test_an_unsigned_or_badly_signed_owned_record_is_rejected(signature):
    for key, sk in [(akey(), b""), (b"plain", encode_subkey(A.peer_id))]:
        with pytest.raises(RecordRejected):
            check_entry(key, sk, Entry(b"v", NOW + 60, signature), NOW, StoreLimits())


def test_an_owner_without_an_inlined_key_can_never_sign():
    hashed = PeerId.from_bytes(b"\x12\x20" + bytes(32))  # sha256 PeerId: no public key inside
    sk = encode_subkey(hashed)
    with pytest.raises(RecordRejected):
        check_entry(b"plain", sk, Entry(b"v", NOW + 60, b"\x00" * 64), NOW, StoreLimits())


def test_size_limits():
    lim = StoreLimits(max_key=8, max_subkey=4, max_value=16)
    ok = NOW + 60
    check_entry(b"k" * 8, b"s" * 4, Entry(b"v" * 16, ok), NOW, lim)
    for key, sk, value, what in [
        (b"", b"", b"v", "key"),
        (b"k" * 9, b"", b"v", "key"),
        (b"k", b"s" * 5, b"v", "subkey"),
        (b"k", b"", b"v" * 17, "value"),
    ]:
        with pytest.raises(RecordRejected, match=what):
            check_entry(key, sk, Entry(value, ok), NOW, lim)


def test_expiration_window():
    lim = StoreLimits(max_ttl=100.0, clock_skew=10.0)
    check_entry(b"k", b"", Entry(b"v", NOW + 0.001), NOW, lim)
    check_entry(b"k", b"", Entry(b"v", NOW + 110), NOW, lim)
    for exp in (NOW, NOW - 1, 0, NOW + 110.01, NOW + 10**9):
        with pytest.raises(RecordRejected, match="expire"):
            check_entry(b"k", b"", Entry(b"v", exp), NOW, lim)


@pytest.mark.parametrize(
    "key, subkey, entry",
    [
        ("k", b"", Entry(b"v", NOW + 1)),
        (b"k", "s", Entry(b"v", NOW + 1)),
        (b"k", b"", (b"v", NOW + 1)),
        (b"k", b"", Entry("v", NOW + 1)),
        (b"k", b"", Entry(b"v", NOW + 1, "sig")),
        (b"k", b"", Entry(b"v", float("nan"))),
        (b"k", b"", Entry(b"v", float("inf"))),
        (b"k", b"", Entry(b"v", True)),
        (b"k", b"", Entry(b"v", str(NOW + 1))),
    ],
)
def test_malformed_records_are_rejected(key, subkey, entry):
    with pytest.raises(RecordRejected):
        check_entry(key, subkey, entry, NOW, StoreLimits())


def test_wins_over():
    assert Entry(b"a", NOW + 2).wins_over(Entry(b"z", NOW + 1))
    assert not Entry(b"z", NOW + 1).wins_over(Entry(b"a", NOW + 2))
    assert Entry(b"b", NOW + 1).wins_over(Entry(b"a", NOW + 1))
    assert not Entry(b"a", NOW + 1).wins_over(Entry(b"b", NOW + 1))
    assert not Entry(b"a", NOW + 1).wins_over(Entry(b"a", NOW + 1))
    assert Entry(b"", NOW + 2).wins_over(Entry(b"value", NOW + 1))  # a later tombstone


# -- the store: merging ------------------------------------------------------------------------


def test_put_get_and_identical_put():
    s = store()
    assert s.get(key_id(b"k")) is None
    assert s.put(b"k", b"s", Entry(b"v", NOW + 60), A.peer_id) is True
    assert s.get(key_id(b"k")) == (b"k", {b"s": Entry(b"v", NOW + 60)})
    v = s.version
    assert s.put(b"k", b"s", Entry(b"v", NOW + 60), B.peer_id) is False
    assert s.version == v
    assert s.record_count == 1


def test_subkeys_merge_and_a_later_expiration_wins():
    s = store()
    s.put(b"k", b"s1", Entry(b"one", NOW + 60), A.peer_id)
    s.put(b"k", b"s2", Entry(b"two", NOW + 60), B.peer_id)
    assert s.put(b"k", b"s1", Entry(b"one'", NOW + 70), A.peer_id) is True
    assert held(s, b"k") == {b"s1": Entry(b"one'", NOW + 70), b"s2": Entry(b"two", NOW + 60)}
    with pytest.raises(RecordRejected, match="newer"):
        s.put(b"k", b"s1", Entry(b"stale", NOW + 65), A.peer_id)
    assert held(s, b"k")[b"s1"] == Entry(b"one'", NOW + 70)
    assert s.record_count == 2


def test_an_expiration_tie_is_broken_by_the_larger_value_in_any_order():
    small, large = Entry(b"aaa", NOW + 60), Entry(b"bbb", NOW + 60)
    s1, s2 = store(), store()
    s1.put(b"k", b"", small, A.peer_id)
    assert s1.put(b"k", b"", large, A.peer_id) is True
    s2.put(b"k", b"", large, A.peer_id)
    with pytest.raises(RecordRejected):
        s2.put(b"k", b"", small, A.peer_id)
    assert held(s1, b"k") == held(s2, b"k") == {b"": large}


def test_expired_records_are_not_returned_and_free_their_subkey():
    clock = Clock()
    s = store(clock)
    s.put(b"k", b"s", Entry(b"v", NOW + 60), A.peer_id)
    clock.t = NOW + 60
    assert s.get(key_id(b"k")) is None
    assert s.record_count == 0
    assert s.put(b"k", b"s", Entry(b"again", NOW + 61), A.peer_id) is True
    assert held(s, b"k") == {b"s": Entry(b"again", NOW + 61)}
    assert s.record_count == 1


def test_a_tombstone_wins_by_expiration():
    s = store()
    key, sk = akey(), encode_subkey("s")
    s.put(key, sk, sign_entry(A, key, sk, b"v", NOW + 60), A.peer_id)
    with pytest.raises(RecordRejected):
        s.put(key, sk, sign_entry(A, key, sk, TOMBSTONE, NOW + 59), A.peer_id)
    with pytest.raises(RecordRejected):  # at the same expiration the value (larger) wins
        s.put(key, sk, sign_entry(A, key, sk, TOMBSTONE, NOW + 60), A.peer_id)
    tomb = sign_entry(A, key, sk, TOMBSTONE, NOW + 120)
    assert s.put(key, sk, tomb, A.peer_id) is True
    assert held(s, key) == {sk: tomb}  # get returns tombstones
    with pytest.raises(RecordRejected):
        s.put(key, sk, sign_entry(A, key, sk, b"v", NOW + 90), A.peer_id)
    assert s.put(key, sk, sign_entry(A, key, sk, b"back", NOW + 150), A.peer_id) is True


def test_the_store_validates_what_it_keeps():
    s = store()
    with pytest.raises(RecordRejected):
        s.put(akey(), b"", Entry(b"v", NOW + 60), B.peer_id)  # owned, unsigned
    with pytest.raises(RecordRejected):
        s.put(b"k", b"", Entry(b"v", NOW - 1), B.peer_id)
    assert s.record_count == 0 and s.usage(B.peer_id) == (0, 0)


def test_max_subkeys_per_key():
    clock = Clock()
    s = store(clock, max_subkeys=3)
    s.put(b"k", b"s1", Entry(b"v", NOW + 10), A.peer_id)
    s.put(b"k", b"s2", Entry(b"v", NOW + 100), A.peer_id)
    s.put(b"k", b"s3", Entry(b"v", NOW + 100), A.peer_id)
    with pytest.raises(RecordRejected, match="subkeys"):
        s.put(b"k", b"s4", Entry(b"v", NOW + 100), A.peer_id)
    assert s.put(b"k", b"s3", Entry(b"v2", NOW + 100), A.peer_id) is True  # existing subkeys update
    assert s.put(b"other", b"s4", Entry(b"v", NOW + 100), A.peer_id) is True  # per key
    clock.t = NOW + 10  # s1 expired: its place is free
    assert s.put(b"k", b"s4", Entry(b"v", NOW + 100), A.peer_id) is True
    assert set(held(s, b"k")) == {b"s2", b"s3", b"s4"}
    assert s.record_count == 4
    with pytest.raises(RecordRejected, match="subkeys"):
        s.put(b"k", b"s5", Entry(b"v", NOW + 100), A.peer_id)


def test_a_full_key_whose_subkeys_all_expired_takes_a_new_one():
    clock = Clock()
    s = store(clock, max_subkeys=2)
    s.put(b"k", b"s1", Entry(b"v", NOW + 10), A.peer_id)
    s.put(b"k", b"s2", Entry(b"v", NOW + 10), A.peer_id)
    clock.t = NOW + 20
    assert s.put(b"k", b"s3", Entry(b"new", NOW + 100), A.peer_id) is True
    assert held(s, b"k") == {b"s3": Entry(b"new", NOW + 100)}
    assert s.record_count == 1


# -- the store: quotas and limits --------------------------------------------------------------


def test_per_peer_record_quota():
    s = store(peer_records=2)
    a, b = A.peer_id, B.peer_id
    s.put(b"k", b"1", Entry(b"v", NOW + 60), a)
    s.put(b"k", b"2", Entry(b"v", NOW + 60), a)
    assert s.usage(a)[0] == 2
    with pytest.raises(RecordRejected, match="quota"):
        s.put(b"k", b"3", Entry(b"v", NOW + 60), a)
    assert b"3" not in held(s, b"k")
    assert s.put(b"k", b"3", Entry(b"v", NOW + 60), b) is True  # quotas are per peer
    # overwriting its own record at the quota is allowed and not charged twice
    assert s.put(b"k", b"1", Entry(b"v2", NOW + 70), a) is True
    assert s.usage(a)[0] == 2
    # B overwriting A's record moves the charge to B
    s.put(b"k", b"2", Entry(b"v2", NOW + 70), b)
    assert s.usage(a)[0] == 1 and s.usage(b)[0] == 2
    assert s.put(b"k", b"4", Entry(b"v", NOW + 60), a) is True
    assert s.record_count == 4


def test_per_peer_byte_quota_and_overwrite_credit():
    size = records._size(b"k", b"1", Entry(b"x" * 100, NOW + 60))
    s = store(peer_bytes=size)
    a = A.peer_id
    s.put(b"k", b"1", Entry(b"x" * 100, NOW + 60), a)
    assert s.usage(a) == (1, size)
    with pytest.raises(RecordRejected, match="quota"):
        s.put(b"k", b"2", Entry(b"y", NOW + 60), a)
    assert s.put(b"k", b"1", Entry(b"z" * 100, NOW + 70), a) is True  # same size, replaces
    assert s.usage(a) == (1, size)
    with pytest.raises(RecordRejected, match="quota"):
        s.put(b"k", b"1", Entry(b"z" * 101, NOW + 80), a)
    assert s.usage(a) == (1, size)


def test_the_local_peer_has_no_quota():
    local = C.peer_id
    s = RecordStore(StoreLimits(peer_records=1), local=local, clock=Clock())
    for i in range(5):
        s.put(b"k", str(i).encode(), Entry(b"v", NOW + 60), local)
    assert s.record_count == 5


def test_usage_is_released_when_records_expire():
    clock = Clock()
    s = store(clock, peer_records=1)
    s.put(b"k", b"1", Entry(b"v", NOW + 10), A.peer_id)
    clock.t = NOW + 10
    s.purge()
    assert s.usage(A.peer_id) == (0, 0) and s.record_count == 0
    assert s.put(b"k", b"2", Entry(b"v", NOW + 60), A.peer_id) is True


def test_total_record_cap():
    clock = Clock()
    s = store(clock, max_records=2)
    s.put(b"k1", b"", Entry(b"v", NOW + 10), A.peer_id)
    s.put(b"k2", b"", Entry(b"v", NOW + 60), B.peer_id)
    with pytest.raises(RecordRejected, match="full"):
        s.put(b"k3", b"", Entry(b"v", NOW + 60), C.peer_id)
    assert s.put(b"k2", b"", Entry(b"v2", NOW + 70), B.peer_id) is True  # replacing needs no room
    clock.t = NOW + 10  # k1 expired: purged to make room
    assert s.put(b"k3", b"", Entry(b"v", NOW + 60), C.peer_id) is True
    assert s.record_count == 2
    assert s.get(key_id(b"k3")) is not None and s.get(key_id(b"k1")) is None


def test_total_byte_cap():
    size = records._size(b"k1", b"", Entry(b"x" * 100, NOW + 60))
    s = store(max_bytes=2 * size)
    s.put(b"k1", b"", Entry(b"x" * 100, NOW + 60), A.peer_id)
    s.put(b"k2", b"", Entry(b"x" * 100, NOW + 60), B.peer_id)
    with pytest.raises(RecordRejected, match="full"):
        s.put(b"k3", b"", Entry(b"x", NOW + 60), C.peer_id)
    with pytest.raises(RecordRejected, match="full"):
        s.put(b"k1", b"", Entry(b"x" * 101, NOW + 70), A.peer_id)
    assert s.put(b"k1", b"", Entry(b"y" * 100, NOW + 70), A.peer_id) is True


def test_a_full_store_keeps_a_new_subkey_of_a_key_whose_records_expired():
    clock = Clock()
    s = store(clock, max_records=1)
    s.put(b"k", b"s1", Entry(b"v", NOW + 10), A.peer_id)
    clock.t = NOW + 20
    assert s.put(b"k", b"s2", Entry(b"new", NOW + 100), A.peer_id) is True
    assert held(s, b"k") == {b"s2": Entry(b"new", NOW + 100)}


# -- rate limit --------------------------------------------------------------------------------


def test_admit_rate_limit_and_refill(monkeypatch):
    t = [1000.0]
    monkeypatch.setattr(records.time, "monotonic", lambda: t[0])
    s = RecordStore(StoreLimits(rate=2.0, burst=3.0), local=C.peer_id)
    for _ in range(3):
        s.admit(A.peer_id)
    with pytest.raises(RecordRejected, match="rate"):
        s.admit(A.peer_id)
    s.admit(B.peer_id)  # buckets are per peer
    for _ in range(100):
        s.admit(C.peer_id)  # the local peer is never limited
    t[0] += 0.5  # one token back
    s.admit(A.peer_id)
    with pytest.raises(RecordRejected):
        s.admit(A.peer_id)
    t[0] += 100.0  # refills up to the burst, no more
    for _ in range(3):
        s.admit(A.peer_id)
    with pytest.raises(RecordRejected):
        s.admit(A.peer_id)


# -- providers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("ttl", [0, -1, 100.5, float("nan"), float("inf"), True, "10", None])
def test_provider_ttl_bounds(ttl):
    s = store(max_ttl=100.0)
    with pytest.raises(RecordRejected, match="ttl"):
        s.add_provider(b"cid", A.peer_id, ttl)
    assert s.providers(b"cid") == []


@pytest.mark.parametrize("cid", [b"", b"c" * 9, "cid", bytearray(b"cid")])
def test_provider_content_id_bounds(cid):
    s = store(max_key=8)
    with pytest.raises(RecordRejected, match="content id"):
        s.add_provider(cid, A.peer_id, 10)


def test_providers_limit_refresh_and_expiry():
    clock = Clock()
    s = store(clock, max_providers=2, max_ttl=100.0)
    s.add_provider(b"cid", A.peer_id, 10)
    s.add_provider(b"cid", B.peer_id, 100)
    with pytest.raises(RecordRejected, match="providers"):
        s.add_provider(b"cid", C.peer_id, 50)
    s.add_provider(b"other", C.peer_id, 50)  # per content id
    s.add_provider(b"cid", B.peer_id, 5)  # a refresh never shortens
    assert sorted(s.providers(b"cid")) == sorted([(A.peer_id, NOW + 10), (B.peer_id, NOW + 100)])
    clock.t = NOW + 10
    assert s.providers(b"cid") == [(B.peer_id, NOW + 100)]
    s.add_provider(b"cid", C.peer_id, 50)  # A expired: room again
    assert sorted(s.providers(b"cid")) == sorted([(B.peer_id, NOW + 100), (C.peer_id, NOW + 60)])
    clock.t = NOW + 60
    assert s.providers(b"cid") == [(B.peer_id, NOW + 100)]
    s.add_provider(b"cid", C.peer_id, 1)  # expired providers may come back
    assert sorted(s.providers(b"cid")) == sorted([(B.peer_id, NOW + 100), (C.peer_id, NOW + 61)])
    clock.t = NOW + 100
    assert s.providers(b"cid") == []


def test_provider_keys_cap():
    clock = Clock()
    s = store(clock, max_provider_keys=1)
    s.add_provider(b"c1", A.peer_id, 10)
    with pytest.raises(RecordRejected, match="full"):
        s.add_provider(b"c2", A.peer_id, 10)
    clock.t = NOW + 10
    s.add_provider(b"c2", A.peer_id, 10)
    assert s.providers(b"c2") == [(A.peer_id, NOW + 20)]


# -- peer records ------------------------------------------------------------------------------


def test_peer_record_round_trip():
    rec = PeerRecord.create(A, ADDRS, seq=5)
    wire = msgpack.unpackb(msgpack.packb(rec.to_wire(), use_bin_type=True), raw=False)
    back = PeerRecord.from_wire(wire, StoreLimits())
    assert (back.peer, back.seq, back.addrs, back.signature) == (A.peer_id, 5, ADDRS, rec.signature)
    assert PeerRecord.create(A, ADDRS).seq > 0  # defaults to a clock-based sequence


def test_peer_record_forged_signature_is_rejected():
    wire = PeerRecord.create(A, ADDRS, seq=5).to_wire()
    wire[3] = bytes([wire[3][0] ^ 1]) + wire[3][1:]
    with pytest.raises(RecordRejected, match="not signed"):
        PeerRecord.from_wire(wire, StoreLimits())


def test_peer_record_for_another_peer_is_rejected():
    wire = PeerRecord.create(A, ADDRS, seq=5).to_wire()
    wire[0] = B.peer_id.to_bytes()  # A's signature, claiming to be B's record
    with pytest.raises(RecordRejected, match="not signed"):
        PeerRecord.from_wire(wire, StoreLimits())


@pytest.mark.parametrize("field, value", [(1, 6), (2, ["/ip4/6.6.6.6/tcp/1"]), (2, [])])
def test_peer_record_tampered_fields_are_rejected(field, value):
    wire = PeerRecord.create(A, ADDRS, seq=5).to_wire()
    wire[field] = value
    with pytest.raises(RecordRejected):
        PeerRecord.from_wire(wire, StoreLimits())


def test_peer_record_with_too_many_addresses_is_rejected():
    addrs = [Multiaddr(f"/ip4/10.0.0.{i}/tcp/4001") for i in range(3)]
    wire = PeerRecord.create(A, addrs, seq=1).to_wire()
    PeerRecord.from_wire(wire, StoreLimits(max_addrs=3))
    with pytest.raises(RecordRejected, match="addresses"):
        PeerRecord.from_wire(wire, StoreLimits(max_addrs=2))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda w: w[:3],
        lambda w: tuple(w),
        lambda w: [w[0].hex(), *w[1:]],
        lambda w: [w[0], True, *w[2:]],
        lambda w: [w[0], -1, *w[2:]],
        lambda w: [w[0], 1 << 63, *w[2:]],
        lambda w: [w[0], w[1], ["/ip4/1.2.3.4/tcp/4001", 7], w[3]],
        lambda w: [w[0], w[1], ["/bogus/1"], w[3]],
        lambda w: [w[0], w[1], ["/ip4/1.2.3.4/tcp/" + "1" * 1100], w[3]],
        lambda w: [b"\x00\x01", *w[1:]],
    ],
)
def test_malformed_peer_records_are_rejected(mutate):
    wire = PeerRecord.create(A, ADDRS, seq=5).to_wire()
    with pytest.raises(RecordRejected):
        PeerRecord.from_wire(mutate(wire), StoreLimits())


def test_stored_peer_records_keep_the_highest_seq_and_refresh_on_equal():
    clock = Clock()
    s = store(clock, peer_record_ttl=100.0)
    assert s.put_peer_record(PeerRecord.create(A, ADDRS, seq=5)) is True
    with pytest.raises(RecordRejected, match="newer"):
        s.put_peer_record(PeerRecord.create(A, ADDRS[:1], seq=4))
    assert s.peer_record(A.peer_id).seq == 5
    clock.t = NOW + 80
    assert s.put_peer_record(PeerRecord.create(A, ADDRS[:1], seq=5)) is False  # refreshed, kept
    held_rec = s.peer_record(A.peer_id)
    assert held_rec.seq == 5 and held_rec.addrs == ADDRS
    clock.t = NOW + 150  # alive only thanks to the refresh at +80
    assert s.peer_record(A.peer_id) is not None
    assert s.put_peer_record(PeerRecord.create(A, ADDRS[:1], seq=6)) is True
    assert s.peer_record(A.peer_id).addrs == ADDRS[:1]
    assert s.peer_record(B.peer_id) is None
    clock.t = NOW + 250
    assert s.peer_record(A.peer_id) is None
    assert s.put_peer_record(PeerRecord.create(A, ADDRS, seq=1)) is True  # the old one expired


# -- persistence -------------------------------------------------------------------------------


def filled_store(clock: Clock) -> RecordStore:
    s = RecordStore(StoreLimits(peer_record_ttl=1000.0), clock=clock)
    s.put(b"plain", b"s", Entry(b"free", NOW + 500), B.peer_id)
    s.put(b"short", b"", Entry(b"soon", NOW + 50), B.peer_id)
    key = akey()
    s.put(key, b"", sign_entry(A, key, b"", b"owned", NOW + 500), A.peer_id)
    s.add_provider(b"cid", A.peer_id, 500)
    s.add_provider(b"cid", B.peer_id, 50)
    s.put_peer_record(PeerRecord.create(A, ADDRS, seq=3))
    return s


def test_dump_load_round_trip():
    clock = Clock()
    s = filled_store(clock)
    fresh = RecordStore(StoreLimits(), clock=Clock())
    assert fresh.load(s.dump()) == 3 + 2 + 1
    for key in (b"plain", b"short", akey()):
        assert fresh.get(key_id(key)) == s.get(key_id(key))
    assert sorted(fresh.providers(b"cid")) == sorted(s.providers(b"cid"))
    rec = fresh.peer_record(A.peer_id)
    assert (rec.seq, rec.addrs) == (3, ADDRS)
    assert fresh.usage(A.peer_id) == s.usage(A.peer_id)  # quotas charged to the same peers
    assert fresh.usage(B.peer_id) == s.usage(B.peer_id)


def test_load_drops_what_expired_since_the_dump():
    s = filled_store(Clock())
    later = RecordStore(StoreLimits(), clock=Clock(NOW + 100))
    assert later.load(s.dump()) == 2 + 1 + 1
    assert later.get(key_id(b"short")) is None
    assert later.get(key_id(b"plain")) is not None
    assert later.providers(b"cid") == [(A.peer_id, NOW + 500)]
    assert later.peer_record(A.peer_id) is not None
    much_later = RecordStore(StoreLimits(), clock=Clock(NOW + 1000))
    assert much_later.load(s.dump()) == 0
    assert much_later.peer_record(A.peer_id) is None


def test_dump_leaves_out_expired_records():
    clock = Clock()
    s = filled_store(clock)
    clock.t = NOW + 100
    obj = msgpack.unpackb(s.dump(), raw=False)
    assert [row[0] for row in obj["values"]] == [b"plain", akey()]
    assert [len(provs) for _, provs in obj["providers"]] == [1]


def test_load_drops_tampered_records():
    s = filled_store(Clock())
    obj = msgpack.unpackb(s.dump(), raw=False)
    for row in obj["values"]:
        if row[0] == akey():
            row[2] = b"forged"
        if row[0] == b"short":
            row[3] = NOW + 10**8  # beyond max_ttl
    obj["peers"][0][0][2] = ["/ip4/6.6.6.6/tcp/1"]
    fresh = RecordStore(StoreLimits(), clock=Clock())
    assert fresh.load(msgpack.packb(obj, use_bin_type=True)) == 1 + 2
    assert fresh.get(key_id(akey())) is None
    assert fresh.get(key_id(b"short")) is None
    assert fresh.get(key_id(b"plain")) is not None
    assert fresh.peer_record(A.peer_id) is None


def test_load_skips_a_provider_entry_with_a_corrupt_peer_id():
    s = filled_store(Clock())
    obj = msgpack.unpackb(s.dump(), raw=False)
    obj["providers"][0][1][0][0] = b"\x00\x01"  # not a PeerId multihash
    fresh = RecordStore(StoreLimits(), clock=Clock())
    fresh.load(msgpack.packb(obj, use_bin_type=True))
    assert len(fresh.providers(b"cid")) == 1
    assert fresh.get(key_id(b"plain")) is not None


def test_load_refuses_other_files():
    with pytest.raises(ValueError):
        RecordStore().load(msgpack.packb({"v": 2}))
    with pytest.raises(ValueError):
        RecordStore().load(msgpack.packb([1, 2]))


def test_a_flood_of_new_peers_does_not_reset_an_active_peers_rate_limit():
    store = RecordStore(StoreLimits(rate=0.001, burst=1.0))
    attacker = KeyPair.generate().peer_id
    store.admit(attacker)
    with pytest.raises(RecordRejected, match="rate limit"):
        store.admit(attacker)
    others = [PeerId.from_bytes(b"\x00\x24\x08\x01\x12\x20" + i.to_bytes(32, "big")) for i in range(10_001)]
    for p in others[:5000]:
        store.admit(p)
    with pytest.raises(RecordRejected, match="rate limit"):
        store.admit(attacker)  # still limited, and now among the most recently active
    for p in others[5000:]:
        store.admit(p)  # past 10,000 tracked peers: only the least recently active are forgotten
    with pytest.raises(RecordRejected, match="rate limit"):
        store.admit(attacker)


def test_provider_and_peer_records_are_charged_to_the_storing_peers_quota():
    limits = StoreLimits(peer_records=10)
    st = RecordStore(limits)
    attacker, honest = KeyPair.generate().peer_id, KeyPair.generate().peer_id
    for i in range(10):
        st.add_provider(b"junk-%d" % i, attacker, 3600)
    assert st.usage(attacker)[0] == 10 and st.usage(attacker)[1] > 0
    with pytest.raises(RecordRejected, match="quota"):
        st.add_provider(b"junk-10", attacker, 3600)
    st.add_provider(b"junk-0", attacker, 7200)  # refreshing its own record costs nothing more
    assert st.usage(attacker)[0] == 10
    st.add_provider(b"real-content", honest, 3600)  # the attacker's quota is not everyone's
    assert [p for p, _ in st.providers(b"real-content")] == [honest]
    assert st.usage(honest)[0] == 1

    # peer records: charged to whoever stored them, by their size in bytes
    st2 = RecordStore(StoreLimits(peer_records=1000, peer_bytes=20_000))
    sender = KeyPair.generate().peer_id
    long = "/dns4/" + ".".join(["a" * 60] * 3) + "/tcp/"
    rec = PeerRecord.create(KeyPair.generate(), [Multiaddr(f"{long}{i}") for i in range(1, 33)])
    text_bytes = sum(len(t) for t in rec.texts)
    assert text_bytes > 5000
    assert st2.put_peer_record(rec, sender) is True
    records, used = st2.usage(sender)
    assert records == 1 and used >= text_bytes
    st2.put_peer_record(PeerRecord.create(KeyPair.generate(), rec.addrs), sender)
    st2.put_peer_record(PeerRecord.create(KeyPair.generate(), rec.addrs), sender)
    with pytest.raises(RecordRejected, match="quota"):  # a fourth ~6 KB record passes 20 000 bytes
        st2.put_peer_record(PeerRecord.create(KeyPair.generate(), rec.addrs), sender)
    assert st2.usage(sender)[0] == 3
    # a peer's own record, published by itself, counts against its own quota
    own = KeyPair.generate()
    st2.put_peer_record(PeerRecord.create(own, [Multiaddr("/ip4/192.0.2.1/tcp/4001")]))
    assert st2.usage(own.peer_id)[0] == 1


def test_a_hostile_store_file_is_skipped_and_the_node_still_starts(tmp_path):
    import lattica

    kp = KeyPair.generate()
    good_peer = PeerRecord.create(kp, [Multiaddr("/ip4/1.2.3.4/tcp/1")]).to_wire()
    writer = KeyPair.generate().peer_id
    good_value = [b"good-key", b"", b"\xa1v", time.time() + 600, b"", writer.to_bytes()]
    hostile = [
        {"v": 1, "values": 5},
        {"v": 1, "providers": None},
        {"v": 1, "peers": [[good_peer, "soon"]]},
        {
            "v": 1,
            "values": [None, 7, "x", [1, 2], good_value],
            "providers": [[b"\x00" * 32, None], 3, [b"k", [[b"not-a-peer", 1e18]]]],
            "peers": "abc",
        },
        {"v": 1, "values": {"a": 1}, "providers": {"b": 2}, "peers": [[None, None], [good_peer, None], 5]},
    ]
    for obj in hostile:
        st = RecordStore()
        st.load(msgpack.packb(obj, use_bin_type=True))  # never raises on wrong shapes
    st = RecordStore()
    assert st.load(msgpack.packb(hostile[3], use_bin_type=True)) == 1  # the one valid row is kept
    assert st.get(key_id(b"good-key"))[1][b""].value == b"\xa1v"

    for i, obj in enumerate(hostile + [b"\x93\x01\x02"]):  # the last: not even a dict
        path = tmp_path / f"dht-{i}.store"
        path.write_bytes(obj if isinstance(obj, bytes) else msgpack.packb(obj, use_bin_type=True))
        with lattica.Node(["/ip4/127.0.0.1/tcp/0"], dht_path=str(path)) as node:
            assert node.running  # the file was input like any other: bad rows skipped, good kept
            assert node._host.services.dht.store.record_count == (1 if i == 3 else 0)


# -- mesh-scoped keys ------------------------------------------------------------------------------


def test_a_mesh_scoped_key_takes_only_records_under_a_member_s_certificate():
    """Only members of a key's mesh write there (a stranger cannot fill it): the subkey is the
    writer's certificate of that mesh, verified by storing nodes and readers alike."""
    from lattica.dht._records import mesh_scoped, scope_of
    from lattica.trust import MeshKey

    mesh, other = MeshKey.from_text(MeshKey.generate().to_text()), MeshKey.generate()
    key = mesh_scoped(b"lattica/shard/llm/0:4", mesh.public)
    assert scope_of(key) == (mesh.public, b"lattica/shard/llm/0:4") and scope_of(b"lattica/shard/x") is None
    lim = StoreLimits()

    def put(signer, cert) -> Entry:
        sk = encode_subkey(cert) if cert is not None else encode_subkey(signer.peer_id)
        return check_entry(key, sk, sign_entry(signer, key, sk, b"v", NOW + 60), NOW, lim)

    cert = mesh.issue(A.peer_id, ttl=3600, now=NOW)
    assert put(A, cert).value == b"v"  # a member, under its certificate
    assert decode_subkey(encode_subkey(cert)) == cert and owner_of(key, encode_subkey(cert)) == A.peer_id
    for signer, bad, why in (
        (A, None, "certificates only"),  # a plain PeerId subkey
        (A, other.issue(A.peer_id, ttl=3600, now=NOW), "not a member"),  # another mesh's certificate
        (A, mesh.issue(A.peer_id, ttl=10, now=NOW - 60), "expired"),
        (B, cert, "only that peer can write it"),  # A's certificate, B's signature
    ):
        with pytest.raises(RecordRejected, match=why):
            put(signer, bad)
    forged = records.Certificate(cert.mesh, B.peer_id, cert.expires, cert.signature)  # A's signature on B's name
    with pytest.raises(RecordRejected, match="signature"):
        put(B, forged)
    with pytest.raises(RecordRejected, match="malformed"):
        check_entry(
            records.MESH_SCOPE + b"zz/x", encode_subkey(cert), sign_entry(A, b"k", b"", b"v", NOW + 60), NOW, lim
        )


def test_a_name_or_shard_key_takes_only_registrations_under_their_makers_signed_peer_id():
    """Issue 46, finding 2: unsigned junk subkeys (1,024 from one identity) filled a name's key,
    and members' get_actor found nothing."""
    for key in (b"lattica/actor/bank", b"lattica/shard/llm/0-8"):
        for junk in (encode_subkey("junk-1"), encode_subkey(7), b""):
            with pytest.raises(RecordRejected, match="PeerId of the node that makes it"):
                check_entry(key, junk, Entry(b"v", NOW + 60, b""), NOW, StoreLimits())
        sk = encode_subkey(A.peer_id)
        assert check_entry(key, sk, sign_entry(A, key, sk, b"v", NOW + 60), NOW, StoreLimits()).value == b"v"
    assert (
        check_entry(b"lattica/other", encode_subkey("x"), Entry(b"v", NOW + 60, b""), NOW, StoreLimits()).value == b"v"
    )


# -- strangers as a class (issue 46) -------------------------------------------------------------


def _class_store(clock: Clock, members: set, **limits) -> RecordStore:
    return RecordStore(StoreLimits(**limits), local=C.peer_id, clock=clock, member=lambda p: p in members)


def _identities(n: int) -> list[KeyPair]:
    return [KeyPair.from_seed(bytes([200, i % 256, i // 256]) + bytes(29)) for i in range(n)]


def test_strangers_together_hold_a_share_of_the_store_and_members_the_rest():
    member = KeyPair.from_seed(bytes([9]) * 32)
    s = _class_store(Clock(), {member.peer_id}, max_records=40, peer_records=4)
    strangers = _identities(25)  # each within its own quota of 4; together past the share of 10
    refused = 0
    for i, kp in enumerate(strangers):
        for j in range(4):
            try:
                s.put(f"junk-{i}-{j}".encode(), b"", Entry(b"x", NOW + 100), kp.peer_id)
            except RecordRejected as e:
                assert "outside its mesh" in str(e)
                refused += 1
    assert s.stranger_usage[0] == 10 and refused == 90
    for j in range(4):  # a member's stores still go in
        assert s.put(f"mine-{j}".encode(), b"", Entry(b"x", NOW + 100), member.peer_id)
    assert s.record_count == 14


def test_the_strangers_share_counts_bytes_too_and_frees_as_their_records_expire():
    clock = Clock()
    s = _class_store(clock, set(), max_bytes=4000, peer_bytes=4000)
    kp = _identities(2)
    s.put(b"k1", b"", Entry(b"x" * 700, NOW + 10), kp[0].peer_id)
    with pytest.raises(RecordRejected, match="outside its mesh"):
        s.put(b"k2", b"", Entry(b"y" * 700, NOW + 10), kp[1].peer_id)
    clock.t = NOW + 11
    assert s.put(b"k2", b"", Entry(b"y" * 700, NOW + 20), kp[1].peer_id)
    assert s.stranger_usage == s.usage(kp[1].peer_id)


def test_strangers_cannot_take_more_than_their_share_of_one_keys_subkeys():
    member = KeyPair.from_seed(bytes([9]) * 32)
    s = _class_store(Clock(), {member.peer_id}, max_subkeys=8)
    strangers = _identities(4)
    name = records.REGISTRY_PREFIX + b"bank"
    for kp in strangers[:2]:
        sk = encode_subkey(kp.peer_id)
        s.put(name, sk, sign_entry(kp, name, sk, b"v", NOW + 100), kp.peer_id)
    sk = encode_subkey(strangers[2].peer_id)
    with pytest.raises(RecordRejected, match="outside this node's mesh"):
        s.put(name, sk, sign_entry(strangers[2], name, sk, b"v", NOW + 100), strangers[2].peer_id)
    sk = encode_subkey(member.peer_id)
    assert s.put(name, sk, sign_entry(member, name, sk, b"v", NOW + 100), member.peer_id)
    # a stranger may still refresh its own record
    sk = encode_subkey(strangers[0].peer_id)
    assert s.put(name, sk, sign_entry(strangers[0], name, sk, b"w", NOW + 200), strangers[0].peer_id)


def test_strangers_together_take_a_share_of_one_contents_providers_and_rank_last():
    member = KeyPair.from_seed(bytes([9]) * 32)
    clock = Clock()
    s = _class_store(clock, {member.peer_id}, max_providers=8)
    strangers = _identities(3)
    for kp in strangers[:2]:  # they came first
        s.add_provider(b"topic", kp.peer_id, 100)
    with pytest.raises(RecordRejected, match="outside this node's mesh"):
        s.add_provider(b"topic", strangers[2].peer_id, 100)
    s.add_provider(b"topic", member.peer_id, 100)
    for _ in range(20):
        assert s.ranked_providers(b"topic")[0] == member.peer_id


def test_settled_providers_rank_above_newcomers_and_each_group_is_shuffled():
    import random

    clock = Clock()
    s = _class_store(clock, set(), max_providers=400, settled=100.0)
    old, new = _identities(60)[:30], _identities(60)[30:]
    for kp in old:
        s.add_provider(b"cid", kp.peer_id, 1000)
    clock.t = NOW + 150
    for kp in old:  # renewed before they lapsed: still settled
        s.add_provider(b"cid", kp.peer_id, 1000)
    for kp in new:
        s.add_provider(b"cid", kp.peer_id, 1000)
    first = s.ranked_providers(b"cid", random.Random(1))
    assert set(first[:30]) == {k.peer_id for k in old} and set(first[30:]) == {k.peer_id for k in new}
    assert first != s.ranked_providers(b"cid", random.Random(2))  # not arrival order, nor any fixed order
    clock.t = NOW + 1200  # lapsed: an old provider coming back is a newcomer again
    s.add_provider(b"cid", old[0].peer_id, 1000)
    s.add_provider(b"cid", new[0].peer_id, 1000)
    clock.t = NOW + 1200 + 101
    s.add_provider(b"cid", new[1].peer_id, 1000)
    assert s.ranked_providers(b"cid")[-1] == new[1].peer_id


def test_the_strangers_store_rate_is_shared_by_all_of_them():
    s = _class_store(Clock(), set(), stranger_rate=0.001, stranger_burst=5.0)
    kps = _identities(6)
    for kp in kps[:5]:
        s.admit(kp.peer_id)
    with pytest.raises(RecordRejected, match="all peers outside"):
        s.admit(kps[5].peer_id)
    s.admit(C.peer_id)  # ourselves: never limited


def test_a_member_store_is_not_charged_to_the_strangers_rate():
    member = KeyPair.from_seed(bytes([9]) * 32)
    s = _class_store(Clock(), {member.peer_id}, stranger_rate=0.001, stranger_burst=1.0)
    s.admit(_identities(1)[0].peer_id)
    for _ in range(10):
        s.admit(member.peer_id)


def test_provider_since_survives_a_dump():
    clock = Clock()
    s = _class_store(clock, set(), settled=100.0)
    kp = _identities(2)
    s.add_provider(b"cid", kp[0].peer_id, 1000)
    clock.t = NOW + 200
    s.add_provider(b"cid", kp[1].peer_id, 1000)
    fresh = _class_store(clock, set(), settled=100.0)
    fresh.load(s.dump())
    assert [fresh.ranked_providers(b"cid")[0]] == [kp[0].peer_id]


def test_a_mesh_scoped_keys_providers_show_their_certificate_of_the_mesh():
    from lattica.dht._records import mesh_scoped
    from lattica.trust import MeshKey

    mesh, other = MeshKey.generate(), MeshKey.generate()
    key = mesh_scoped(b"\x12\x20" + bytes(32), mesh.public)
    s = store()
    for cert, why in (
        (b"", "shows its certificate"),
        (b"junk", "malformed"),
        (other.issue(A.peer_id).to_bytes(), "not a member"),
        (mesh.issue(B.peer_id).to_bytes(), "issued to"),
        (mesh.issue(A.peer_id, ttl=10, now=NOW - 100).to_bytes(), "expired"),
    ):
        with pytest.raises(RecordRejected, match=why):
            s.add_provider(key, A.peer_id, 100, cert)
    forged = bytearray(mesh.issue(A.peer_id).to_bytes())
    forged[50] ^= 1  # (a byte of the signature)
    with pytest.raises(RecordRejected, match="signature"):
        s.add_provider(key, A.peer_id, 100, bytes(forged))
    assert s.providers(key) == []
    s.add_provider(key, A.peer_id, 100, mesh.issue(A.peer_id).to_bytes())
    assert [p for p, _ in s.providers(key)] == [A.peer_id]
    s.add_provider(b"plain", B.peer_id, 100)  # (a plain key: anyone)
