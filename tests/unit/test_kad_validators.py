"""libp2p Kademlia's record validators (lattica/dht/_libp2p_validators.py): /pk/ and /ipns/ as
go-libp2p-kad-dht and boxo judge them, checked on our own records, on crafted ones (each rejection
once) and on the IPNS spec's published test vectors; the DAG-CBOR reader and RFC 3339 parser on
their edges; selection; namespaces; and random bytes as RecordRejected only."""

from __future__ import annotations

import random
import struct
import time
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lattica._identity import KeyPair, PeerId, public_key_from_protobuf
from lattica._protobuf import decode_fields, encode_fields
from lattica.dht import _libp2p_validators as v
from lattica.errors import RecordRejected

NOW = 1_800_000_000.0  # 2027-01-15
LATER = datetime.fromtimestamp(NOW, UTC) + timedelta(hours=24)
KP = KeyPair.from_seed(bytes(range(32)))
OTHER = KeyPair.from_seed(bytes(range(1, 33)))
KEY = v.ipns_key(KP.peer_id)
PATH = b"/ipfs/bafkqaddwgevxmmraojswg33smq"
HOUR_NS = 3600 * 10**9


def _record(kp: KeyPair = KP, value: bytes = PATH, seq: int = 1, eol: datetime = LATER, **kw) -> bytes:
    return v.make_ipns_record(kp, value, seq, eol, HOUR_NS, **kw)


def _signed(data: bytes, kp: KeyPair = KP, extra: list[tuple[int, int | bytes]] | None = None) -> bytes:
    """An IpnsEntry around any ``data``, with a valid signatureV2 over it."""
    return encode_fields([*(extra or []), (8, kp.sign(b"ipns-signature:" + data)), (9, data)])


def _data(**fields: int | bytes) -> bytes:
    doc: dict[str, int | bytes] = {
        "Value": PATH,
        "Validity": b"2027-01-16T00:00:00Z",
        "ValidityType": 0,
        "Sequence": 1,
        "TTL": HOUR_NS,
    }
    doc.update(fields)
    return v._cbor_encode_map(doc)


def _rejected(validator: v.Validator, key: bytes, value: bytes, match: str, now: float = NOW) -> None:
    with pytest.raises(RecordRejected, match=match):
        validator.validate(key, value, now)


# -- the IPNS spec's test vectors ---------------------------------------------------------------
# Records published with the IPNS record spec (ipfs/specs, src/ipns/ipns-record.md, "Test
# Vectors"), taken from ipfs/gateway-conformance fixtures/ipns_records/ (the RSA one from
# fixtures/subdomain_gateway/), all valid until 2123. Each is (the IPNS name its file is named
# after, the record's bytes).

