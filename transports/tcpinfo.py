"""What the kernel knows about a TCP connection (Linux ``TCP_INFO``): its smoothed round-trip
time, the bytes acknowledged and received, the segment size and the pacing rate; read when asked
(the dashboard, and about once a second by a connection sizing its windows and frames), never
counted on the data path."""

from __future__ import annotations

import socket
import struct
from typing import Any

__all__ = ["tcp_info"]

# offsets in struct tcp_info (linux/tcp.h): u32 tcpi_snd_mss at 16, u32 tcpi_rtt (µs) at 68, u64
# tcpi_pacing_rate (bytes/s; ~0 for none) at 104, u64 tcpi_bytes_acked at 120 and
# tcpi_bytes_received at 128 (kernels >= 4.1; older ones return a shorter struct)
_MSS, _RTT, _PACING, _ACKED, _RECEIVED, _SIZE = 16, 68, 104, 120, 128, 136


def tcp_info(sock: Any) -> dict[str, float] | None:
    """``{"rtt_ms", "mss", "bytes_sent", "bytes_received", "pacing_rate"}`` of a TCP socket (the
    last three only where the kernel has them; ``pacing_rate`` in bytes/s, absent when the kernel
    does not limit it); None where TCP_INFO is not available or the socket is gone."""
    opt = getattr(socket, "TCP_INFO", None)
    if opt is None or sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, opt, 232)
    except (OSError, ValueError):
        return None
    if len(raw) < _RTT + 4:
        return None
    out: dict[str, float] = {
        "rtt_ms": struct.unpack_from("=I", raw, _RTT)[0] / 1000.0,
        "mss": struct.unpack_from("=I", raw, _MSS)[0],
    }
    if len(raw) >= _SIZE:
        pacing, _, out["bytes_sent"], out["bytes_received"] = struct.unpack_from("=QQQQ", raw, _PACING)
        if 0 < pacing < 1 << 62:
            out["pacing_rate"] = pacing
    return out
