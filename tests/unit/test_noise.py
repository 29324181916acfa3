"""Noise XX: the published cacophony vectors, and libp2p-style authenticated handshakes."""

import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from lattica._identity import KeyPair
from lattica.errors import DecryptError, HandshakeError, PeerIdMismatch
from lattica.transports.noise import LIBP2P_PROTOCOL_NAME, MAX_PLAINTEXT, NoiseHandshake, PlainBuffer, _HandshakeState

VECTORS = Path(__file__).resolve().parents[3] / "shared" / "vectors" / "noise" / "xx_25519_sha256.json"


def _vectors():
    if not VECTORS.exists():
        return []
    return json.loads(VECTORS.read_text())["vectors"]


@pytest.mark.skipif(
    not VECTORS.exists(), reason=f"shared Noise vectors not present at {VECTORS} (they live outside the repository)"
)
@pytest.mark.parametrize("vec", _vectors(), ids=lambda v: v["protocol_name"])
def test_cacophony_vector(vec):
    key = lambda h: X25519PrivateKey.from_private_bytes(bytes.fromhex(h))
    name = vec["protocol_name"].encode()
    init = _HandshakeState(
        True, key(vec["init_static"]), bytes.fromhex(vec["init_prologue"]), key(vec["init_ephemeral"]), name
    )
    resp = _HandshakeState(
        False, key(vec["resp_static"]), bytes.fromhex(vec["resp_prologue"]), key(vec["resp_ephemeral"]), name
    )
    msgs = vec["messages"]
    for i, m in enumerate(msgs[:3]):
        w, r = (init, resp) if i % 2 == 0 else (resp, init)
        ct = w.write_message(bytes.fromhex(m["payload"]))
        assert ct.hex() == m["ciphertext"], f"handshake message {i}"
        assert r.read_message(ct).hex() == m["payload"]
    assert init.finished and resp.finished
    assert init.h.hex() == resp.h.hex() == vec["handshake_hash"]
    i_send, i_recv = init.split()
    r_send, r_recv = resp.split()
    for i, m in enumerate(msgs[3:], start=3):
        send, recv = (i_send, r_recv) if i % 2 == 0 else (r_send, i_recv)
        ct = send.encrypt(None, bytes.fromhex(m["payload"]))
        assert ct.hex() == m["ciphertext"], f"transport message {i}"
        assert recv.decrypt(None, ct).hex() == m["payload"]


def _run(a: NoiseHandshake, b: NoiseHandshake):
    to_b = a.start()
    while not (a.complete and b.complete):
        to_a = b.receive(to_b) if to_b else b""
        to_b = a.receive(to_a) if to_a and not a.complete else b""
        if not to_a and not to_b:
            break
    return a, b


