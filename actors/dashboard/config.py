"""How a node serves its dashboard (``Node(dashboard=...)``, ``lattica node --dashboard``)."""

from __future__ import annotations

from lattica.config import DashboardConfig, dashboard_config, split_bind

__all__ = ["DashboardConfig", "dashboard_config", "is_loopback", "split_bind"]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    import ipaddress  # (only a node serving a dashboard asks)

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