# k51qzi5uqu5dm4tm0wt8srkg9h9suud4wuiwjimndrkydqm81cqtlb5ak6p7ku_v1.ipns-record
V1_ONLY = (
    "k51qzi5uqu5dm4tm0wt8srkg9h9suud4wuiwjimndrkydqm81cqtlb5ak6p7ku",
    bytes.fromhex(
        "0a242f697066732f6261666b7161647477676577773633746d70657168657a6c646e357a67691240479d7b28e45d004ab234a904"
        "7c81e1660f540d3cfd71e2174a2d33daa12ed8ac262c8c7c6ba089f3a4751fd3b06b7be7cb3a5418147ab4ee976aae06cceb5807"
        "1800221b323132332d30382d31345431323a31373a30332e3639343035325a28003080a0f1c2b134"
    ),
)
# k51qzi5uqu5dlkw8pxuw9qmqayfdeh4kfebhmreauqdc6a7c3y7d5i9fi8mk9w_v1-v2.ipns-record
V1_V2 = (
    "k51qzi5uqu5dlkw8pxuw9qmqayfdeh4kfebhmreauqdc6a7c3y7d5i9fi8mk9w",
    bytes.fromhex(
        "0a212f697066732f6261666b7161646477676576786d6d72616f6a7377673333736d711240a541216e40968b8cc13903938db673"
        "2e55ef6802cee665d645de06c454aaefcf0654750bc84e9b41250b35e4d41da539c5a5427fc30e08dc94a4bdca8003f80e180022"
        "1b323132332d30382d31345431323a31373a30332e3639343035325a28003080a0f1c2b13442404a51b86443894bebd3214602ec"
        "2c36270e4cd0508a666dfa355660c4fa8ba290ae7de44d76ab52c4739f397e7141974e6a41a039801260cfd3c05b006a4a250d4a"
        "75a56354544c1b000001a3185c50006556616c756558212f697066732f6261666b7161646477676576786d6d72616f6a73776733"
        "33736d716853657175656e6365006856616c6964697479581b323132332d30382d31345431323a31373a30332e3639343035325a"
        "6c56616c69646974795479706500"
    ),
)
# k51qzi5uqu5dlmit2tuwdvnx4sbnyqgmvbxftl0eo3f33wwtb9gr7yozae9kpw_v1-v2-broken-v1-value.ipns-record
V1_V2_BROKEN_V1_VALUE = (
    "k51qzi5uqu5dlmit2tuwdvnx4sbnyqgmvbxftl0eo3f33wwtb9gr7yozae9kpw",
    bytes.fromhex(
        "0a362f697066732f6261666b7161676c756d767a7869326c6f6d34716765796c65656275786133747465627a676b7933706f6a73"
        "6867637112404e6d6b3def154edc4dff610c0380a64332583738c359d27eb0b8a884e993db089da6076f310f899524701da859a3"
        "4de4abf29576159b1242daf714432179660e1800221b323132332d30382d31345431323a31373a30332e3639343035325a280030"
        "80a0f1c2b13442404a9ecbb57f6640eeff81497cb1ad50d89f47e7e516025663bef604602f86b6e9bf3c2af8d43a4aba65ac1a1b"
        "26d60dc2f85163055e47f206d656067b7d1bb7044a9201a56354544c1b000001a3185c50006556616c7565583e2f697066732f62"
        "61666b7161687477676576786d6d72616f6a7377673333736d7171686f326c756e617167653474706e6e7377346964776d667768"
        "6b7a696853657175656e6365006856616c6964697479581b323132332d30382d31345431323a31373a30332e3639343035325a6c"
        "56616c69646974795479706500"
    ),
)
# k51qzi5uqu5diamp7qnnvs1p1gzmku3eijkeijs3418j23j077zrkok63xdm8c_v1-v2-broken-signature-v2.ipns-record
V1_V2_BROKEN_SIGNATURE_V2 = (
    "k51qzi5uqu5diamp7qnnvs1p1gzmku3eijkeijs3418j23j077zrkok63xdm8c",
    bytes.fromhex(
        "0a3e2f697066732f6261666b7161687477676576786d6d72616f357578693262616d6a7a67363233666e79716867326c686e7a71"
        "7869356c736d7571686d6d7112408de2f89edb7429df57e417cc6fef99edb119f8bf23ed63896a3f90422a33385b98800ab3a82f"
        "70da704adaf6ea1e701f1fe34ff50fc895ea3a6475e21c419e011800221b323132332d30382d31345431323a31373a30332e3639"
        "343035325a28003080a0f1c2b134420d696e76616c69642073747566664a9201a56354544c1b000001a3185c50006556616c7565"
        "583e2f697066732f6261666b7161687477676576786d6d72616f357578693262616d6a7a67363233666e79716867326c686e7a71"
        "7869356c736d7571686d6d716853657175656e6365006856616c6964697479581b323132332d30382d31345431323a31373a3033"
        "2e3639343035325a6c56616c69646974795479706500"
    ),
)
# k51qzi5uqu5dilgf7gorsh9vcqqq4myo6jd4zmqkuy9pxyxi5fua3uf7axph4y_v1-v2-broken-signature-v1.ipns-record
V1_V2_BROKEN_SIGNATURE_V1 = (
    "k51qzi5uqu5dilgf7gorsh9vcqqq4myo6jd4zmqkuy9pxyxi5fua3uf7axph4y",
    bytes.fromhex(
        "0a3e2f697066732f6261666b7161687477676576786d6d72616f357578693262616d6a7a67363233666e79716867326c686e7a71"
        "7869356c736d7571686d6d69120d696e76616c69642073747566661800221b323132332d30382d31345431323a31373a30332e36"
        "39343035325a28003080a0f1c2b134424032c58e6aae6e968e70d89f31a1a0b14e18e1323d9ed61ac89b5d944761780e77b48b6b"
        "09ab3eb1b4f614606b55537b58a5ac67432832d564998d847d071cb5074a9201a56354544c1b000001a3185c50006556616c7565"
        "583e2f697066732f6261666b7161687477676576786d6d72616f357578693262616d6a7a67363233666e79716867326c686e7a71"
        "7869356c736d7571686d6d696853657175656e6365006856616c6964697479581b323132332d30382d31345431323a31373a3033"
        "2e3639343035325a6c56616c69646974795479706500"
    ),
)
# k51qzi5uqu5dit2ku9mutlfgwyz8u730on38kd10m97m36bjt66my99hb6103f_v2.ipns-record
V2_ONLY = (
    "k51qzi5uqu5dit2ku9mutlfgwyz8u730on38kd10m97m36bjt66my99hb6103f",
    bytes.fromhex(
        "42406a7698585e2b170709d4947e148b18b120d76db43515edacf290df96b71e29c0ca5a16510256814f8255532ec4549ade26f4"
        "ca8335f4c41e2cfffeb1ba0aa5014a78a56354544c1b000001a3185c50006556616c756558242f697066732f6261666b71616474"
        "77676977773633746d70657168657a6c646e357a67696853657175656e6365006856616c6964697479581b323132332d30382d31"
        "345431323a31373a30332e3639343035325a6c56616c69646974795479706500"
    ),
)
# QmVujd5Vb7moysJj8itnGufN7MEtPRCNHkKpNuA4onsRa3.ipns-record
RSA = (
    "QmVujd5Vb7moysJj8itnGufN7MEtPRCNHkKpNuA4onsRa3",
    bytes.fromhex(
        "0a412f697066732f6261666b7265696379736732336b69777633346567326437717765697078776f73646f327079346c64763432"
        "6e62617567756c75656e357636616d1280022ffc7a2274967b82db999c294242561cc6a07e4ece8a689e8ec9dd7e5692f7b1929b"
        "2e7d4ae41ecd22c8e744910175706f7dd061dd86096efe480b939392b67707f2ebbc43fe1606d7a989a0070476e327278ec0f14b"
        "4b06ad41c1dbfc8d3d4e6c970fac07162a1a3bf7c3254c2568d033f08859b971cdc0441a27801c9299b04f5da2dd9f6e384a0acc"
        "39c9f78aadfe7475e81a612a69db25342372d999a4cb092925f1079e23ff18447749300703bb7bbcae1f116ea3ee3280c1563ff6"
        "422b015ee0d073a2535aa5e90fdd723852506c14b7ae1318ddbfde6dff0089197aa82d0d202a808913cd051975432cab6cc4053f"
        "4d9e5ebfb688cb7684c81edd606a1800221b323132332d30342d31325431333a34333a35372e3233383033385a28003080808ca3"
        "80e0e0e52b3aab02080012a60230820122300d06092a864886f70d01010105000382010f003082010a0282010100d99aa28a08ad"
        "332cad7ec549a36488a79a2eb341cca8e2f10e9ac920fd7df28ce9db07fde9eb1ea5a0ca10fe3f218b06e2d0ee976c375020398a"
        "c3cbcc35c88567cb9861634d8c6fc6b66bcc24ef2329af218375437135ee4e99aaccc76cfad5a6d59f09b7b8a7065ace14efe8f1"
        "526f29a2652b7ea773c74913d998bd6df633e7732439fc2eae3c54b6550d5276587a2179ddd629479bfc4a91557aa5b0570d4c26"
        "6345bd011a65aa27d492ffd788d1f68e01e87db55ee15c2e0f70fa01e37b3b319725e4e73a3b8d071ef287dc02f2f392e5b281f6"
        "cc5cddc348df05d40063ab199289c8790ea4cd95f2cddaef2f4d1581d6b93a9f838bca859582a33898bf02030100014280027b6c"
        "f2b10b5d6a1d86f9393312fc494690ca6c78ff4a91d745eedf403f2b9dab4402f4b1087cfeae4f1b2c011f52f037298c9f8287e5"
        "3879302bdb9b44256bc55917dba9cb732f96af8d8cb8d121b7242e3ea06c0cd403fe39bee32309bd804a974086a5556950b8e738"
        "065e9a67e29fad9b06ca1ddaa816147a60712d88e6551369daf3092e61383cc61fb991bd2684f44a8153dc62163f0e98dea3f520"
        "cc933f9f7b2b3642245592993a6140f9846b6846d694bd9eda14dcef8556ea74c45f00a1c72c18da5524305c63433feaf4160a9b"
        "9f6ede19dba1e967d82f03bce399fa1c07b1a1349a3f7984e70bf59e12df5f8285f23eb9ea172895d5f2e202103a4a9501a56354"
        "544c1b2bcb8300046300006556616c756558412f697066732f6261666b7265696379736732336b69777633346567326437717765"
        "697078776f73646f327079346c647634326e62617567756c75656e357636616d6853657175656e6365006856616c696469747958"
        "1b323132332d30342d31325431333a34333a35372e3233383033385a6c56616c69646974795479706500"
    ),
)


