"""How a node serves its dashboard (``Node(dashboard=...)``, ``lattica node --dashboard``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DashboardConfig", "dashboard_config", "is_loopback"]


@dataclass
class DashboardConfig:
    """Where the dashboard listens and what it allows. A bind address that is not loopback needs
    an access token (``token``; generated at start when None, and printed); on loopback none is
    needed unless one is given. Pictures of the mesh are taken every ``every`` seconds while a
    page watches, each member's report awaited up to ``report_timeout``."""

    bind: str = "127.0.0.1:8265"
    token: str | None = None
    every: float = 2.0
    report_timeout: float = 2.0
    max_channels: int = 16  # live channels (open pages) at once
    max_nodes: int = 1024  # members shown
    max_request_bytes: int = 16 * 1024  # a request's body (the dashboard takes none)

    def __post_init__(self) -> None:
        host, port = split_bind(self.bind)  # (raises on a malformed address)
        if self.every <= 0 or self.report_timeout <= 0 or self.max_channels < 1 or self.max_nodes < 1:
            raise ValueError("dashboard: every and report_timeout must be > 0, max_channels and max_nodes >= 1")
        if self.token is not None and len(self.token) < 16:
            raise ValueError("dashboard: an access token needs at least 16 characters")

    @property
    def host(self) -> str:
        return split_bind(self.bind)[0]

    @property
    def port(self) -> int:
        return split_bind(self.bind)[1]


def split_bind(bind: str) -> tuple[str, int]:
    """``"127.0.0.1:8265"`` or ``"[::1]:8265"`` -> (host, port); ValueError if malformed."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not host or int(port) > 65535:
        raise ValueError(f"dashboard address {bind!r}: give HOST:PORT, e.g. 127.0.0.1:8265")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    import ipaddress  # (only a node serving a dashboard asks)

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def dashboard_config(value: Any) -> DashboardConfig | None:
    """``Node(dashboard=...)``: None/False (off), True (the default address), ``"HOST:PORT"``, or
    a DashboardConfig."""
    if value is None or value is False:
        return None
    if value is True:
        return DashboardConfig()
    if isinstance(value, str):
        return DashboardConfig(bind=value)
    if isinstance(value, DashboardConfig):
        return value
    raise ValueError(f"dashboard: give True, 'HOST:PORT' or a DashboardConfig, not {type(value).__name__}")
