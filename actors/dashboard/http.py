"""The dashboard's HTTP server (aiohttp, on the node's own loop): the page and its two files, the
mesh as JSON (``/api/mesh``, ``/api/node``), a live channel of pictures as server-sent events
(``/api/live``) and Prometheus metrics (``/metrics``). Only GET; a token on every request when
one is set (required off loopback); on loopback the Host header must name loopback too, so a web
page elsewhere cannot read the mesh through DNS rebinding."""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from lattica.actors.dashboard.config import DashboardConfig, is_loopback
from lattica.actors.dashboard.metrics import scrape
from lattica.actors.dashboard.report import node_report
from lattica.errors import DashboardError
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica.actors.dashboard.mesh import MeshWatch
    from lattica.runtime import Runtime

__all__ = ["DashboardServer"]

log = get_logger("lattica.dashboard")

HEARTBEAT = 15.0  # seconds between comments on an idle live channel (proxies keep it open)
WRITE_TIMEOUT = 30.0  # a live channel whose reader took nothing for this long is closed
_FILES = {"/": ("index.html", "text/html"), "/app.js": ("app.js", "text/javascript"), "/style.css": ("style.css", "text/css")}
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # (the token may be in the page's address)
    "Cache-Control": "no-store",
}


class DashboardServer:
    """Serves one node's dashboard until closed."""

    def __init__(self, rt: Runtime, watch: MeshWatch, cfg: DashboardConfig) -> None:
        self.rt = rt
        self.watch = watch
        self.cfg = cfg
        self.loopback = is_loopback(cfg.host)
        self.token = cfg.token if cfg.token is not None or self.loopback else secrets.token_urlsafe(24)
        self.port = cfg.port
        self._files = {path: (_read(name), kind) for path, (name, kind) in _FILES.items()}
        self._runner: web.AppRunner | None = None
        self._channels: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        """The page's address (with the token, when one is needed)."""
        host = f"[{self.cfg.host}]" if ":" in self.cfg.host else self.cfg.host
        return f"http://{host}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    async def start(self) -> None:
        app = web.Application(middlewares=[self._guard], client_max_size=self.cfg.max_request_bytes, handler_args={"max_field_size": 8190})
        app.on_response_prepare.append(_secure)
        app.router.add_get("/", self._file)
        app.router.add_get("/app.js", self._file)
        app.router.add_get("/style.css", self._file)
        app.router.add_get("/api/mesh", self._mesh)
        app.router.add_get("/api/node", self._node)
        app.router.add_get("/api/live", self._live)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.cfg.host, self.cfg.port, reuse_address=True)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            raise DashboardError(f"the dashboard cannot listen on {self.cfg.bind}: {e.strerror or e}") from None
        self._runner = runner
        addrs = runner.addresses
        if addrs:
            self.port = addrs[0][1]
        log.info("dashboard listening", url=self.url if self.loopback else self.url.split("?")[0], token_required=self.token is not None)

    async def close(self) -> None:
        for task in list(self._channels):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- the guard ------------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"], text="the dashboard only reads: use GET\n")
        if self.loopback and not is_loopback(_hostname(request.host)):
            raise web.HTTPForbidden(text="this dashboard answers only requests addressed to loopback (its Host header)\n")
        if self.token is not None and not self._authorized(request):
            raise web.HTTPUnauthorized(text="an access token is needed: open the address the node printed (…/?token=…)\n")
        return await handler(request)

    def _authorized(self, request: web.Request) -> bool:
        given = request.query.get("token")
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            given = auth[7:]
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())  # type: ignore[union-attr]

    # -- pages and data -------------------------------------------------------------------------

    async def _file(self, request: web.Request) -> web.Response:
        body, kind = self._files[request.path]
        return web.Response(body=body, content_type=kind, charset="utf-8")

    async def _mesh(self, request: web.Request) -> web.Response:
        return _json(await self.watch.picture())

    async def _node(self, request: web.Request) -> web.Response:
        return _json(await node_report(self.rt))

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=scrape(self.rt), content_type="text/plain", charset="utf-8", headers={"X-Content-Type-Options": "nosniff"})

    async def _live(self, request: web.Request) -> web.StreamResponse:
        if self.watch.watchers >= self.cfg.max_channels:
            raise web.HTTPServiceUnavailable(text=f"at most {self.cfg.max_channels} live channels are open at once: close a page\n")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        watcher = self.watch.watch()
        task = asyncio.current_task()
        if task is not None:
            self._channels.add(task)
        try:
            await _send(resp, b": live\n\n")
            while True:
                try:
                    pic = await asyncio.wait_for(watcher.next(), HEARTBEAT)
                except asyncio.TimeoutError:
                    await _send(resp, b": keep-alive\n\n")
                    continue
                if pic is None:
                    break
                await _send(resp, b"event: picture\ndata: " + _dumps(pic) + b"\n\n")
        except (ConnectionError, asyncio.TimeoutError):
            pass  # the reader went away, or stopped reading: its slot is freed
        finally:
            watcher.close()
            if task is not None:
                self._channels.discard(task)
        return resp


async def _send(resp: web.StreamResponse, data: bytes) -> None:
    """Write, bounded in time: a reader that stops reading holds at most the transport's buffer."""
    await asyncio.wait_for(resp.write(data), WRITE_TIMEOUT)


async def _secure(request: web.Request, response: web.StreamResponse) -> None:
    for k, v in _HEADERS.items():
        response.headers.setdefault(k, v)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=str).encode()


def _json(obj: Any) -> web.Response:
    return web.Response(body=_dumps(obj), content_type="application/json")


def _hostname(host: str | None) -> str:
    """The host part of a Host header (``[::1]:8265`` -> ``::1``)."""
    if not host:
        return ""
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _read(name: str) -> bytes:
    return resources.files("lattica.actors.dashboard").joinpath("static", name).read_bytes()