def _key(name: str) -> bytes:
    """The DHT key of an IPNS name: a base36 CIDv1 (libp2p-key) or a base58 PeerId."""
    if name.startswith("k"):
        number = int(name[1:], 36)
        cid = number.to_bytes((number.bit_length() + 7) // 8, "big")
        assert cid[:2] == b"\x01\x72"  # (CIDv1, libp2p-key)
        return v.ipns_key(PeerId.from_bytes(cid[2:]))
    return v.ipns_key(PeerId.from_string(name))


@pytest.mark.parametrize(
    "vector, verdict",
    [
        (V1_ONLY, "no signatureV2"),
        (V1_V2, None),
        (V1_V2_BROKEN_V1_VALUE, "value does not match"),
        (V1_V2_BROKEN_SIGNATURE_V2, "signatureV2 is not valid"),
        (V1_V2_BROKEN_SIGNATURE_V1, None),
        (V2_ONLY, None),
        (RSA, None),
    ],
)
def test_the_spec_vectors_get_the_spec_verdicts(vector, verdict):
    name, raw = vector
    key = _key(name)
    validators = v.ipfs_validators()
    if verdict is None:
        validators.validate(key, raw, time.time())
    else:
        _rejected(validators, key, raw, verdict, now=time.time())


def test_the_spec_vectors_values_read_as_published():
    assert v.decode_ipns_record(V1_V2[1]).value == b"/ipfs/bafkqaddwgevxmmraojswg33smq"
    broken_v1 = v.decode_ipns_record(V1_V2_BROKEN_SIGNATURE_V1[1])
    assert broken_v1.value == b"/ipfs/bafkqahtwgevxmmrao5uxi2bamjzg623fnyqhg2lhnzqxi5lsmuqhmmi"
    record = v.decode_ipns_record(V2_ONLY[1])
    assert record.value == b"/ipfs/bafkqadtwgiww63tmpeqhezldn5zgi"
    assert record.validity == b"2123-08-14T12:17:03.694052Z" and record.ttl_ns == 1_800_000_000_000
    assert record.eol_ns == int(datetime(2123, 8, 14, 12, 17, 3, tzinfo=UTC).timestamp()) * 10**9 + 694_052_000


def test_a_published_record_expires_at_its_eol():
    name, raw = V2_ONLY
    eol = datetime(2123, 8, 14, 12, 17, 3, 694052, tzinfo=UTC).timestamp()
    _rejected(v.IpnsValidator(), _key(name), raw, "expired", now=eol + 1)


def test_our_cbor_writer_writes_the_bytes_boxo_signed():
    record = v.decode_ipns_record(V1_V2[1])
    fields = {"TTL": record.ttl_ns, "Value": record.value, "Sequence": record.sequence}
    fields |= {"Validity": record.validity, "ValidityType": 0}
    assert v._cbor_encode_map(fields) == record.data


def test_an_rsa_name_needs_its_key_in_the_record_or_known():
    name, raw = RSA
    key = _key(name)
    entry = decode_fields(raw)
    public_key = public_key_from_protobuf(entry.pop(7))
    stripped = encode_fields(sorted(entry.items()))
    _rejected(v.IpnsValidator(), key, stripped, "carries none")
    v.IpnsValidator(lambda peer: public_key if v.ipns_key(peer) == key else None).validate(key, stripped, time.time())
    _rejected(v.IpnsValidator(lambda peer: KP.public_key), key, stripped, "not the one its name")


def test_an_rsa_key_is_a_valid_pk_record_under_its_sha256_id():
    name, raw = RSA
    pb = decode_fields(raw)[7]
    peer = PeerId.from_string(name).to_bytes()
    assert isinstance(pb, bytes) and peer[:2] == b"\x12\x20"  # (sha2-256: RSA keys are too long to inline)
    v.PublicKeyValidator().validate(b"/pk/" + peer, pb, NOW)
    _rejected(v.PublicKeyValidator(), KEY.replace(b"/ipns/", b"/pk/"), pb, "does not match")


# -- what we write --------------------------------------------------------------------------------


@pytest.mark.parametrize("v1", [True, False])
def test_our_records_validate_and_read_back(v1):
    raw = _record(seq=7, v1_compatible=v1)
    v.IpnsValidator().validate(KEY, raw, NOW)
    record = v.decode_ipns_record(raw)
    assert (record.value, record.sequence, record.ttl_ns, record.pub_key) == (PATH, 7, HOUR_NS, b"")
    assert record.eol_ns == int(LATER.timestamp()) * 10**9
    entry = decode_fields(raw)
    assert (1 in entry and 2 in entry and 6 in entry) is v1 and 7 not in entry


def test_our_v1_signature_is_over_value_validity_and_the_enum_name():
    entry = decode_fields(_record())
    signed = entry[1] + entry[4] + b"EOL"  # (as Go formats the enum: the spec vectors sign the same)
    assert KP.sign(signed) == entry[2]


def test_the_eol_is_written_as_go_writes_it():
    when = datetime(2030, 5, 6, 7, 8, 9, 120000, tzinfo=timezone(timedelta(hours=2)))
    assert v._format_rfc3339(when) == b"2030-05-06T05:08:09.12Z"
    assert v._format_rfc3339(when.replace(microsecond=0)) == b"2030-05-06T05:08:09Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        v._format_rfc3339(datetime(2030, 1, 1))


def test_the_writer_refuses_what_no_reader_accepts():
    with pytest.raises(ValueError, match="sequence"):
        _record(seq=2**63)
    with pytest.raises(ValueError, match="sequence"):
        v.make_ipns_record(KP, PATH, 1, LATER, -1)
    with pytest.raises(ValueError, match="at most 10240"):
        _record(value=b"/ipfs/" + b"x" * 6000)


def test_our_pk_record_validates():
    key, value = v.make_pk_record(KP)
    assert key == b"/pk/" + KP.peer_id.to_bytes()
    v.PublicKeyValidator().validate(key, value, NOW)
    v.ipfs_validators().validate(key, value, NOW)


# -- /pk/ rejections ------------------------------------------------------------------------------


def test_a_pk_record_of_another_key_or_no_key_is_rejected():
    key, _ = v.make_pk_record(KP)
    pk = v.PublicKeyValidator()
    _rejected(pk, key, OTHER.public_key_protobuf(), "does not match")
    _rejected(pk, key, b"\x08\x01\x12\x03abc", "unreadable public key")
    _rejected(pk, key, b"\xff", "unreadable public key")
    _rejected(pk, key + b"x", KP.public_key_protobuf(), "does not match")
    _rejected(pk, b"/ipns/" + KP.peer_id.to_bytes(), KP.public_key_protobuf(), "must start with /pk/")


def test_a_pk_record_of_an_unknown_algorithm_is_rejected():
    spki = bytes.fromhex("300a" + "3005" + "06032a0304" + "0301" + "00")  # (algorithm 1.2.3.4)
    _rejected(v.PublicKeyValidator(), b"/pk/x", encode_fields([(1, 0), (2, spki)]), "unreadable public key")


# -- /ipns/ rejections ----------------------------------------------------------------------------


def test_a_record_signed_by_another_key_is_rejected():
    _rejected(v.IpnsValidator(), KEY, _record(kp=OTHER), "signatureV2 is not valid")
    _rejected(v.IpnsValidator(), v.ipns_key(OTHER.peer_id), _record(), "signatureV2 is not valid")


def test_a_record_whose_pubkey_is_not_the_names_is_rejected():
    raw = _record(kp=OTHER) + encode_fields([(7, OTHER.public_key_protobuf())])
    _rejected(v.IpnsValidator(), KEY, raw, "not the one its name")
    raw = _record() + encode_fields([(7, b"\x08\x09\x12\x00")])
    _rejected(v.IpnsValidator(), KEY, raw, "unreadable public key")
    v.IpnsValidator().validate(KEY, _record() + encode_fields([(7, KP.public_key_protobuf())]), NOW)


def test_a_tampered_record_is_rejected():
    entry = decode_fields(_record(v1_compatible=False))
    signature = bytearray(entry[8])
    signature[0] ^= 1
    _rejected(v.IpnsValidator(), KEY, encode_fields([(8, bytes(signature)), (9, entry[9])]), "signatureV2")
    data = entry[9].replace(b"\x01", b"\x02", 1)  # (Sequence 1 -> 2, the old signature kept)
    _rejected(v.IpnsValidator(), KEY, encode_fields([(8, entry[8]), (9, data)]), "signatureV2")


def test_an_expired_record_is_rejected():
    raw = _record(eol=LATER)
    _rejected(v.IpnsValidator(), KEY, raw, "expired at", now=LATER.timestamp())
    v.IpnsValidator().validate(KEY, raw, LATER.timestamp() - 0.001)


def test_an_oversized_record_is_rejected():
    raw = _signed(_data(_pad=b"x" * 10_200))
    assert len(raw) > 10 * 1024
    _rejected(v.IpnsValidator(), KEY, raw, "at most 10240")
    v.IpnsValidator().validate(KEY, _signed(_data(_pad=b"x" * 10_000)), NOW)


def test_records_missing_a_part_are_rejected():
    entry = decode_fields(_record())
    _rejected(v.IpnsValidator(), KEY, encode_fields([(9, entry[9])]), "no signatureV2")
    _rejected(v.IpnsValidator(), KEY, encode_fields([(8, entry[8])]), "no data")
    _rejected(v.IpnsValidator(), KEY, encode_fields([(8, 5), (9, entry[9])]), "field 8 must be bytes")
    _rejected(v.IpnsValidator(), KEY, encode_fields([(5, b"1"), (8, entry[8]), (9, entry[9])]), "field 5")
    _rejected(v.IpnsValidator(), KEY, b"\x0d\x00\x00\x00\x00", "malformed IPNS record")


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"\xa5", "truncated"),
        (b"\x80", "not a map"),
        (_data() + b"\x00", "after the document"),
        (b"\xbf\xff", "indefinite"),
        (b"\xa1\x65Value\x5f\x41a\xff", "indefinite"),
        (b"\xa1\x01\x00", "map key must be a text string"),
        (b"\xa2\x61a\x00\x61a\x01", "repeated"),
        (b"\xa1\x61a\xc1\x00", "tag 1"),
        (b"\xa1\x61a\xd8\x2a\x42\x01\x02", "starting with 0x00"),
        (b"\xa1\x61a\xf0", "simple value"),
        (b"\xa1\x61a\x1c", "reserved"),
        (b"\xa1\x61a\x63\xff\xfe\xfd", "utf-8"),
        (b"\xa1\x61a\x5a\xff\xff\xff\xff", "truncated"),
        (b"\xa1\x61a" + b"\x81" * 20 + b"\x00", "nested deeper"),
    ],
)
def test_malformed_cbor_is_rejected(data, reason):
    _rejected(v.IpnsValidator(), KEY, _signed(data), f"not a DAG-CBOR map.*{reason}")


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({"Value": "a text string"}, r"data\[Value\] must be a byte string"),
        ({"Validity": 5}, r"data\[Validity\] must be a byte string"),
        ({"Sequence": b"1"}, r"data\[Sequence\] must be an integer"),
        ({"TTL": -1}, r"data\[TTL\] must be an integer"),
        ({"Sequence": 2**63}, r"data\[Sequence\] must be an integer from 0 to 2\*\*63-1"),
        ({"ValidityType": 1}, "validity type 1 is not EOL"),
        ({"Validity": b"2027-01-16 00:00:00Z"}, "not an RFC 3339 timestamp"),
        ({"Validity": b"2027-02-30T00:00:00Z"}, "day is out of range"),
    ],
)
def test_signed_fields_of_the_wrong_kind_are_rejected(fields, reason):
    doc = {"Value": PATH, "Validity": b"2027-01-16T00:00:00Z", "ValidityType": 0, "Sequence": 1, "TTL": 1}
    doc.update(fields)
    _rejected(v.IpnsValidator(), KEY, _signed(_encode_any(doc)), reason)


