"""Noise XX secure channel (sans-IO), with libp2p's signed identity payload.

Three layers, each a plain object with no I/O:

* ``_HandshakeState`` is the Noise framework's XX pattern (X25519, SHA-256, AES-256-GCM or
  ChaChaPoly), checked against the published cacophony vectors.
* ``NoiseHandshake`` runs it the libp2p way: 2-byte length-prefixed messages, and a payload in the
  2nd and 3rd message carrying the Ed25519 identity key and its signature over the Noise static key,
  so the channel is authenticated to a PeerId. The payload may also carry early data (the host's
  identify): the responder's in the 2nd message, the initiator's in the 3rd only if the 2nd had
  some, so a connection is identified when the handshake ends, a round trip sooner.
* ``NoiseSession`` seals and opens transport frames after the handshake.

AES-256-GCM is the default: measured on this machine at 14.6 GB/s per 64 KiB frame against 3.3 GB/s
for ChaCha20-Poly1305 (see docs/benchmarks.md).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import overload

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from lattica._digest import hmac_sha256, sha256
from lattica._identity import KeyPair, PeerId, public_key_from_protobuf, verify_signature
from lattica._protobuf import decode_fields, decode_repeated, encode_fields
from lattica.errors import DecryptError, FrameTooLarge, HandshakeError, PeerIdMismatch

__all__ = [
    "NoiseHandshake",
    "NoiseSession",
    "PlainBuffer",
    "MAX_FRAME",
    "MAX_PLAINTEXT",
    "PROTOCOL_NAME",
    "LIBP2P_PROTOCOL_NAME",
]

PROTOCOL_NAME = b"Noise_XX_25519_AESGCM_SHA256"  # between Lattica nodes
LIBP2P_PROTOCOL_NAME = b"Noise_XX_25519_ChaChaPoly_SHA256"  # what ``/noise`` means to every libp2p peer
MAX_FRAME = 65535  # Noise's maximum message length (ciphertext + 16-byte tag)
MAX_PLAINTEXT = MAX_FRAME - 16
_TAG = 16
_DH_LEN = 32
_HASH_LEN = 32
_SIG_PREFIX = b"noise-libp2p-static-key:"
_MAX_NONCE = 2**64 - 1


def _x25519_new() -> X25519PrivateKey:
    """A fresh X25519 key: 32 random bytes from the OS (RFC 7748; the scalar is clamped when used)."""
    return X25519PrivateKey.from_private_bytes(os.urandom(32))


def _x25519_pub(priv: X25519PrivateKey) -> bytes:
    return priv.public_key().public_bytes_raw()


def _dh(priv: X25519PrivateKey, pub: bytes) -> bytes:
    try:
        return priv.exchange(X25519PublicKey.from_public_bytes(pub))
    except ValueError as e:  # all-zero shared secret (low-order point) or bad length
        raise HandshakeError(f"invalid X25519 public key from peer: {e}") from None


def _hkdf2(ck: bytes, ikm: bytes) -> tuple[bytes, bytes]:
    temp = hmac_sha256(ck, ikm)
    out1 = hmac_sha256(temp, b"\x01")
    out2 = hmac_sha256(temp, out1 + b"\x02")
    return out1, out2


class Cipher:
    """One direction of a Noise CipherState: a key and a counting nonce."""

    __slots__ = ("_aead", "_nonce", "_n", "aesgcm")

    def __init__(self, key: bytes, aesgcm: bool = True) -> None:
        self.aesgcm = aesgcm
        self._aead = AESGCM(key) if aesgcm else ChaCha20Poly1305(key)
        # AESGCM nonces are 4 zero bytes + big-endian counter; ChaChaPoly's are little-endian.
        self._nonce = struct.Struct(">4xQ" if aesgcm else "<4xQ")
        self._n = 0

    def _next_nonce(self) -> bytes:
        n = self._n
        if n >= _MAX_NONCE:
            raise DecryptError("Noise nonce space exhausted; the connection must be re-established")
        self._n = n + 1
        return self._nonce.pack(n)

    def encrypt(self, ad: bytes | None, plaintext: bytes) -> bytes:
        return self._aead.encrypt(self._next_nonce(), plaintext, ad)

    def decrypt(self, ad: bytes | None, ciphertext: bytes | memoryview) -> bytes:
        try:
            return self._aead.decrypt(self._next_nonce(), ciphertext, ad)
        except InvalidTag:
            raise DecryptError("frame failed authentication (tampered, replayed or reordered)") from None

    def encrypt_into(self, plaintext: bytes | memoryview, out: memoryview) -> None:
        self._aead.encrypt_into(self._next_nonce(), plaintext, None, out)

    def decrypt_into(self, ciphertext: memoryview, out: memoryview) -> None:
        try:
            self._aead.decrypt_into(self._next_nonce(), ciphertext, None, out)
        except InvalidTag:
            raise DecryptError("frame failed authentication (tampered, replayed or reordered)") from None


class _HandshakeState:
    """The Noise XX handshake (framework rev. 34 §5), no framing and no payload semantics."""

    _PATTERN = ((b"e",), (b"e", b"ee", b"s", b"es"), (b"s", b"se"))

    def __init__(
        self,
        initiator: bool,
        static: X25519PrivateKey,
        prologue: bytes = b"",
        ephemeral: X25519PrivateKey | None = None,
        protocol_name: bytes = PROTOCOL_NAME,
    ) -> None:
        self.initiator = initiator
        self.aesgcm = b"AESGCM" in protocol_name
        self.h = protocol_name.ljust(_HASH_LEN, b"\0") if len(protocol_name) <= _HASH_LEN else sha256(protocol_name)
        self.ck = self.h
        self._k: Cipher | None = None
        self._mix_hash(prologue)
        self.s = static
        self.s_pub = _x25519_pub(static)
        self.e = ephemeral  # None -> generated when needed (fixed only for test vectors)
        self.e_pub = b""
        self.rs: bytes | None = None
        self.re: bytes | None = None
        self._step = 0

    @property
    def finished(self) -> bool:
        return self._step == len(self._PATTERN)

    def _mix_hash(self, data: bytes) -> None:
        self.h = sha256(self.h + data)

    def _mix_key(self, ikm: bytes) -> None:
        self.ck, temp_k = _hkdf2(self.ck, ikm)
        self._k = Cipher(temp_k, self.aesgcm)

    def _encrypt_and_hash(self, plaintext: bytes) -> bytes:
        ct = plaintext if self._k is None else self._k.encrypt(self.h, plaintext)
        self._mix_hash(ct)
        return ct

    def _decrypt_and_hash(self, ct: bytes) -> bytes:
        if self._k is None:
            pt = ct
        else:
            try:
                pt = self._k.decrypt(self.h, ct)
            except DecryptError:
                raise HandshakeError("handshake message failed authentication") from None
        self._mix_hash(ct)
        return pt

    def _dh_token(self, token: bytes) -> None:
        a, b = token[0:1], token[1:2]  # e.g. b"es": initiator's e with responder's s
        if not self.initiator:
            a, b = b, a
        mine = self.e if a == b"e" else self.s
        theirs = self.re if b == b"e" else self.rs
        self._mix_key(_dh(mine, theirs))  # type: ignore[arg-type]

    def _my_turn(self) -> bool:
        return (self._step % 2 == 0) == self.initiator

    def write_message(self, payload: bytes) -> bytes:
        if self.finished or not self._my_turn():
            raise HandshakeError("not our turn to write a handshake message")
        out = bytearray()
        for token in self._PATTERN[self._step]:
            if token == b"e":
                if self.e is None:
                    self.e = _x25519_new()
                self.e_pub = _x25519_pub(self.e)
                out += self.e_pub
                self._mix_hash(self.e_pub)
            elif token == b"s":
                out += self._encrypt_and_hash(self.s_pub)
            else:
                self._dh_token(token)
        out += self._encrypt_and_hash(payload)
        self._step += 1
        return bytes(out)

    def read_message(self, message: bytes) -> bytes:
        if self.finished or self._my_turn():
            raise HandshakeError("unexpected handshake message (not the peer's turn)")
        pos = 0
        for token in self._PATTERN[self._step]:
            if token == b"e":
                if len(message) < pos + _DH_LEN:
                    raise HandshakeError("handshake message too short for an ephemeral key")
                self.re = message[pos : pos + _DH_LEN]
                pos += _DH_LEN
                self._mix_hash(self.re)
            elif token == b"s":
                n = _DH_LEN + (_TAG if self._k is not None else 0)
                if len(message) < pos + n:
                    raise HandshakeError("handshake message too short for a static key")
                self.rs = self._decrypt_and_hash(message[pos : pos + n])
                pos += n
            else:
                self._dh_token(token)
        if self._k is not None and len(message) - pos < _TAG:
            raise HandshakeError("handshake message too short for its payload tag")
        payload = self._decrypt_and_hash(message[pos:])
        self._step += 1
        return payload

    def split(self) -> tuple[Cipher, Cipher]:
        """(cipher for messages we send, cipher for messages we receive)."""
        k1, k2 = _hkdf2(self.ck, b"")
        c1, c2 = Cipher(k1, self.aesgcm), Cipher(k2, self.aesgcm)
        return (c1, c2) if self.initiator else (c2, c1)


# -- libp2p payload: protobuf NoiseHandshakePayload {bytes identity_key = 1; bytes identity_sig = 2},
# plus our early data in a field libp2p does not use (other implementations skip unknown fields)

_EARLY_DATA_FIELD = 1000
_EXTENSIONS_FIELD = 4  # libp2p's NoiseExtensions{webtransport_certhashes = 1, stream_muxers = 2}
_MUXERS_FIELD = 2
MAX_EARLY_DATA = 32 * 1024  # bytes of early data either side may put in a handshake message
MAX_MUXERS = 16  # muxers a peer may offer in its extensions


def _encode_payload(
    keypair: KeyPair, noise_static_pub: bytes, early: bytes | None = None, muxers: Sequence[str] = ()
) -> bytes:
    sig = keypair.sign(_SIG_PREFIX + noise_static_pub)
    fields: list[tuple[int, int | bytes]] = [(1, keypair.public_key_protobuf()), (2, sig)]
    if muxers:
        fields.append((_EXTENSIONS_FIELD, encode_fields([(_MUXERS_FIELD, m.encode()) for m in muxers])))
    if early is not None:
        fields.append((_EARLY_DATA_FIELD, early))
    return encode_fields(fields)


def _decode_payload(data: bytes) -> tuple[bytes, bytes, bytes | None, tuple[str, ...]]:
    """(identity key, signature, early data, the muxers the peer offers) of a handshake payload."""
    try:
        fields = decode_fields(data)
        ext = fields.get(_EXTENSIONS_FIELD)
        raw_muxers = decode_repeated(ext, _MUXERS_FIELD) if isinstance(ext, bytes) else []
        muxers = tuple(m.decode() for m in raw_muxers)
    except (ValueError, UnicodeDecodeError) as e:
        raise HandshakeError(f"malformed handshake payload: {e}") from None
    key, sig, early = fields.get(1), fields.get(2), fields.get(_EARLY_DATA_FIELD)
    if not isinstance(key, bytes) or not isinstance(sig, bytes):
        raise HandshakeError("handshake payload lacks the identity key or its signature")
    if early is not None and (not isinstance(early, bytes) or len(early) > MAX_EARLY_DATA):
        raise HandshakeError(f"handshake early data must be a byte string of at most {MAX_EARLY_DATA} bytes")
    if len(muxers) > MAX_MUXERS:
        raise HandshakeError(f"handshake payload offers {len(muxers)} muxers (at most {MAX_MUXERS})")
    return key, sig, early, muxers


class NoiseHandshake:
    """libp2p's Noise XX handshake as a sans-IO object.

    Feed received bytes to :meth:`receive`; send whatever it (and :meth:`start`) return. When
    ``complete`` is true, ``remote_peer`` is the authenticated PeerId, ``session`` seals further
    traffic, and ``leftover`` holds bytes that arrived after the last handshake message.

    ``early_data`` (called once, when our payload is written) gives bytes to carry in the payload
    (None: none this time);
    ``remote_early_data`` is the peer's, set only when both sides sent theirs (so each side knows
    the other read its own). Early data is encrypted but sent before the initiator is
    authenticated: only what any peer may learn belongs there.

    ``protocol_name`` picks the suite: AES-GCM between Lattica nodes, ChaChaPoly
    (:data:`LIBP2P_PROTOCOL_NAME`) for ``/noise`` with any libp2p peer. ``muxers`` are offered in
    the payload's extensions (libp2p's inlined muxer negotiation); once complete, ``muxer`` is the
    first of the initiator's that both offered (None when either side offered none: the muxer is
    then negotiated with multistream-select; no muxer in common fails the handshake).
    """

    def __init__(
        self,
        keypair: KeyPair,
        initiator: bool,
        expected_peer: PeerId | None = None,
        *,
        static_key: X25519PrivateKey | None = None,
        early_data: Callable[[], bytes | None] | None = None,
        protocol_name: bytes = PROTOCOL_NAME,
        muxers: Sequence[str] = (),
    ) -> None:
        self._keypair = keypair
        self._expected = expected_peer
        self._early = early_data
        self._early_sent = False
        self.remote_early_data: bytes | None = None
        self._muxers = tuple(muxers)
        self.remote_muxers: tuple[str, ...] = ()
        self.muxer: str | None = None
        self._hs = _HandshakeState(initiator, static_key or _x25519_new(), protocol_name=protocol_name)
        self._buf = bytearray()
        self.complete = False
        self.remote_peer: PeerId | None = None
        self.remote_public_key: bytes | None = None
        self.session: NoiseSession | None = None
        self.leftover = b""

    def start(self) -> bytes:
        """Bytes to send first: the initiator's ``-> e``; nothing for the responder."""
        if self._hs.initiator:
            return self._frame(self._hs.write_message(b""))
        return b""

    @staticmethod
    def _frame(msg: bytes) -> bytes:
        return len(msg).to_bytes(2, "big") + msg

    def receive(self, data: bytes) -> bytes:
        """Consume handshake bytes; return bytes to send. Raises HandshakeError on any failure."""
        if self.complete:
            raise HandshakeError("handshake already complete")
        self._buf += data
        out = b""
        while not self.complete and len(self._buf) >= 2:
            n = int.from_bytes(self._buf[:2], "big")
            if len(self._buf) < 2 + n:
                break
            msg = bytes(self._buf[2 : 2 + n])
            del self._buf[: 2 + n]
            out += self._on_message(msg)
        if self.complete:
            self.leftover = bytes(self._buf)
            self._buf.clear()
        elif len(self._buf) > 2 + MAX_FRAME:
            raise FrameTooLarge("handshake buffer overflow")
        return out

    def _on_message(self, msg: bytes) -> bytes:
        hs = self._hs
        payload = hs.read_message(msg)
        if hs._step == 1:  # responder got "-> e": answer "<- e, ee, s, es" with our identity
            if payload:
                raise HandshakeError("first handshake message must not carry a payload")
            payload = _encode_payload(self._keypair, hs.s_pub, self._our_early(), self._muxers)
            return self._frame(hs.write_message(payload))
        early = self._authenticate(payload)
        if hs._step == 2:  # initiator got message 2: send "-> s, se" and finish
            # our early data only to a responder that sent its own (it reads ours, then)
            mine = self._our_early() if early is not None else None
            out = self._frame(hs.write_message(_encode_payload(self._keypair, hs.s_pub, mine, self._muxers)))
            if mine is not None:
                self.remote_early_data = early
            self._finish()
            return out
        if self._early_sent:  # responder got message 3
            self.remote_early_data = early
        self._finish()
        return b""

    def _our_early(self) -> bytes | None:
        """Our early data, if any fits in a handshake message (else the host says it later)."""
        data = self._early() if self._early is not None else None
        if data is None or len(data) > MAX_EARLY_DATA:
            return None
        self._early_sent = True
        return data

    def _authenticate(self, payload: bytes) -> bytes | None:
        key_pb, sig, early, self.remote_muxers = _decode_payload(payload)
        try:
            pub = public_key_from_protobuf(key_pb)
        except Exception as e:
            raise HandshakeError(f"peer sent an unusable identity key: {e}") from None
        if not verify_signature(pub, sig, _SIG_PREFIX + self._hs.rs):  # type: ignore[operator]
            raise HandshakeError("identity signature over the Noise static key is invalid")
        peer = PeerId.from_public_key(pub)
        if self._expected is not None and peer != self._expected:
            raise PeerIdMismatch(f"dialed {self._expected} but the peer authenticated as {peer}")
        self.remote_peer, self.remote_public_key = peer, pub
        return early

    def _finish(self) -> None:
        if self._muxers and self.remote_muxers:
            ours, theirs = self._muxers, self.remote_muxers
            first = ours if self._hs.initiator else theirs
            other = set(theirs if self._hs.initiator else ours)
            self.muxer = next((m for m in first if m in other), None)
            if self.muxer is None:
                raise HandshakeError(f"no stream muxer in common: we offer {list(ours)}, the peer {list(theirs)[:4]}")
        send, recv = self._hs.split()
        self.session = NoiseSession(send, recv)
        self.complete = True