@pytest.mark.parametrize("step", [1000, 65_000, 200_000])
def test_frames_opened_into_a_shared_buffer_are_the_same_bytes(step):
    """Two connections' sessions open their frames into one shared buffer (as a transport's
    connections do), each read parsed before the next: the plaintext is what each side sealed,
    whatever the reads' sizes, with frames split across them."""
    pairs = [
        _run(NoiseHandshake(KeyPair.generate(), True), NoiseHandshake(KeyPair.generate(), False)) for _ in range(2)
    ]
    data = [os.urandom(3 * MAX_PLAINTEXT + 17), os.urandom(MAX_PLAINTEXT * 5 // 2)]
    sealed = [bytes(a.session.seal(d)) for (a, _), d in zip(pairs, data)]
    plain = PlainBuffer()
    out = [bytearray(), bytearray()]
    pos = [0, 0]
    while pos[0] < len(sealed[0]) or pos[1] < len(sealed[1]):
        for k in (0, 1):
            chunk = sealed[k][pos[k] : pos[k] + step]
            pos[k] += len(chunk)
            for frame in pairs[k][1].session.open_frames(chunk, plain):
                out[k] += frame  # (parsed before the buffer is used again)
    assert bytes(out[0]) == data[0] and bytes(out[1]) == data[1]
    assert plain.buf.nbytes == MAX_PLAINTEXT  # one frame's room, whatever the reads


def test_libp2p_handshake_authenticates_both_sides():
    ka, kb = KeyPair.generate(), KeyPair.generate()
    a, b = _run(NoiseHandshake(ka, True, kb.peer_id), NoiseHandshake(kb, False))
    assert a.complete and b.complete
    assert a.remote_peer == kb.peer_id and b.remote_peer == ka.peer_id
    data = os.urandom(3 * MAX_PLAINTEXT + 17)
    sealed = a.session.seal(data)
    # deliver in awkward pieces: frames split across reads must reassemble
    out = bytearray()
    for i in range(0, len(sealed), 1000):
        got = b.session.open(bytes(sealed[i : i + 1000]))
        if got:
            out += got
    assert bytes(out) == data
    assert bytes(b.session.open(bytes(b.session and a.session.seal(b"")))) == b""


def test_wrong_expected_peer_is_rejected():
    ka, kb, kc = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    a, b = NoiseHandshake(ka, True, kc.peer_id), NoiseHandshake(kb, False)
    m2 = b.receive(a.start())
    with pytest.raises(PeerIdMismatch):
        a.receive(m2)


def test_tampered_and_replayed_frames_fail():
    ka, kb = KeyPair.generate(), KeyPair.generate()
    a, b = _run(NoiseHandshake(ka, True), NoiseHandshake(kb, False))
    f1 = bytes(a.session.seal(b"hello"))
    assert bytes(b.session.open(f1)) == b"hello"
    with pytest.raises(DecryptError):
        b.session.open(f1)  # replay: nonce has moved on
    a2, b2 = _run(NoiseHandshake(ka, True), NoiseHandshake(kb, False))
    f = bytearray(a2.session.seal(b"hello"))
    f[5] ^= 1
    with pytest.raises(DecryptError):
        b2.session.open(bytes(f))


def test_forged_identity_signature_rejected():
    """A responder that signs with a key other than the one it presents must fail."""
    ka, kb, km = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    import lattica.transports.noise as noise

    real = noise._encode_payload

    def forged(keypair, static_pub, early=None, muxers=()):
        good = real(keypair, static_pub)
        other = real(km, static_pub)  # mallory's signature, kb's key
        key_len = good[1]
        return good[: 2 + key_len] + other[2 + other[1] :]

    a, b = NoiseHandshake(ka, True), NoiseHandshake(kb, False)
    noise._encode_payload = forged
    try:
        m2 = b.receive(a.start())
    finally:
        noise._encode_payload = real
    with pytest.raises(HandshakeError, match="signature"):
        a.receive(m2)


@pytest.mark.parametrize("garbage", [b"\x00\x05hello", b"\x00\x20" + bytes(32), b"\x00\xc8" + os.urandom(200)])
def test_garbage_third_message_rejected_by_responder(garbage):
    a, b = NoiseHandshake(KeyPair.generate(), True), NoiseHandshake(KeyPair.generate(), False)
    b.receive(a.start())
    with pytest.raises(HandshakeError):
        b.receive(garbage)
    assert not b.complete


@pytest.mark.parametrize("garbage", [b"\x00\x05hello", b"\x00\x60" + bytes(96), b"\x00\xc8" + os.urandom(200)])
def test_garbage_second_message_rejected_by_initiator(garbage):
    a = NoiseHandshake(KeyPair.generate(), True)
    a.start()
    with pytest.raises(HandshakeError):
        a.receive(garbage)
    assert not a.complete


def test_oversized_handshake_frame_bounded():
    """A first message claiming 65535 bytes is buffered until complete (never more: the buffer is
    capped at one maximum frame), then rejected: message 1 of XX carries no payload."""
    b = NoiseHandshake(KeyPair.generate(), False)
    b.receive(b"\xff\xff")
    for _ in range(63):
        b.receive(os.urandom(1024))
    assert len(b._buf) == 2 + 63 * 1024
    with pytest.raises(HandshakeError, match="must not carry a payload"):
        b.receive(os.urandom(1024))


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from lattica.errors import FrameTooLarge, ProtocolError  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=6), st.booleans())
def test_fuzz_handshake_raises_only_protocol_errors(chunks, initiator):
    hs = NoiseHandshake(KeyPair.generate(), initiator)
    hs.start()
    try:
        for c in chunks:
            hs.receive(c)
    except (HandshakeError, FrameTooLarge):
        return
    assert not hs.complete  # random bytes never complete an authenticated handshake


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_fuzz_session_open_raises_only_decrypt_errors(data):
    a, b = _run(NoiseHandshake(KeyPair.generate(), True), NoiseHandshake(KeyPair.generate(), False))
    try:
        out = b.session.open(data)
    except ProtocolError:
        return
    assert not out  # nothing forged ever decrypts; short input just waits for more


