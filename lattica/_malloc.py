"""glibc's malloc thresholds raised once per process for datagram-sized buffers.

A QUIC connection allocates several 64 KiB buffers per loopback datagram (aioquic's packet
builder, AEAD output, receive buffers). glibc serves them from the top of the heap and, with its
default 128 KiB trim threshold, hands the top back to the kernel after nearly every free, so the
next packet page-faults the memory in again: a third of a loopback QUIC transfer's time. Raising
the thresholds to values glibc's own dynamic tuning reaches (mmap above 4 MiB, trim above 8 MiB:
it moves them to S and 2 S after freeing an mmapped chunk of S bytes) removes that churn. The
cost is process-wide: allocations of 128 KiB to 4 MiB come from the heap instead of mmap, and
each malloc arena may keep up to 8 MiB free at its top (RSS a few MiB higher in threaded
processes). Not applied when the user set MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ or
malloc tunables in GLIBC_TUNABLES, when LATTICA_MALLOC_TUNING=0, or off glibc.
"""

from __future__ import annotations

import os
import sys

MMAP_THRESHOLD = 4 * 1024 * 1024
TRIM_THRESHOLD = 8 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>

_done = False


def tune() -> bool:
    """Raise glibc's mmap and trim thresholds (once per process); True if they were set now."""
    global _done
    if _done:
        return False
    _done = True
    env = os.environ
    if (
        env.get("LATTICA_MALLOC_TUNING", "1") == "0"
        or "MALLOC_MMAP_THRESHOLD_" in env
        or "MALLOC_TRIM_THRESHOLD_" in env
        or "glibc.malloc." in env.get("GLIBC_TUNABLES", "")
    ):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        import ctypes  # (1.5 ms: only a process that starts QUIC pays it)

        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        )
    except Exception:  # best effort: musl, no confstr name, no mallopt, a Python without _ctypes
        return False