def test_a_missing_signed_field_is_rejected():
    doc = {"Value": PATH, "Validity": b"2027-01-16T00:00:00Z", "ValidityType": 0, "Sequence": 1}
    _rejected(v.IpnsValidator(), KEY, _signed(v._cbor_encode_map(doc)), r"data\[TTL\]")


@pytest.mark.parametrize(
    "number, bad, name",
    [(1, b"/ipfs/other", "value"), (4, b"2099-01-01T00:00:00Z", "validity"), (3, 1, "validityType")]
    + [(5, 2, "sequence"), (6, 1, "ttl")],
)
def test_v1_copies_that_differ_from_the_signed_data_are_rejected(number, bad, name):
    entry = decode_fields(_record(seq=1))
    entry[number] = bad
    _rejected(v.IpnsValidator(), KEY, encode_fields(sorted(entry.items())), f"{name} does not match")


def test_v1_copies_bind_only_with_a_v1_signature_or_value():
    data = _data()
    _rejected(v.IpnsValidator(), KEY, _signed(data, extra=[(2, b"sig")]), "value does not match")
    _rejected(v.IpnsValidator(), KEY, _signed(data, extra=[(1, PATH)]), "validity does not match")
    v.IpnsValidator().validate(KEY, _signed(data, extra=[(4, b"whatever"), (5, 99)]), NOW)