class PlainBuffer:
    """The buffer received frames are opened into, one frame at a time, shared by the connections
    of one transport: its loop handles one connection's bytes at a time, each frame parsed before
    the next is opened."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = memoryview(bytearray(MAX_PLAINTEXT))


class NoiseSession:
    """Seals outgoing bytes into length-prefixed Noise frames and opens incoming ones.

    Work is done one frame (<= 64 KiB) at a time into buffers of that size: a big message never
    needs one big fresh buffer, which the allocator would map from the kernel and fault in page by
    page on every call.
    """

    __slots__ = ("_send", "_recv", "_buf", "_scratch", "_into")

    def __init__(self, send: Cipher, recv: Cipher) -> None:
        self._send = send
        self._recv = recv
        self._buf = bytearray()  # a partial frame received
        self._scratch = bytearray(MAX_PLAINTEXT)  # gathers small pieces into one frame
        self._into: memoryview | None = None  # where ``open_frames`` puts each plaintext now (None: a buffer per frame)

    def seal(self, data: bytes | bytearray | memoryview) -> bytearray:
        """Encrypt ``data`` (any length) into one buffer of consecutive frames, ready to write."""
        return self.seal_pieces([data])

    @overload
    def seal_pieces(self, pieces: list, into: None = None, limit: int = MAX_PLAINTEXT) -> bytearray: ...

    @overload
    def seal_pieces(
        self, pieces: list, into: bytearray | None = None, limit: int = MAX_PLAINTEXT
    ) -> bytearray | memoryview: ...

    def seal_pieces(
        self, pieces: list, into: bytearray | None = None, limit: int = MAX_PLAINTEXT
    ) -> bytearray | memoryview:
        """Encrypt the concatenation of ``pieces`` into one buffer of consecutive frames of at most
        ``limit`` plaintext bytes each.

        Full frames are encrypted straight from the pieces; only what straddles pieces is copied
        (into a scratch frame). No input means one empty frame. With ``into`` (a buffer the caller
        reuses) big enough, the frames go there and a view of them is returned: a fresh buffer
        per write would be zeroed and, when large, faulted in page by page. A smaller ``limit``
        lets the receiver open the first frames of a write before its last bytes arrive (a slow
        path delivers a big write over many round trips or pacing intervals).
        """
        if not 0 < limit <= MAX_PLAINTEXT:
            raise ValueError(f"frame limit must be in 1..{MAX_PLAINTEXT}")
        n = sum(map(len, pieces))
        sealed = n + max(1, -(-n // limit)) * (2 + _TAG)
        out = into if into is not None and len(into) >= sealed else bytearray(sealed)
        enc = self._send.encrypt_into
        sv = memoryview(self._scratch)
        whole = sv[:limit]  # the scratch frame when full
        frame = limit + _TAG
        pos = 0
        fill = 0
        with memoryview(out) as ov:
            for piece in pieces:
                v = piece if type(piece) is memoryview else memoryview(piece)
                size = len(v)
                i = 0
                while i < size:
                    if not fill and size - i >= limit:
                        chunk = v[i : i + limit]
                        i += limit
                    else:
                        take = min(limit - fill, size - i)
                        sv[fill : fill + take] = v[i : i + take]
                        fill += take
                        i += take
                        if fill < limit:
                            continue
                        chunk = whole
                        fill = 0
                    out[pos] = frame >> 8
                    out[pos + 1] = frame & 0xFF
                    enc(chunk, ov[pos + 2 : pos + 2 + frame])
                    pos += 2 + frame
            if fill or not pos:
                clen = fill + _TAG
                out[pos] = clen >> 8
                out[pos + 1] = clen & 0xFF
                enc(sv[:fill], ov[pos + 2 : pos + 2 + clen])
        whole.release()
        sv.release()
        return out if len(out) == sealed else memoryview(out)[:sealed]

    def open(self, data: bytes | bytearray | memoryview) -> bytearray | None:
        """The plaintext of every frame ``data`` completes, in one buffer (None if none)."""
        frames = list(self.open_frames(data))
        return bytearray().join(frames) if frames else None

    def open_frames(
        self, data: bytes | bytearray | memoryview, plain: PlainBuffer | None = None
    ) -> Iterator[bytearray | memoryview]:
        """Consume received bytes; yield the plaintext of each frame they complete.

        ``data`` is never retained (only a partial frame is copied), so it may be a reused buffer.
        With ``plain`` each plaintext is a view of its one frame-sized buffer, valid until the next
        is asked for (the caller parses each first): fresh buffers would each be zeroed before
        being written, and one buffer stays in the cache. Run it to the end (or drop the
        connection): a consumer that stops early loses the rest of the read.
        """
        self._into = plain.buf if plain is not None else None
        try:
            yield from self._open_frames(data)
        finally:
            self._into = None

    def _open_frames(self, data: bytes | bytearray | memoryview) -> Iterator[bytearray | memoryview]:
        buf = self._buf
        with memoryview(data) as mv:
            total = len(mv)
            pos = 0
            if buf:  # complete the frame begun in an earlier read
                if len(buf) < 2:
                    pos = min(2 - len(buf), total)
                    buf += mv[:pos]
                    if len(buf) < 2:
                        return
                need = 2 + ((buf[0] << 8) | buf[1]) - len(buf)
                take = min(need, total - pos)
                buf += mv[pos : pos + take]
                pos += take
                if take < need:
                    return
                with memoryview(buf) as bv:
                    yield self._open_one(bv[2:])
                buf.clear()
            while total - pos >= 2:
                clen = (mv[pos] << 8) | mv[pos + 1]
                if total - pos - 2 < clen:
                    break
                yield self._open_one(mv[pos + 2 : pos + 2 + clen])
                pos += 2 + clen
            if pos < total:
                buf += mv[pos:]

    def _open_one(self, ciphertext: memoryview) -> bytearray | memoryview:
        n = len(ciphertext) - _TAG
        if n < 0:
            raise DecryptError(f"frame of {len(ciphertext)} bytes is shorter than its tag")
        into = self._into
        if into is not None:
            view = into[:n]
            self._recv.decrypt_into(ciphertext, view)
            return view
        plain = bytearray(n)
        with memoryview(plain) as pv:
            self._recv.decrypt_into(ciphertext, pv)
        return plain
