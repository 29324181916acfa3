"""What the kernel knows about a TCP connection (Linux ``TCP_INFO``): its smoothed round-trip
time and the bytes acknowledged and received, read when asked (the dashboard), never counted on
the data path."""

from __future__ import annotations

import socket
import struct
from typing import Any

__all__ = ["tcp_info"]

# offsets in struct tcp_info (linux/tcp.h): u32 tcpi_rtt (µs) at 68, u64 tcpi_bytes_acked at 120
# and tcpi_bytes_received at 128 (kernels >= 4.1; older ones return a shorter struct)
_RTT, _ACKED, _RECEIVED, _SIZE = 68, 120, 128, 136


def tcp_info(sock: Any) -> dict[str, float] | None:
    """``{"rtt_ms", "bytes_sent", "bytes_received"}`` of a TCP socket (bytes only where the kernel
    has them); None where TCP_INFO is not available or the socket is gone."""
    opt = getattr(socket, "TCP_INFO", None)
    if opt is None or sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, opt, 232)
    except (OSError, ValueError):
        return None
    if len(raw) < _RTT + 4:
        return None
    out: dict[str, float] = {"rtt_ms": struct.unpack_from("=I", raw, _RTT)[0] / 1000.0}
    if len(raw) >= _SIZE:
        out["bytes_sent"], out["bytes_received"] = struct.unpack_from("=QQ", raw, _ACKED)
    return out