def test_wrong_keys_are_rejected():
    raw = _record()
    _rejected(v.IpnsValidator(), b"/pk/" + KP.peer_id.to_bytes(), raw, "must start with /ipns/")
    _rejected(v.IpnsValidator(), b"/ipns/" + b"\x99\x01", raw, "must end in a PeerId")
    _rejected(v.IpnsValidator(), b"/ipns/" + b"\x00\x05abcde", raw, "does not inline")


# -- what the reader accepts ----------------------------------------------------------------------


def _encode_any(item: object) -> bytes:
    """CBOR of test values, in the order given (not canonical): what other writers might send."""
    if isinstance(item, bool) or item is None:
        return {False: b"\xf4", True: b"\xf5", None: b"\xf6"}[item]
    if isinstance(item, int):
        return v._cbor_head_bytes(0, item) if item >= 0 else v._cbor_head_bytes(1, -1 - item)
    if isinstance(item, float):
        return b"\xfb" + struct.pack(">d", item)
    if isinstance(item, bytes):
        return v._cbor_head_bytes(2, len(item)) + item
    if isinstance(item, str):
        return v._cbor_head_bytes(3, len(item.encode())) + item.encode()
    if isinstance(item, v.CborLink):
        return b"\xd8\x2a" + _encode_any(b"\0" + item.cid)
    if isinstance(item, list):
        return v._cbor_head_bytes(4, len(item)) + b"".join(_encode_any(i) for i in item)
    assert isinstance(item, dict)
    return v._cbor_head_bytes(5, len(item)) + b"".join(_encode_any(k) + _encode_any(x) for k, x in item.items())


