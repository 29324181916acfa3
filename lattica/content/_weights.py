"""Model weights as safetensors files: written from a dict of arrays, read back as arrays that are
memory-mapped from the file where the file is on disk.

The header of a file fetched from the network is parsed strictly before anything is mapped: its
length, every tensor's dtype, shape and byte range (inside the file, in order, no overlaps), so a
malformed file is a clear :class:`BadBlock`, never an out-of-range view.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from lattica.errors import BadBlock

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["encode", "decode", "mapped"]

_MAX_HEADER = 8 << 20  # a header's bytes (tens of thousands of tensors fit in 8 MiB)
_MAX_ENTRIES = 65536
_MAX_DIMS = 8
_DTYPES = {
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "U16": np.uint16,
    "I16": np.int16,
    "F16": np.float16,
    "U32": np.uint32,
    "I32": np.int32,
    "F32": np.float32,
    "U64": np.uint64,
    "I64": np.int64,
    "F64": np.float64,
}


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    detach = getattr(value, "detach", None)  # a torch tensor (torch itself is never imported here)
    if detach is not None:
        return detach().cpu().numpy()
    return np.asarray(value)


def encode(weights: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> bytes:
    """The safetensors bytes of ``weights`` (name -> numpy array, or torch tensor)."""
    from safetensors.numpy import save  # the format's own writer; loaded only when weights are written

    if not weights:
        raise ValueError("no weights to write")
    arrays = {str(k): np.ascontiguousarray(_as_array(v)) for k, v in weights.items()}
    return save(arrays, metadata=dict(metadata) if metadata else None)


def _header(buf: memoryview | bytes, size: int) -> tuple[dict, int]:
    if size < 8:
        raise BadBlock("not a safetensors file: shorter than its header length")
    (n,) = struct.unpack_from("<Q", buf, 0)
    if n > _MAX_HEADER or 8 + n > size:
        raise BadBlock(f"not a safetensors file: a header of {n} bytes in a file of {size}")
    try:
        header = json.loads(bytes(buf[8 : 8 + n]))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BadBlock(f"safetensors header is not JSON: {e!r}"[:200]) from None
    if type(header) is not dict:
        raise BadBlock("safetensors header is not a JSON object")
    return header, 8 + n


def _entries(header: dict, base: int, size: int) -> list[tuple[str, Any, tuple[int, ...], int, int]]:
    if len(header) > _MAX_ENTRIES:
        raise BadBlock(f"safetensors header names more than {_MAX_ENTRIES} tensors")
    out = []
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        if type(spec) is not dict or set(spec) != {"dtype", "shape", "data_offsets"}:
            raise BadBlock(f"safetensors entry {name!r} is malformed")
        dtype = _DTYPES.get(spec["dtype"]) if type(spec["dtype"]) is str else None
        shape, offs = spec["shape"], spec["data_offsets"]
        if dtype is None:
            raise BadBlock(f"safetensors entry {name!r} has an unsupported dtype {spec['dtype']!r}")
        if (
            type(shape) is not list
            or len(shape) > _MAX_DIMS
            or not all(type(d) is int and 0 <= d < size for d in shape)
        ):
            raise BadBlock(f"safetensors entry {name!r} has a malformed shape")
        if (
            type(offs) is not list
            or len(offs) != 2
            or not all(type(o) is int for o in offs)
            or not 0 <= offs[0] <= offs[1]
        ):
            raise BadBlock(f"safetensors entry {name!r} has malformed offsets")
        length = np.dtype(dtype).itemsize
        for d in shape:  # step by step, each factor below the file size: no huge products
            length *= d
            if length > size:
                raise BadBlock(f"safetensors entry {name!r}: its shape needs more bytes than the file has")
        if offs[1] - offs[0] != length or base + offs[1] > size:
            raise BadBlock(f"safetensors entry {name!r}: its bytes do not match its shape or run past the file")
        out.append((name, dtype, tuple(shape), base + offs[0], length))
    spans = sorted((start, start + length) for _, _, _, start, length in out)
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
        raise BadBlock("safetensors entries overlap")
    return out


def decode(data: bytes | memoryview) -> dict[str, np.ndarray]:
    """The arrays of a safetensors file held in memory (read-only views onto ``data``)."""
    buf = memoryview(data).cast("B")
    header, base = _header(buf, len(buf))
    return {
        name: np.frombuffer(buf, dtype, math.prod(shape), start).reshape(shape)
        for name, dtype, shape, start, length in _entries(header, base, len(buf))
    }


def mapped(path: str) -> dict[str, np.ndarray]:
    """The arrays of the safetensors file at ``path``, memory-mapped read-only (nothing is read
    until used; the pages are the page cache's, shared by every process mapping the file)."""
    if os.path.getsize(path) < 8:
        raise BadBlock("not a safetensors file: shorter than its header length")
    whole = np.memmap(path, dtype=np.uint8, mode="r")
    # (an ndarray is a buffer; numpy declares its __buffer__ only for Python >= 3.12)
    header, base = _header(memoryview(cast("Buffer", whole)), len(whole))
    out = {}
    for name, dtype, shape, start, length in _entries(header, base, len(whole)):
        out[name] = whole[start : start + length].view(dtype).reshape(shape) if length else np.zeros(shape, dtype)
    return out
