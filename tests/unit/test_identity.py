"""Identity: libp2p key-file and PeerId formats, signatures, key file permissions."""

import os
import stat

import pytest

from lattica._identity import KeyPair, PeerId, b58decode, b58encode, verify_signature
from lattica.errors import InvalidPeerId, KeyFileError

# The Ed25519 test vector of the libp2p peer-ids spec; the PeerId is the one go-libp2p's own
# tests derive from it.
SPEC_PRIVATE = bytes.fromhex(
    "080112407e0830617c4a7de83925dfb2694556b12936c477a0e1feb2e148ec9da60fee7d"
    "1ed1e8fae2c4a144b8be8fd4b47bf3d3b34b871c3cacf6010f0e42d474fce27e"
)
SPEC_PUBLIC = bytes.fromhex("080112201ed1e8fae2c4a144b8be8fd4b47bf3d3b34b871c3cacf6010f0e42d474fce27e")
SPEC_PEER_ID = "12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3pq"


def test_libp2p_spec_vector():
    kp = KeyPair.from_protobuf(SPEC_PRIVATE)
    assert kp.public_key_protobuf() == SPEC_PUBLIC
    assert str(kp.peer_id) == SPEC_PEER_ID
    assert kp.to_protobuf() == SPEC_PRIVATE  # we write what go-libp2p writes


def test_seed_only_key_file_is_accepted():
    kp = KeyPair.from_protobuf(SPEC_PRIVATE)
    seed_only = b"\x08\x01\x12\x20" + kp.seed()
    assert KeyPair.from_protobuf(seed_only).peer_id == kp.peer_id


@pytest.mark.parametrize(
    "blob, match",
    [
        (b"", "missing"),
        (b"\x08\x00\x12\x20" + bytes(32), "unsupported key type"),  # RSA
        (b"\x08\x01\x12\x10" + bytes(16), "32 or 64"),
        (b"\x08\x01\x12\x40" + bytes(64), "does not match"),
        (b"\x08\x01\x12\x40" + bytes(10), "truncated"),
        (b"\xff\xff\xff", "malformed"),
    ],
)
def test_bad_key_files(blob, match):
    with pytest.raises(KeyFileError, match=match):
        KeyPair.from_protobuf(blob)


def test_key_file_mode_and_reload(tmp_path):
    path = tmp_path / "node.key"
    kp = KeyPair.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert KeyPair.load_or_create(path).peer_id == kp.peer_id
    assert path.read_bytes() == kp.to_protobuf()


def test_peer_id_round_trips_and_carries_the_key():
    kp = KeyPair.generate()
    pid = PeerId.from_string(str(kp.peer_id))
    assert pid == kp.peer_id and hash(pid) == hash(kp.peer_id)
    assert str(pid).startswith("12D3KooW")
    assert pid.public_key() == kp.public_key
    assert PeerId.from_bytes(pid.to_bytes()) == pid


@pytest.mark.parametrize("text", ["", "0OIl", "12D3KooW", "Qm" + "1" * 10, "z" * 60])
def test_invalid_peer_ids(text):
    with pytest.raises(InvalidPeerId):
        PeerId.from_string(text)


def test_sha256_peer_ids_parse():
    # legacy RSA-style ids are sha2-256 multihashes ("Qm...")
    pid = PeerId.from_string("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N")
    assert pid.public_key() is None


def test_signatures():
    kp = KeyPair.generate()
    sig = kp.sign(b"msg")
    assert verify_signature(kp.public_key, sig, b"msg")
    assert not verify_signature(kp.public_key, sig, b"msh")
    assert not verify_signature(KeyPair.generate().public_key, sig, b"msg")
    assert not verify_signature(b"short", sig, b"msg")