def test_extra_signed_fields_of_every_kind_are_ignored():
    doc = {
        "_meta": {"flag": True, "none": None, "ratio": 0.5, "list": [-3, b"b", "s"], "link": v.CborLink(b"\x01q")},
        "TTL": 5,
        "Value": PATH,  # (keys out of canonical order: go-ipld-prime reads them, and so do we)
        "Sequence": 3,
        "ValidityType": 0,
        "Validity": b"2027-01-16T00:00:00Z",
    }
    raw = _signed(_encode_any(doc))
    v.IpnsValidator().validate(KEY, raw, NOW)
    assert v._cbor_decode_map(_encode_any(doc)) == doc
    assert v.decode_ipns_record(raw).sequence == 3


def test_the_reader_takes_every_float_width_and_long_integer_forms():
    assert v._cbor_decode_map(b"\xa1\x61a\xf9\x3c\x00") == {"a": 1.0}
    assert v._cbor_decode_map(b"\xa1\x61a\xfa\x3f\xc0\x00\x00") == {"a": 1.5}
    assert v._cbor_decode_map(b"\xa1\x61a\x1b" + (7).to_bytes(8, "big")) == {"a": 7}
    assert v._cbor_decode_map(b"\xa1\x61a\xf7") == {"a": None}


@pytest.mark.parametrize(
    "text, expected",
    [
        (b"1970-01-01T00:00:00.000000001Z", 1),
        (b"1970-01-01T01:00:00+01:00", 0),
        (b"1969-12-31T23:00:00-01:00", 0),
        (b"2000-02-29T12:00:00.5Z", 951825600_500_000_000),
        (b"2000-02-29T12:00:00.1234567891234Z", 951825600_123_456_789),
    ],
)
def test_rfc3339_reads_as_go_reads_it(text, expected):
    assert v._parse_rfc3339(text) == expected


