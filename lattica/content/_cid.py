"""Content identifiers as IPFS writes them: CIDv1 over a sha2-256 multihash, base32 text.

A CID names bytes by their hash, so whoever holds a block can prove it is the one asked for.
Only what the content plane produces is accepted: version 1 (or a version 0 ``Qm...`` text, read as
the dag-pb CID it stands for), codecs raw (0x55) and dag-pb (0x70), multihash sha2-256 (0x12/32).
"""

from __future__ import annotations

import base64
import binascii
import builtins
import hashlib
from typing import Final

from lattica._protobuf import uvarint
from lattica.errors import InvalidCid

__all__ = ["Cid", "RAW", "DAG_PB", "SHA2_256"]

RAW: Final = 0x55
DAG_PB: Final = 0x70
SHA2_256: Final = 0x12
_CODECS: Final = {RAW: "raw", DAG_PB: "dag-pb"}
_DIGEST_SIZE: Final = 32
_MAX_TEXT: Final = 128
_SHA2_256_PREFIX: Final = bytes((SHA2_256, _DIGEST_SIZE))
_V1_SIZE: Final = 4 + _DIGEST_SIZE  # a CIDv1 of a raw or dag-pb block: version, codec, multihash prefix, digest


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A minimal (canonical) varint of at most 9 bytes at ``pos``; InvalidCid otherwise."""
    n = shift = 0
    for i in range(9):
        if pos + i >= len(buf):
            raise InvalidCid("truncated varint in CID")
        b = buf[pos + i]
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            if b == 0 and i:
                raise InvalidCid("non-minimal varint in CID")
            return n, pos + i + 1
        shift += 7
    raise InvalidCid("varint in CID is too long")


class Cid:
    """A CIDv1: ``codec`` (RAW or DAG_PB) and the sha2-256 ``digest`` of the block it names.

    Immutable and hashable; ``str()`` is the base32 text (``bafk...`` for raw, ``bafy...`` for
    dag-pb) and ``bytes`` the binary form that travels in dag-pb links and on the wire."""

    __slots__ = ("codec", "digest", "_bytes")
    codec: int
    digest: builtins.bytes  # (``builtins``: the ``bytes`` property below shadows the name in the class body)
    _bytes: builtins.bytes

    def __init__(self, codec: int, digest: bytes) -> None:
        if codec not in _CODECS:
            raise InvalidCid(f"unsupported CID codec 0x{codec:x} (only raw 0x55 and dag-pb 0x70)")
        if len(digest) != _DIGEST_SIZE:
            raise InvalidCid(f"a sha2-256 digest has 32 bytes, not {len(digest)}")
        object.__setattr__(self, "codec", codec)
        object.__setattr__(self, "digest", bytes(digest))
        object.__setattr__(self, "_bytes", b"\x01" + uvarint(codec) + bytes((SHA2_256, _DIGEST_SIZE)) + self.digest)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Cid is immutable")

    @classmethod
    def of(cls, data: bytes | bytearray | memoryview, codec: int = RAW) -> Cid:
        """The CID of ``data`` as a block of ``codec``."""
        return cls(codec, hashlib.sha256(data).digest())

    @classmethod
    def from_bytes(cls, raw: bytes | bytearray | memoryview) -> Cid:
        """Parse the binary form (all of ``raw``)."""
        raw = bytes(raw)
        if len(raw) == _V1_SIZE and raw[0] == 1 and raw[1] in _CODECS and raw[2:4] == _SHA2_256_PREFIX:
            cid = object.__new__(cls)  # (the form we write ourselves, as every peer sends it: already canonical)
            object.__setattr__(cid, "codec", raw[1])
            object.__setattr__(cid, "digest", raw[4:])
            object.__setattr__(cid, "_bytes", raw)
            return cid
        cid, end = cls.read(raw, 0)
        if end != len(raw):
            raise InvalidCid(f"{len(raw) - end} trailing bytes after a CID")
        return cid

    @classmethod
    def read(cls, buf: bytes, pos: int) -> tuple[Cid, int]:
        """Parse a binary CID starting at ``pos``; return it and the position after it."""
        if buf[pos : pos + 2] == bytes((SHA2_256, _DIGEST_SIZE)):  # a CIDv0: a bare multihash
            digest = buf[pos + 2 : pos + 2 + _DIGEST_SIZE]
            if len(digest) != _DIGEST_SIZE:
                raise InvalidCid("truncated CIDv0 multihash")
            return cls(DAG_PB, digest), pos + 2 + _DIGEST_SIZE
        version, pos = _read_varint(buf, pos)
        if version != 1:
            raise InvalidCid(f"unsupported CID version {version}")
        codec, pos = _read_varint(buf, pos)
        hash_code, pos = _read_varint(buf, pos)
        size, pos = _read_varint(buf, pos)
        if hash_code != SHA2_256 or size != _DIGEST_SIZE:
            raise InvalidCid(f"unsupported multihash 0x{hash_code:x}/{size} (only sha2-256)")
        digest = buf[pos : pos + size]
        if len(digest) != size:
            raise InvalidCid("truncated CID digest")
        return cls(codec, digest), pos + size

    @classmethod
    def parse(cls, text: str | bytes | Cid) -> Cid:
        """A CID from its text (``b...`` base32 CIDv1 or ``Qm...`` CIDv0), binary form, or itself."""
        if isinstance(text, Cid):
            return text
        if isinstance(text, (bytes, bytearray, memoryview)):
            return cls.from_bytes(text)
        if not isinstance(text, str) or not text or len(text) > _MAX_TEXT:
            raise InvalidCid(f"not a CID: {str(text)[:_MAX_TEXT]!r}")
        if text.startswith("Qm") and len(text) == 46:
            from lattica._identity import b58decode  # only for the rare CIDv0 text

            try:
                return cls.from_bytes(b58decode(text))
            except ValueError as e:
                raise InvalidCid(f"not a CIDv0: {text!r}: {e}") from None
        if text[0] != "b":
            raise InvalidCid(f"not a base32 CIDv1 (it must start with 'b'): {text!r}")
        body = text[1:].upper()
        try:
            raw = base64.b32decode(body + "=" * (-len(body) % 8))
        except (binascii.Error, ValueError):
            raise InvalidCid(f"not base32: {text!r}") from None
        return cls.from_bytes(raw)

    @property
    def bytes(self) -> builtins.bytes:
        """The binary form: version, codec, multihash."""
        return self._bytes

    @property
    def codec_name(self) -> str:
        return _CODECS[self.codec]

    def verify(self, data: builtins.bytes | bytearray | memoryview) -> bool:
        """Whether ``data`` is the block this CID names."""
        return hashlib.sha256(data).digest() == self.digest

    def __str__(self) -> str:
        return "b" + base64.b32encode(self._bytes).decode("ascii").lower().rstrip("=")

    def __repr__(self) -> str:
        return f"Cid({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cid) and other._bytes == self._bytes

    def __hash__(self) -> int:
        return hash(self._bytes)

    def __reduce__(self) -> tuple:  # copy/deepcopy; never unpickled from the network
        return (Cid, (self.codec, self.digest))
