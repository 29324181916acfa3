"""The dashboard: every node answers ``report`` (what it runs, whom it reaches and how) to the
members of its mesh; a node given ``dashboard=`` also serves the whole mesh in a browser, live,
with Prometheus metrics (docs/dashboard.md). The HTTP side loads only on such a node."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lattica.actors.dashboard.report import NAME, actor_detail, node_report
from lattica.actors.dashboard.usage import Usage

if TYPE_CHECKING:
    from lattica._runtime.calls import Calls
    from lattica.actors.dashboard.config import DashboardConfig
    from lattica.actors.dashboard.mesh import MeshWatch
    from lattica.config import NodeConfig
    from lattica.services import NodeServices

__all__ = ["DashboardService", "DashboardActor"]


class DashboardService:
    """This node's part of the dashboard: its report, the mesh watcher, and (when configured)
    the HTTP server, started once the node listens (``astart``)."""

    def __init__(self, rt: Calls, config: NodeConfig, services: NodeServices) -> None:
        self.rt = rt
        self.cfg: DashboardConfig | None = config.dashboard
        self.config = config  # what the node reports of itself (agent, labels)
        self.services = services  # the services it reports on
        self.usage = Usage(rt)  # sampled on every node: any member's dashboard may chart it
        self._watch: MeshWatch | None = None
        self.server: Any = None

    @property
    def watch(self) -> MeshWatch:
        """The mesh watcher (made at first use: a node that serves no dashboard never loads it)."""
        if self._watch is None:
            # (only a node that serves a dashboard, or `lattica status`)
            from lattica.actors.dashboard.mesh import MeshWatch

            cfg = self.cfg
            kw: dict[str, Any] = (
                {"every": cfg.every, "timeout": cfg.report_timeout, "max_nodes": cfg.max_nodes} if cfg else {}
            )
            self._watch = MeshWatch(self.rt, report=self.report, **kw)
        return self._watch

    async def astart(self) -> None:
        self.usage.start()
        if self.cfg is None:
            return
        from lattica.actors.dashboard.http import DashboardServer  # (aiohttp: only where a dashboard is served)

        server = DashboardServer(self.rt, self.watch, self.cfg, self, self.services)
        await server.start()
        self.server = server

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None else None

    async def report(self) -> dict:
        return await node_report(self.rt, self.services, self.config, self.usage)

    def detail(self, name: str) -> dict | None:
        """One actor of this node (live or ended lately): errors, output, series."""
        return actor_detail(self.rt, name, self.usage)

    def series(self) -> dict:
        """This node's utilisation samples."""
        return self.usage.node_series()

    async def aclose(self) -> None:
        self.usage.close()
        if self._watch is not None:
            self._watch.close()
        if self.server is not None:
            await self.server.close()
            self.server = None

    def close(self) -> None:
        self.usage.close()
        if self._watch is not None:
            self._watch.close()


class DashboardActor:
    """What members call for their dashboards: ``report`` (this node), ``detail`` (one actor's
    errors, output and series) and ``series`` (this node's utilisation)."""

    NAME = NAME

    def __init__(self, service: DashboardService) -> None:
        self._svc = service

    async def report(self) -> dict:
        return await self._svc.report()

    async def detail(self, name: str) -> dict | None:
        if type(name) is not str:
            raise TypeError("detail(name): name is an actor's name (str)")
        return self._svc.detail(name)

    async def series(self) -> dict:
        return self._svc.series()