@pytest.mark.parametrize(
    "text",
    [b"2000-01-01T00:00:00", b"2000-01-01t00:00:00Z", b"2000-01-01T24:00:00Z", b"2000-01-01T00:00:60Z"]
    + [b"2000-13-01T00:00:00Z", b"0000-01-01T00:00:00Z", b"2000-01-01T00:00:00+24:00", b"2000-01-01T00:00:00.Z"]
    + ["2000-01-01T00:00:0\u0661Z".encode()],
)
def test_rfc3339_refuses_what_go_refuses(text):
    with pytest.raises(ValueError):
        v._parse_rfc3339(text)


# -- selection ------------------------------------------------------------------------------------


def test_the_higher_sequence_wins_then_the_later_eol():
    old, new = _record(seq=1, eol=LATER + timedelta(days=1)), _record(seq=2)
    sooner, later = _record(seq=2, eol=LATER), _record(seq=2, eol=LATER + timedelta(seconds=1))
    ipns = v.IpnsValidator()
    assert ipns.select(KEY, [old, new]) == 1
    assert ipns.select(KEY, [new, old]) == 0
    assert ipns.select(KEY, [later, sooner, old]) == 0
    assert ipns.select(KEY, [sooner, later]) == 1


def test_between_equals_the_larger_bytes_win_then_the_first():
    a = _record(seq=1)  # (starts with field 1, 0x0a)
    b = _record(seq=1, v1_compatible=False)  # (starts with field 8, 0x42: the larger bytes)
    assert v.IpnsValidator().select(KEY, [a, b]) == 1
    assert v.IpnsValidator().select(KEY, [b, a]) == 0
    assert v.IpnsValidator().select(KEY, [a, a, a]) == 0


