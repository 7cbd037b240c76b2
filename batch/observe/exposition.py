"""Where the metrics go: a textfile for the node exporter, and a port on 127.0.0.1.

The textfile is the usual way to monitor a cron job that exits: written atomically (a
temporary file in the same directory, then a rename), in the Prometheus text format the
node exporter's textfile collector reads (no exemplars: that format has none). The port
serves ``/metrics`` on loopback while the run lasts; a scraper asking for OpenMetrics
(``Accept: application/openmetrics-text``) gets the exemplars too.

Both are encoded by :func:`render` a few hundred samples per turn of the event loop: with
300 providers the registry holds about 31,000 samples (2.3 MB of text), which
prometheus_client's encoders turned out in one 130 ms step, every provider's 100 ms slices
late by as much, at every scrape and every minute's textfile.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from aiohttp import web
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from batch.errors import ConfigError

HOST = "127.0.0.1"


#: seconds a server's stop waits for the requests it is still answering
SHUTDOWN_SECONDS = 2.0

#: samples encoded between two turns of the event loop (about 2 ms of the encoder's time)
RENDER_CHUNK = 500

Encoder = Callable[[CollectorRegistry], bytes]


class _Families:
    """What an encoder reads of a registry (``collect()``), holding just these families."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


async def render(registry: CollectorRegistry, encoder: Encoder = generate_latest, *,
                 chunk: int = RENDER_CHUNK) -> bytes:
    """``encoder(registry)``, byte for byte, giving the loop a turn every ``chunk`` samples.

    A family is encoded in parts of at most ``chunk`` samples, each by ``encoder`` itself
    (its escaping, number format and exemplars); a part after the first drops the family's
    ``# HELP``/``# TYPE``/``# UNIT`` lines, and every part the format's trailer (OpenMetrics'
    ``# EOF``), which is written once at the end."""
    trailer = encoder(_Families(()))  # type: ignore[arg-type]
    out: list[bytes] = []
    since_turn = 0
    for family in registry.collect():
        samples = family.samples
        if len(samples) >= chunk:  # building it was a step of its own (about 5 ms at most)
            since_turn = 0
            await asyncio.sleep(0)
        for i in range(0, max(1, len(samples)), chunk):
            part = Metric(family.name, family.documentation, family.type, family.unit)
            part.samples = samples[i:i + chunk]
            text = encoder(_Families((part,)))  # type: ignore[arg-type]
            if trailer:
                text = text.removesuffix(trailer)
            if i:
                lines = text.split(b"\n")
                k = 0
                while k < len(lines) and lines[k].startswith(b"# "):
                    k += 1
                text = b"\n".join(lines[k:])
            out.append(text)
            since_turn += len(part.samples) + 1
            if since_turn >= chunk:
                since_turn = 0
                await asyncio.sleep(0)
    out.append(trailer)
    return b"".join(out)


def write_textfile(registry: CollectorRegistry, path: Path, *, body: bytes | None = None
                   ) -> Path:
    """Write the registry (or ``body``, its :func:`render` already made) to ``path``
    atomically; a reader never sees half a file."""
    path = path.expanduser()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(generate_latest(registry) if body is None else body)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write the metrics textfile {path}: "
                          f"{exc.strerror or exc}") from None
    return path


async def listen(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str, int]:
    """Serve ``app`` on host:port (0 picks a free port); returns the runner and where it
    listens. A port that cannot be bound is one ConfigError line."""
    # a stop (Ctrl-C, the run's end) waits at most SHUTDOWN_SECONDS for requests still being
    # answered, not aiohttp's default 60 s
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_SECONDS)
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
        return web.Response(body=await render(self._registry, encoder),
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
