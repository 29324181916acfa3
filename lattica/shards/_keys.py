"""Shard descriptors, their ids and their registrations in the DHT, sans-IO.

A **service** is a name (``"llm"``); a **shard** of it is what one provider serves: a descriptor
such as ``{"model": "tiny", "layers": (0, 4)}`` or ``{"expert": 7}``, or a plain string. Its id is
canonical (keys sorted, ranges as ``a:b``), so two nodes that describe one shard alike find each
other: ``layers=0:4,model=tiny``. Each node that serves a shard keeps one record under
``lattica/shard/<service>/<shard id>`` with its PeerId as subkey (so only it signs it): the actors
serving it there, each with its load, and the node's mesh certificates.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from lattica import codec
from lattica._runtime.refs import ActorRef
from lattica.dht._records import SHARD_PREFIX
from lattica.errors import LatticaError

__all__ = ["shard_id", "shard_key", "encode_registration", "decode_registration", "MAX_PROVIDERS_PER_NODE"]

MAX_PROVIDERS_PER_NODE = 64  # actors one node lists for one shard (a record stays well within 16 KiB)
_WORD = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_ID = re.compile(r"[A-Za-z0-9_.\-=,:]{1,256}")


def shard_id(shard: str | Mapping[str, Any]) -> str:
    """The canonical id of ``shard``: a string as it is, or a descriptor of names mapped to
    names, integers or ``(start, end)`` ranges (ValueError for anything else)."""
    if isinstance(shard, str):
        if not _ID.fullmatch(shard):
            raise ValueError(f"a shard id is 1 to 256 letters, digits or _.-=,: (got {shard!r})")
        return shard
    if not isinstance(shard, Mapping) or not shard:
        raise ValueError("a shard is a string or a non-empty mapping of names to values")
    parts = []
    for k in sorted(shard):
        v = shard[k]
        if not isinstance(k, str) or not _WORD.fullmatch(k):
            raise ValueError(f"a shard descriptor's keys are 1 to 64 letters, digits or _.- (got {k!r})")
        if isinstance(v, bool):
            raise ValueError(f"shard descriptor value {v!r}: a name, an integer or a (start, end) range")
        if isinstance(v, int):
            text = str(v)
        elif isinstance(v, str) and _WORD.fullmatch(v):
            text = v
        elif isinstance(v, (tuple, list)) and len(v) == 2 and all(type(x) is int for x in v) and v[0] <= v[1]:
            text = f"{v[0]}:{v[1]}"
        else:
            raise ValueError(f"shard descriptor value {v!r}: a name, an integer or a (start, end) range")
        parts.append(f"{k}={text}")
    out = ",".join(parts)
    if len(out) > 256:
        raise ValueError("a shard descriptor's id is at most 256 characters")
    return out


def shard_key(service: str, shard: str | Mapping[str, Any]) -> bytes:
    """The DHT key under which the providers of ``shard`` of ``service`` register."""
    if not isinstance(service, str) or not _WORD.fullmatch(service):
        raise ValueError(f"a service name is 1 to 64 letters, digits or _.- (got {service!r})")
    return SHARD_PREFIX + f"{service}/{shard_id(shard)}".encode()


def encode_registration(entries: list[tuple[ActorRef, int]], certs: list[bytes]) -> bytes:
    """One node's record: ``(actor ref, load)`` of each actor serving the shard there."""
    return codec.encode_bytes([[[ref, int(load)] for ref, load in entries[:MAX_PROVIDERS_PER_NODE]], list(certs)])


def decode_registration(raw: bytes) -> tuple[list[tuple[ActorRef, int]], list[bytes]]:
    """The entries and certificates of a record (ValueError if it is not one)."""
    try:
        value = codec.decode(raw)
    except (LatticaError, TypeError, ValueError) as exc:
        raise ValueError(f"not a shard registration: {exc}") from None
    if type(value) is not list or len(value) != 2 or type(value[0]) is not list or type(value[1]) is not list:
        raise ValueError("a shard registration is [entries, certificates]")
    entries = []
    for item in value[0][:MAX_PROVIDERS_PER_NODE]:
        if (
            type(item) is not list
            or len(item) != 2
            or not isinstance(item[0], ActorRef)
            or type(item[1]) is not int
            or not 0 <= item[1] < 1 << 31
        ):
            raise ValueError("a shard registration's entry is [actor ref, load]")
        entries.append((item[0], item[1]))
    if not all(type(c) is bytes for c in value[1]):
        raise ValueError("a shard registration's certificates are bytes")
    return entries, value[1]