def test_selecting_needs_readable_values():
    with pytest.raises(RecordRejected):
        v.IpnsValidator().select(KEY, [_record(), b"junk"])
    for validator in (v.IpnsValidator(), v.PublicKeyValidator(), v.OpaqueValidator(), v.ipfs_validators()):
        with pytest.raises(ValueError, match="nothing"):
            validator.select(KEY, [])


def test_pk_and_opaque_selection_take_the_first():
    _, pk = v.make_pk_record(KP)
    assert v.PublicKeyValidator().select(b"/pk/x", [pk, pk]) == 0
    assert v.OpaqueValidator().select(b"k", [b"b", b"a"]) == 0


# -- namespaces and opaque values -----------------------------------------------------------------


def test_the_ipfs_validators_take_pk_and_ipns_only():
    validators = v.ipfs_validators()
    assert isinstance(validators.validator_for(b"/pk/x"), v.PublicKeyValidator)
    assert isinstance(validators.validator_for(KEY), v.IpnsValidator)
    validators.validate(KEY, _record(), NOW)
    assert validators.select(KEY, [_record(seq=1), _record(seq=3)]) == 1
    for key in (b"/other/x", b"/pk", b"//pk/x", b"pk/x", b"", b"/\xff/x"):
        _rejected(validators, key, b"value", "no validator")


def test_a_default_takes_the_other_namespaces():
    validators = v.Validators({"ipns": v.IpnsValidator()}, default=v.OpaqueValidator(max_size=4))
    validators.validate(b"\x00raw sdk key", b"1234", NOW)
    validators.validate(b"/pk/x", b"1234", NOW)
    _rejected(validators, b"/app/x", b"12345", "at most 4")
    _rejected(validators, KEY, b"1234", "malformed IPNS record|no signatureV2")


def test_opaque_values_are_capped():
    opaque = v.OpaqueValidator()
    opaque.validate(b"k", b"x" * v.MAX_OPAQUE_VALUE, NOW)
    _rejected(opaque, b"k", b"x" * (v.MAX_OPAQUE_VALUE + 1), "at most")


# -- fuzz -----------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.sampled_from([KEY, b"/pk/" + KP.peer_id.to_bytes(), b"/x/y"]))
def test_arbitrary_values_raise_only_record_rejected(value, key):
    try:
        v.ipfs_validators().validate(key, value, NOW)
    except RecordRejected:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_signed_data_raises_only_record_rejected(data):
    try:
        v.IpnsValidator().validate(KEY, _signed(data), NOW)
    except RecordRejected:
        pass


def test_mutated_records_raise_only_record_rejected():
    rng = random.Random(49)
    sources = [_record(), _record(v1_compatible=False), RSA[1], _signed(_data())]
    keys = [KEY, KEY, _key(RSA[0]), KEY]
    for _ in range(2000):
        i = rng.randrange(len(sources))
        raw = bytearray(sources[i])
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        try:
            v.IpnsValidator().validate(keys[i], bytes(raw), NOW)
            v.IpnsValidator().select(keys[i], [bytes(raw), sources[i]])
        except RecordRejected:
            pass


def test_arbitrary_keys_raise_only_record_rejected():
    rng = random.Random(7)
    validators = v.ipfs_validators()
    for _ in range(500):
        key = rng.choice([b"/ipns/", b"/pk/", b"/", b""]) + rng.randbytes(rng.randrange(40))
        try:
            validators.validate(key, _record(), NOW)
        except RecordRejected:
            pass
