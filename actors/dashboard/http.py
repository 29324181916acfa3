"""The dashboard's HTTP server (aiohttp, on the node's own loop): the page and its two files, the
mesh as JSON (``/api/mesh``, ``/api/node``), one actor's errors, output and series and one node's
utilisation, asked of the node that holds them (``/api/actor``, ``/api/series``), a live channel of pictures as server-sent events
(``/api/live``) and Prometheus metrics (``/metrics``). Only GET; a token on every request when
one is set (required off loopback); on loopback the Host header must name loopback too, so a web
page elsewhere cannot read the mesh through DNS rebinding."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import time
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from lattica._identity import PeerId
from lattica.actors.dashboard.clean import clean_detail, clean_series
from lattica.actors.dashboard.config import DashboardConfig, is_loopback
from lattica.actors.dashboard.mesh import dashboard_ref
from lattica.actors.dashboard.metrics import scrape
from lattica.actors.dashboard.usage import NODE_FIELDS
from lattica.errors import DashboardError, LatticaError
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._runtime.calls import Calls
    from lattica.actors.dashboard import DashboardService
    from lattica.actors.dashboard.mesh import MeshWatch
    from lattica.services import NodeServices

__all__ = ["DashboardServer"]

log = get_logger("lattica.dashboard")

HEARTBEAT = 15.0  # seconds between comments on an idle live channel (proxies keep it open)
WRITE_TIMEOUT = 30.0  # a live channel whose reader took nothing for this long is closed
IDLE_TIMEOUT = 5.0  # a connection not serving a request (slow to send one, or idle) is closed after this
MAX_CONNECTIONS = 128  # open at once; more are closed as they come (the node's own sockets need the rest)
_OPEN = frozenset({"/", "/app.js", "/style.css"})  # the page itself: no data, served without the token
_quiet = logging.getLogger("lattica.dashboard.http")  # aiohttp's own reports (malformed requests ...): not shown
_quiet.setLevel(logging.CRITICAL)
_FILES = {
    "/": ("index.html", "text/html"),
    "/app.js": ("app.js", "text/javascript"),
    "/style.css": ("style.css", "text/css"),
}
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # (the token may be in the page's address)
    "Cache-Control": "no-store",
}


class DashboardServer:
    """Serves one node's dashboard until closed."""

    def __init__(
        self, rt: Calls, watch: MeshWatch, cfg: DashboardConfig, service: DashboardService, services: NodeServices
    ) -> None:
        self.rt = rt
        self.services = services
        self.watch = watch
        self.service = service
        self.cfg = cfg
        self.loopback = is_loopback(cfg.host)
        self.token = cfg.token if cfg.token is not None or self.loopback else secrets.token_urlsafe(24)
        self.port = cfg.port
        self._files = {path: (_read(name), kind) for path, (name, kind) in _FILES.items()}
        self._runner: web.AppRunner | None = None
        self._server: asyncio.AbstractServer | None = None
        self._channels: set[asyncio.Task] = set()
        self._born: dict[Any, float] = {}  # connection -> when it opened, or last finished a request
        self._busy: dict[Any, int] = {}  # connection -> requests it is serving now
        self._fresh: dict[Any, float] = {}  # connections made in the last moment, not yet counted by aiohttp
        self._sweeper: asyncio.Task | None = None

    @property
    def url(self) -> str:
        """The page's address (with the token, when one is needed)."""
        host = f"[{self.cfg.host}]" if ":" in self.cfg.host else self.cfg.host
        return f"http://{host}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    async def start(self) -> None:
        app = web.Application(
            middlewares=[self._guard], client_max_size=self.cfg.max_request_bytes, handler_args={"max_field_size": 8190}
        )
        app.on_response_prepare.append(_secure)
        app.router.add_get("/", self._file)
        app.router.add_get("/app.js", self._file)
        app.router.add_get("/style.css", self._file)
        app.router.add_get("/api/mesh", self._mesh)
        app.router.add_get("/api/node", self._node)
        app.router.add_get("/api/live", self._live)
        app.router.add_get("/api/actor", self._actor)
        app.router.add_get("/api/series", self._series)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=1.0,
            logger=_quiet,
            keepalive_timeout=IDLE_TIMEOUT,
        )
        await runner.setup()
        self._runner = runner
        loop = asyncio.get_running_loop()
        try:  # (our own listener, not aiohttp's site: it bounds connections as they come)
            self._server = await loop.create_server(self._connection, self.cfg.host, self.cfg.port, reuse_address=True)
        except OSError as e:
            await runner.cleanup()
            self._runner = None
            raise DashboardError(f"the dashboard cannot listen on {self.cfg.bind}: {e.strerror or e}") from None
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = loop.create_task(self._sweep())
        log.info(
            "dashboard listening",
            url=self.url if self.loopback else self.url.split("?")[0],
            token_required=self.token is not None,
        )

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for task in list(self._channels):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- connections ----------------------------------------------------------------------------

    def _connection(self) -> asyncio.Protocol:
        """A new connection: aiohttp's handler, or closed at once beyond MAX_CONNECTIONS."""
        # (asked only while our listener is open: after the runner's setup, before its cleanup)
        assert self._runner is not None and self._runner.server is not None
        server = self._runner.server
        live = set(server.connections)
        now = time.monotonic()
        for h, t in list(self._fresh.items()):  # made, not yet registered (accepts come in batches)
            if h in live or now - t > 1.0:
                del self._fresh[h]
        if len(live) + len(self._fresh) >= MAX_CONNECTIONS:
            return _Refused()
        handler = server()
        self._born[handler] = self._fresh[handler] = now
        return handler

    async def _sweep(self) -> None:
        """Close connections that serve no request for IDLE_TIMEOUT: one that sends its request
        a byte at a time, or none, holds a socket for at most that long."""
        while True:
            await asyncio.sleep(1.0)
            server = self._runner.server if self._runner is not None else None
            live = set(server.connections) if server is not None else set()
            now = time.monotonic()
            for conn, since in list(self._born.items()):
                if conn not in live and now - since > 1.0:
                    del self._born[conn]  # (closed)
                    self._busy.pop(conn, None)
                elif not self._busy.get(conn) and now - since > IDLE_TIMEOUT:
                    del self._born[conn]
                    conn.force_close()

    # -- the guard ------------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"], text="the dashboard only reads: use GET\n")
        if self.loopback and not is_loopback(_hostname(request.host)):
            raise web.HTTPForbidden(
                text="this dashboard answers only requests addressed to loopback (its Host header)\n"
            )
        if request.path not in _OPEN:  # (the page itself carries no data: a link from anywhere may open it)
            if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none") or not _same_origin(
                request
            ):
                raise web.HTTPForbidden(text="requests from other sites are refused\n")
            if self.token is not None and not self._authorized(request):
                raise web.HTTPUnauthorized(
                    text="an access token is needed: open the address the node printed (…/?token=…)\n"
                )
        conn = request.protocol
        self._busy[conn] = self._busy.get(conn, 0) + 1
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception:
            log.exception("dashboard request failed", path=request.path)
            raise web.HTTPInternalServerError(text="the dashboard failed to answer (see the node's log)\n") from None
        finally:
            left = self._busy.get(conn, 1) - 1
            if left > 0:
                self._busy[conn] = left
            else:
                self._busy.pop(conn, None)
                if conn in self._born:
                    self._born[conn] = time.monotonic()  # (idle from now on)

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
        return web.Response(body=self.watch.encode(await self.watch.picture()), content_type="application/json")

    async def _node(self, request: web.Request) -> web.Response:
        return _json(await self.service.report())

    async def _actor(self, request: web.Request) -> web.Response:
        """``?node=<peer id>&name=<actor>``: the actor's detail, from its node."""
        name = request.query.get("name", "")
        if not name or len(name) > 256:
            raise web.HTTPBadRequest(text="give ?node=<peer id>&name=<actor name>\n")
        peer = self._member(request)
        if peer == self.rt.peer_id:
            got = self.service.detail(name)
        else:
            got = await self._ask(peer, "detail", name)
        detail = clean_detail(got)
        if detail is None:
            raise web.HTTPNotFound(text=f"node {peer} has no actor {name!r} (live, or ended lately)\n")
        return _json(detail)

    async def _series(self, request: web.Request) -> web.Response:
        """``?node=<peer id>``: the node's utilisation samples, from the node."""
        peer = self._member(request)
        got = self.service.series() if peer == self.rt.peer_id else await self._ask(peer, "series")
        series = clean_series(got, NODE_FIELDS)
        if series is None:
            raise web.HTTPBadGateway(text=f"node {peer} answered its series with something else\n")
        return _json(series)

    def _member(self, request: web.Request) -> PeerId:
        """The ``node`` the request names: this node or a member in the view (never any peer id:
        the dashboard does not dial strangers for a page)."""
        given = request.query.get("node", "")
        try:
            peer = PeerId.from_string(given)
        except (ValueError, TypeError):
            raise web.HTTPBadRequest(text="?node= must be a node's peer id (12D3KooW...)\n") from None
        membership = self.rt.membership
        known = {r["peer_id"] for r in membership.nodes()} if membership is not None else set()
        if peer != self.rt.peer_id and str(peer) not in known:
            raise web.HTTPNotFound(text=f"node {peer} is not in this node's membership view\n")
        return peer

    async def _ask(self, peer: PeerId, method: str, *args: Any) -> Any:
        try:
            return await self.rt.call(dashboard_ref(peer), method, args, {}, timeout=self.cfg.report_timeout)
        except LatticaError as e:
            raise web.HTTPBadGateway(text=f"node {peer} did not answer: {type(e).__name__}: {e}\n") from None

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text=scrape(self.rt, self.services),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Options": "nosniff"},
        )

    async def _live(self, request: web.Request) -> web.StreamResponse:
        if self.watch.watchers >= self.cfg.max_channels:
            raise web.HTTPServiceUnavailable(
                text=f"at most {self.cfg.max_channels} live channels are open at once: close a page\n"
            )
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
                except TimeoutError:
                    await _send(resp, b": keep-alive\n\n")
                    continue
                if pic is None:
                    break
                await _send(resp, b"event: picture\ndata: " + self.watch.encode(pic) + b"\n\n")
        except (TimeoutError, ConnectionError):
            if request.transport is not None:
                request.transport.abort()  # (gone, or not reading: what the kernel holds for it goes too)
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


def _json(obj: Any) -> web.Response:
    return web.Response(
        body=json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str).encode(),
        content_type="application/json",
    )


def _hostname(host: str | None) -> str:
    """The host part of a Host header (``[::1]:8265`` -> ``::1``; '' when malformed)."""
    if not host:
        return ""
    if host.startswith("["):
        end = host.find("]")
        rest = host[end + 1 :] if end > 0 else "?"
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return ""
        return host[1:end]
    name, sep, port = host.rpartition(":")
    if not sep:
        return host
    return name if port.isdigit() and ":" not in name else ""


def _same_origin(request: web.Request) -> bool:
    """No Origin header (a page loading its own parts, curl), or one naming this very host."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    return origin in (f"http://{request.host}", f"https://{request.host}")


class _Refused(asyncio.Protocol):
    """A connection over the limit: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


def _read(name: str) -> bytes:
    return resources.files("lattica.actors.dashboard").joinpath("static", name).read_bytes()
