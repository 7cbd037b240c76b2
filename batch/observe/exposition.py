"""Where the metrics go: a textfile for the node exporter, and a port on 127.0.0.1.

The textfile is the usual way to monitor a cron job that exits: written atomically (a
temporary file in the same directory, then a rename), in the Prometheus text format the
node exporter's textfile collector reads (no exemplars: that format has none). The port
serves ``/metrics`` on loopback while the run lasts; a scraper asking for OpenMetrics
(``Accept: application/openmetrics-text``) gets the exemplars too.
"""

from __future__ import annotations

import os
from pathlib import Path

from aiohttp import web
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.registry import CollectorRegistry

from batch.errors import ConfigError

HOST = "127.0.0.1"


def write_textfile(registry: CollectorRegistry, path: Path) -> Path:
    """Write the registry to ``path`` atomically; a reader never sees half a file."""
    path = path.expanduser()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(generate_latest(registry))
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write the metrics textfile {path}: "
                          f"{exc.strerror or exc}") from None
    return path


async def listen(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str, int]:
    """Serve ``app`` on host:port (0 picks a free port); returns the runner and where it
    listens. A port that cannot be bound is one ConfigError line."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    for addr in runner.addresses:
        if isinstance(addr, tuple):
            return runner, str(addr[0]), int(addr[1])
    return runner, host, port  # pragma: no cover - TCP sites always have an address


class MetricsServer:
    """``/metrics`` on 127.0.0.1:``port`` (0 picks a free one) for the run's lifetime."""

    def __init__(self, registry: CollectorRegistry, port: int) -> None:
        self._registry = registry
        self._port = port
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(self._registry),
                            headers={"Content-Type": content_type,
                                     "Cache-Control": "no-store"})

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner, _, self.port = await listen(app, HOST, self._port)
        return self.port

    @property
    def addresses(self) -> list[str]:
        if self._runner is None:
            return []
        return [str(a[0]) for a in self._runner.addresses if isinstance(a, tuple)]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