def test_seal_into_a_reused_buffer_matches_a_fresh_one():
    ka, kb = KeyPair.generate(), KeyPair.generate()
    a, b = _run(NoiseHandshake(ka, True, kb.peer_id), NoiseHandshake(kb, False))
    spare = bytearray(4 * MAX_PLAINTEXT)
    pieces = [os.urandom(MAX_PLAINTEXT + 5), b"", os.urandom(MAX_PLAINTEXT - 3), os.urandom(100)]
    sealed = a.session.seal_pieces(pieces, spare)
    assert isinstance(sealed, memoryview) and sealed.obj is spare  # written into the spare buffer
    assert bytes(b.session.open(bytes(sealed))) == b"".join(pieces)
    # the same buffer again (its old contents are overwritten, nothing leaks into the next write)
    sealed = a.session.seal_pieces([b"second"], spare)
    assert sealed.obj is spare and bytes(b.session.open(bytes(sealed))) == b"second"
    # too small for the message: a fresh buffer of exactly the sealed size
    big = os.urandom(8 * MAX_PLAINTEXT)
    sealed = a.session.seal_pieces([big], spare)
    assert type(sealed) is bytearray and sealed is not spare
    assert bytes(b.session.open(bytes(sealed))) == big


@pytest.mark.parametrize("limit", [1, 512, 1430, 9000, MAX_PLAINTEXT])
def test_sealed_frames_hold_at_most_the_limit_and_open_to_the_same_bytes(limit):
    ka, kb = KeyPair.generate(), KeyPair.generate()
    a, b = _run(NoiseHandshake(ka, True, kb.peer_id), NoiseHandshake(kb, False))
    pieces = [os.urandom(n) for n in (100, 0, limit, 3 * limit + 7, 1, MAX_PLAINTEXT + 3)]
    sealed = bytes(a.session.seal_pieces(pieces, None, limit))
    lengths, pos = [], 0
    while pos < len(sealed):  # walk the length prefixes: every frame within the limit
        n = (sealed[pos] << 8) | sealed[pos + 1]
        lengths.append(n - 16)
        pos += 2 + n
    assert pos == len(sealed) and max(lengths) <= limit
    assert len(lengths) == -(-sum(map(len, pieces)) // limit)  # full frames, bar the last
    assert bytes(b.session.open(sealed)) == b"".join(pieces)


@pytest.mark.parametrize("limit", [0, -1, MAX_PLAINTEXT + 1])
def test_a_frame_limit_outside_what_noise_allows_is_refused(limit):
    ka, kb = KeyPair.generate(), KeyPair.generate()
    a, _ = _run(NoiseHandshake(ka, True, kb.peer_id), NoiseHandshake(kb, False))
    with pytest.raises(ValueError, match="frame limit"):
        a.session.seal_pieces([b"x"], None, limit)


# -- early data (the host's identify inside the handshake) ------------------------------------------


def test_early_data_both_ways_when_both_sides_send_it():
    """The responder's rides in message 2, the initiator's in message 3: each side has the
    other's when the handshake ends."""
    a = NoiseHandshake(KeyPair.generate(), True, early_data=lambda: b"from-initiator")
    b = NoiseHandshake(KeyPair.generate(), False, early_data=lambda: b"from-responder")
    m1 = a.start()
    m2 = b.receive(m1)
    assert b"from-responder" not in m2  # encrypted (under the ee and es keys)
    m3 = a.receive(m2)
    assert a.complete and a.remote_early_data == b"from-responder"
    assert b"from-initiator" not in m3
    b.receive(m3)
    assert b.complete and b.remote_early_data == b"from-initiator"


def test_early_data_is_sent_by_the_initiator_only_to_a_responder_that_sent_some():
    """A responder without early data (another implementation, an older Lattica) gets a plain
    libp2p message 3, and neither side claims the other's."""
    a = NoiseHandshake(KeyPair.generate(), True, early_data=lambda: b"from-initiator")
    b = NoiseHandshake(KeyPair.generate(), False)
    m3 = a.receive(b.receive(a.start()))
    assert b"from-initiator" not in m3 and len(m3) < 300  # no payload beyond key and signature
    b.receive(m3)
    assert a.complete and b.complete
    assert a.remote_early_data is None and b.remote_early_data is None


def test_an_initiator_without_early_data_leaves_both_sides_without():
    """The responder's early data reached an initiator that says nothing early: the initiator
    cannot tell the responder it read it, so neither side counts on it (both push identify)."""
    a = NoiseHandshake(KeyPair.generate(), True)
    b = NoiseHandshake(KeyPair.generate(), False, early_data=lambda: b"from-responder")
    _run(a, b)
    assert a.complete and b.complete
    assert a.remote_early_data is None and b.remote_early_data is None


def test_our_early_data_too_large_for_a_handshake_message_is_left_out():
    from lattica.transports.noise import MAX_EARLY_DATA

    a = NoiseHandshake(KeyPair.generate(), True, early_data=lambda: b"a")
    b = NoiseHandshake(KeyPair.generate(), False, early_data=lambda: b"x" * (MAX_EARLY_DATA + 1))
    _run(a, b)
    assert a.complete and b.complete
    assert a.remote_early_data is None and b.remote_early_data is None


def test_a_peers_oversized_early_data_fails_the_handshake():
    """A peer that crafts a payload with more early data than the limit is refused."""
    import lattica.transports.noise as noise

    ka, kb = KeyPair.generate(), KeyPair.generate()
    a = NoiseHandshake(ka, True, early_data=lambda: b"a")
    b = NoiseHandshake(kb, False)
    real = noise._encode_payload
    noise._encode_payload = lambda kp, pub, early=None, muxers=(): real(kp, pub, b"y" * (noise.MAX_EARLY_DATA + 1))
    try:
        m2 = b.receive(a.start())
    finally:
        noise._encode_payload = real
    with pytest.raises(HandshakeError, match="early data"):
        a.receive(m2)


# -- libp2p: the ChaChaPoly suite and inlined muxer negotiation ----------------------------------


def test_the_libp2p_suite_handshakes_with_chachapoly_and_not_with_the_lattica_suite():
    ka, kb = KeyPair.generate(), KeyPair.generate()
    a, b = _run(
        NoiseHandshake(ka, True, protocol_name=LIBP2P_PROTOCOL_NAME),
        NoiseHandshake(kb, False, protocol_name=LIBP2P_PROTOCOL_NAME),
    )
    assert not a._hs.aesgcm and a.remote_peer == kb.peer_id and b.remote_peer == ka.peer_id
    with pytest.raises(HandshakeError):
        _run(NoiseHandshake(ka, True, protocol_name=LIBP2P_PROTOCOL_NAME), NoiseHandshake(kb, False))


@pytest.mark.parametrize(
    "initiator, responder, chosen",
    [
        (["/yamux/1.0.0", "/mplex/6.7.0"], ["/mplex/6.7.0", "/yamux/1.0.0"], "/yamux/1.0.0"),  # the initiator's order
        (["/mplex/6.7.0", "/yamux/1.0.0"], ["/yamux/1.0.0"], "/yamux/1.0.0"),
        (["/yamux/1.0.0"], [], None),  # the responder offers none: multistream-select decides later
        ([], ["/yamux/1.0.0"], None),
    ],
)
def test_the_muxer_is_the_initiators_first_that_both_offer(initiator, responder, chosen):
    ka, kb = KeyPair.generate(), KeyPair.generate()
    a, b = _run(
        NoiseHandshake(ka, True, protocol_name=LIBP2P_PROTOCOL_NAME, muxers=initiator),
        NoiseHandshake(kb, False, protocol_name=LIBP2P_PROTOCOL_NAME, muxers=responder),
    )
    assert a.muxer == b.muxer == chosen
    assert b.remote_muxers == tuple(initiator) and a.remote_muxers == tuple(responder)


def test_no_muxer_in_common_fails_the_handshake():
    a = NoiseHandshake(KeyPair.generate(), True, muxers=["/mplex/6.7.0"])
    b = NoiseHandshake(KeyPair.generate(), False, muxers=["/yamux/1.0.0"])
    with pytest.raises(HandshakeError, match="muxer"):
        _run(a, b)


def test_a_flood_of_offered_muxers_fails_the_handshake():
    from lattica.transports import noise  # (its limit, read where the test needs it)

    flood = [f"/m/{i}" for i in range(noise.MAX_MUXERS)] + ["/yamux/1.0.0"]
    a = NoiseHandshake(KeyPair.generate(), True, muxers=flood)  # it finds yamux in common; the responder refuses
    with pytest.raises(HandshakeError, match="muxers"):
        _run(a, NoiseHandshake(KeyPair.generate(), False, muxers=["/yamux/1.0.0"]))