def test_signatures_are_rfc_8032_s_whatever_the_data_s_buffer():
    """Signing goes through libsodium once it is loaded; Ed25519 is deterministic, so every
    signature must be the one OpenSSL gives (RFC 8032's) for bytes, a bytearray, a view of part
    of a buffer and nothing at all."""
    from lattica import _sodium

    unloaded = KeyPair.from_seed(bytes(range(32))).sign(b"msg")  # (OpenSSL's, if nothing checked a signature yet)
    _sodium.verifier()  # (what the first check does: libsodium signs from then on)
    assert _sodium.signer() is not None and KeyPair.from_seed(bytes(range(32))).sign(b"msg") == unloaded
    for seed in (bytes(32), bytes(range(32)), os.urandom(32)):
        kp = KeyPair.from_seed(seed)
        frame = bytearray(os.urandom(70_000))
        for data in (b"", b"msg", bytes(frame), frame, memoryview(frame)[1000:60_000]):
            sig = kp.sign(data)
            assert sig == kp._private.sign(bytes(data)) and len(sig) == 64
            assert verify_signature(kp.public_key, sig, bytes(data))
    # RFC 8032 7.1, test 1: the empty message under this seed
    rfc = KeyPair.from_seed(bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"))
    assert rfc.sign(b"").hex() == (
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
        "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
    )


def test_base58():
    for data in [b"", b"\0", b"\0\0abc", os.urandom(40)]:
        assert b58decode(b58encode(data)) == data
    assert b58encode(b"hello world") == "StV1DL6CwTryKyV"


def test_key_file_errors_are_key_file_errors(tmp_path):
    with pytest.raises(KeyFileError, match="cannot write"):
        KeyPair.load_or_create(tmp_path / "missing-dir" / "node.key")
    assert not (tmp_path / "missing-dir").exists()
    with pytest.raises(KeyFileError, match="cannot read"):
        KeyPair.load(tmp_path / "absent.key")


def test_signatures_are_checked_by_libsodium_and_agree_with_openssl_on_honest_ones():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    for n in range(40):
        kp = KeyPair.generate()
        data = bytes(range(n % 7)) * n
        sig = kp.sign(data)
        assert verify_signature(kp.public_key, sig, data)
        assert verify_signature(kp.public_key, sig, memoryview(bytearray(data)))  # any buffer
        assert verify_signature(bytearray(kp.public_key), memoryview(sig), bytearray(data))
        bad = bytearray(sig)
        bad[n % 64] ^= 1 << (n % 8)
        assert not verify_signature(kp.public_key, bytes(bad), data)
        assert not verify_signature(kp.public_key, sig, data + b"x")
        assert not verify_signature(kp.public_key, sig[:63], data)  # the signature is split off at byte 64
        assert not verify_signature(kp.public_key, sig + b"\0", data)
        assert not verify_signature(kp.public_key[:31], sig, data)  # the C code reads 32 key bytes
        Ed25519PublicKey.from_public_bytes(kp.public_key).verify(sig, data)  # OpenSSL agrees (raises if not)


def test_anything_malformed_is_no_valid_signature():
    np = pytest.importorskip("numpy")
    kp = KeyPair.generate()
    data = b"m" * 100
    sig = kp.sign(data)
    # lengths are counted in bytes, whatever the buffer's items are
    as_shorts = memoryview(sig + data[:64]).cast("H")  # 64 items, 128 bytes
    assert not verify_signature(kp.public_key, as_shorts, data[64:])
    assert not verify_signature(kp.public_key, np.zeros((64, 0)), sig + data)  # 64 rows of nothing
    assert not verify_signature(np.zeros((32, 0)), sig, data)  # 32 rows of nothing: no key
    for junk in (64, None, "x" * 64, [0] * 64, object()):
        assert not verify_signature(kp.public_key, junk, data)
        assert not verify_signature(junk, sig, data)
        assert not verify_signature(kp.public_key, sig, junk) or junk == 64
    strided = memoryview(bytearray(data * 2))[::2]  # not contiguous
    assert not verify_signature(kp.public_key, sig, strided)


_SMALL_ORDER_FORGERY = """
import sys, threading
{prelude}
from lattica._identity import verify_signature
identity_point = bytes([1]) + bytes(31)
forged = identity_point + bytes(32)
sys.setswitchinterval(1e-6)
results = []
go = threading.Barrier(16)
def check():
    go.wait()
    results.append(verify_signature(identity_point, forged, b"anything"))
threads = [threading.Thread(target=check) for _ in range(16)]
[t.start() for t in threads]
[t.join() for t in threads]
print(sum(results), len(results))
"""


@pytest.mark.parametrize(
    "prelude",
    ["", "import nacl.bindings; sys.modules['nacl._sodium'] = None  # a layout we do not know: the public bindings"],
    ids=["compiled module", "public bindings"],
)
def test_a_small_order_key_signs_nothing_even_while_the_verifier_loads(prelude):
    # The identity point as a public key, R = identity and S = 0, "verify" any message under
    # OpenSSL's cofactorless check ([S]B = R + [k]A holds for every k): anyone could speak as
    # that PeerId. libsodium refuses small-order keys, also to the threads that ask while it is
    # first loaded, and also through PyNaCl's public bindings.
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _SMALL_ORDER_FORGERY.format(prelude=prelude)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "16"]
