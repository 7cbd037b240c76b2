"""The live dashboard: an aiohttp app serving the page and ``/api/summary.json``.

Each request reads a fresh snapshot; the page reloads itself with a meta refresh (no
script). It binds to 127.0.0.1 unless told otherwise: the page shows operational data.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from dataclasses import dataclass
from datetime import date

from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import Clock
from batch.dashboard.data import Snapshot, load_snapshot
from batch.dashboard.figures import summary
from batch.dashboard.health_data import load_run_health
from batch.dashboard.health_render import run_health_section
from batch.dashboard.render import render_page
from batch.observe.exposition import listen
from planning.calendar import KST, week_start

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050
DEFAULT_REFRESH = 30

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def is_loopback(host: str) -> bool:
    """True when ``host`` names only this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    refresh_seconds: int = DEFAULT_REFRESH
    #: a fixed week to show; None follows the current KST week
    week: date | None = None
    #: a snapshot is reused this long, so many open browsers cost one set of queries
    cache_seconds: float = 5.0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is not in 0..65535")
        if self.refresh_seconds < 1:
            raise ValueError(f"refresh_seconds {self.refresh_seconds} must be at least 1")
        if not self.host:
            raise ValueError("host must not be empty")
        if self.cache_seconds < 0:
            raise ValueError(f"cache_seconds {self.cache_seconds} must not be negative")


def make_app(engine: AsyncEngine, clock: Clock, settings: ServerSettings) -> web.Application:
    """The app; ``?week=YYYY-MM-DD`` on either route shows another week."""

    cache: dict[date, tuple[float, Snapshot]] = {}
    lock = asyncio.Lock()

    async def snapshot(request: web.Request) -> Snapshot:
        now = clock.now()
        raw = request.query.get("week")
        if raw:
            try:
                week = week_start(date.fromisoformat(raw))
            except ValueError:
                raise web.HTTPBadRequest(text="week must be a date, YYYY-MM-DD") from None
        else:
            week = week_start(settings.week or now.astimezone(KST).date())
        async with lock:  # one reader at a time: concurrent requests share its result
            hit = cache.get(week)
            if hit is not None and clock.monotonic() - hit[0] < settings.cache_seconds:
                return hit[1]
            snap = await load_snapshot(engine, week=week, now=now)
            cache.clear()
            cache[week] = (clock.monotonic(), snap)
            return snap

    async def page(request: web.Request) -> web.Response:
        snap = await snapshot(request)
        health = await load_run_health(engine, day=snap.focus_day, now=clock.now())
        body = render_page(snap, refresh_seconds=settings.refresh_seconds, live=True,
                           sections=[run_health_section(health)])
        return web.Response(text=body, content_type="text/html", charset="utf-8",
                            headers=SECURITY_HEADERS)

    async def api(request: web.Request) -> web.Response:
        body = json.dumps(summary(await snapshot(request)), ensure_ascii=False)
        return web.Response(text=body, content_type="application/json", charset="utf-8",
                            headers=SECURITY_HEADERS)

    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_get("/api/summary.json", api)
    return app


@dataclass(frozen=True, slots=True)
class Running:
    """A started server: where it listens, and how to stop it."""

    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start(engine: AsyncEngine, clock: Clock, settings: ServerSettings) -> Running:
    """Start serving (port 0 picks a free port) and return at once."""
    runner, host, port = await listen(make_app(engine, clock, settings), settings.host,
                                      settings.port)
    return Running(runner, host, port)


def bound_addresses(running: Running) -> list[str]:
    """The addresses the server's sockets are bound to (for tests and the start message)."""
    out = []
    for addr in running.runner.addresses:
        if isinstance(addr, tuple):
            out.append(str(addr[0]))
        elif isinstance(addr, str):  # pragma: no cover - unix sockets are not used
            out.append(addr)
    return out


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "Running", "ServerSettings", "bound_addresses",
           "is_loopback", "make_app", "start"]
