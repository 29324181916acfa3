"""The dashboard: every node answers ``report`` (what it runs, whom it reaches and how) to the
members of its mesh; a node given ``dashboard=`` also serves the whole mesh in a browser, live,
with Prometheus metrics (docs/dashboard.md). The HTTP side loads only on such a node."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lattica.actors.dashboard.mesh import NAME, MeshWatch, dashboard_ref
from lattica.actors.dashboard.report import node_report

if TYPE_CHECKING:
    from lattica.actors.dashboard.config import DashboardConfig
    from lattica.runtime import Runtime

__all__ = ["DashboardService", "DashboardActor", "dashboard_ref"]


class DashboardService:
    """This node's part of the dashboard: its report, the mesh watcher, and (when configured)
    the HTTP server, started once the node listens (``astart``)."""

    def __init__(self, rt: Runtime, cfg: DashboardConfig | None) -> None:
        self.rt = rt
        self.cfg = cfg
        self.watch = MeshWatch(rt, every=cfg.every, timeout=cfg.report_timeout, max_nodes=cfg.max_nodes) if cfg else MeshWatch(rt)
        self.server: Any = None

    async def astart(self) -> None:
        if self.cfg is None:
            return
        from lattica.actors.dashboard.http import DashboardServer  # (aiohttp: only where a dashboard is served)

        server = DashboardServer(self.rt, self.watch, self.cfg)
        await server.start()
        self.server = server

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None else None

    async def report(self) -> dict:
        return await node_report(self.rt)

    async def aclose(self) -> None:
        self.watch.close()
        if self.server is not None:
            await self.server.close()
            self.server = None

    def close(self) -> None:
        self.watch.close()


class DashboardActor:
    """What members call: ``report`` (this node, for their dashboards)."""

    NAME = NAME

    def __init__(self, service: DashboardService) -> None:
        self._svc = service

    async def report(self) -> dict:
        return await self._svc.report()
