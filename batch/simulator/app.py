"""The simulator's HTTP side: one lean aiohttp server per host:port, routing to providers.

Each provider is served at its ``base_url``; several providers may share a host:port when
their base URLs differ by path prefix (``http://127.0.0.1:9000/BANK000001``). Every server
also answers ``GET /_sim/stats[?detail=consents]`` and ``POST /_sim/reset`` (at the root and
under each prefix). Only 127.0.0.1 is ever bound.

The rules read the injected clock; the served latency is real time (``asyncio.sleep``, and
the loop's clock to measure it), since it is what a real client on a real socket waits for.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

from aiohttp import web

from batch.clock import Clock, SystemClock
from batch.config import Institutions
from batch.errors import ConfigError
from batch.routes import TOKEN_PATH
from batch.simulator.fleet import ProviderSim, build_fleet
from batch.simulator.scenario import Event, Scenario
from batch.simulator.stats import ProviderStats
from planning.windows import Window

LOOPBACK = ("127.0.0.1", "localhost")
_STATS, _RESET = "/_sim/stats", "/_sim/reset"
_LIST, _DETAIL, _TOKEN = 0, 1, 2
_JSON = "application/json"


def _address(base_url: str, org_code: str) -> tuple[int, str]:
    """(port, path prefix) of a provider's base_url; refuses anything but loopback."""
    parts = urlsplit(base_url)
    if parts.hostname not in LOOPBACK:
        raise ConfigError(f"the simulator serves only 127.0.0.1, not {parts.hostname!r}",
                          field=f"{org_code}.base_url")
    if parts.scheme != "http" or parts.port is None:
        raise ConfigError("the simulator needs an http:// base_url with an explicit port",
                          field=f"{org_code}.base_url")
    return parts.port, parts.path.rstrip("/")


class Simulator:
    """A fleet of simulated MyData providers, served on 127.0.0.1.

    ``async with Simulator(institutions, scenario, clock=clock) as sim:`` serves every
    provider at its base_url until the block ends; ``sim.stats()`` is what they saw.
    """

    def __init__(
        self,
        institutions: Institutions,
        scenario: Scenario | None = None,
        *,
        clock: Clock | None = None,
        window_override: Sequence[Window] | None = None,
        seed: int = 0,
    ) -> None:
        self.institutions = institutions
        self.scenario = scenario or Scenario()
        self.clock: Clock = clock or SystemClock()
        self.window_override = tuple(window_override) if window_override else None
        self.seed = seed
        self.total = ProviderStats()
        self.providers: dict[str, ProviderSim] = {}
        self._runners: dict[int, web.BaseRunner] = {}
        self._sites: dict[int, web.TCPSite] = {}
        self._tasks: list[asyncio.Task[None]] = []
        # per port: (method, path) -> (sim, kind); (method, head) -> sim for ids in the path
        self._exact: dict[int, dict[tuple[str, str], tuple[ProviderSim | None, int]]] = {}
        self._by_head: dict[int, dict[tuple[str, str], ProviderSim]] = {}
        self._ports: dict[int, set[str]] = {}
        for p in institutions.providers:
            port, prefix = _address(p.base_url, p.org_code)
            if prefix in self._ports.setdefault(port, set()):
                raise ConfigError(
                    f"shares host:port and path with another provider; give each a path "
                    f"prefix like http://127.0.0.1:{port}/{p.org_code}",
                    field=f"{p.org_code}.base_url")
            self._ports[port].add(prefix)

    @property
    def urls(self) -> dict[str, str]:
        return {p.org_code: p.base_url for p in self.institutions.providers}

    async def start(self) -> None:
        """Build the providers (clock time 0 of the timeline is now) and bind every port."""
        self.providers = build_fleet(
            self.institutions, self.scenario, clock=self.clock,
            window_override=self.window_override, seed=self.seed, total=self.total)
        for sim in self.providers.values():
            port, prefix = _address(sim.provider.base_url, sim.org)
            exact = self._exact.setdefault(port, {
                ("GET", _STATS): (None, -1), ("POST", _RESET): (None, -2)})
            heads = self._by_head.setdefault(port, {})
            r = sim.routes
            exact[("GET", prefix + r.list_path)] = (sim, _LIST)
            exact[("POST", prefix + TOKEN_PATH)] = (sim, _TOKEN)
            exact[("GET", prefix + _STATS)] = (None, -1)
            exact[("POST", prefix + _RESET)] = (None, -2)
            if "{id}" in r.detail_route:
                head = prefix + r.detail_route.split("{id}", 1)[0].rstrip("/")
                heads[(r.detail_method, head)] = sim
            else:
                exact[(r.detail_method, prefix + r.detail_route)] = (sim, _DETAIL)
        refusals = self._refusals()
        try:
            for port in self._exact:
                server = web.Server(self._make_handler(port), access_log=None)
                runner = web.ServerRunner(server, shutdown_timeout=1.0)
                await runner.setup()
                self._runners[port] = runner
                await self._listen(port)
        except OSError as exc:
            await self.stop()
            raise ConfigError(f"cannot listen on 127.0.0.1: {exc.strerror or exc}") from None
        t0 = self.clock.monotonic()
        self._tasks = [asyncio.create_task(self._refuse(port, t0 + ev.start, t0 + ev.end))
                       for port, ev in refusals]

    def _refusals(self) -> list[tuple[int, Event]]:
        """(port, event) for each ``down``/``refuse`` event; it must cover the whole port."""
        out = []
        for i, ev in enumerate(self.scenario.timeline):
            if ev.kind != "down" or ev.mode != "refuse":
                continue
            ports = {_address(p.base_url, p.org_code)[0] for p in self.institutions.providers
                     if ev.applies_to(p.org_code)}
            for port in sorted(ports):
                if ev.provider != "*" and len(self._ports[port]) > 1:
                    raise ConfigError(
                        f"mode 'refuse' closes port {port}, which other providers share; "
                        "use 'reset' or give the provider a port of its own",
                        field=f"timeline[{i}].mode")
                out.append((port, ev))
        return out

    async def _listen(self, port: int) -> None:
        site = web.TCPSite(self._runners[port], "127.0.0.1", port, backlog=1024,
                           reuse_address=True)
        await site.start()
        self._sites[port] = site

    async def _refuse(self, port: int, start: float, end: float) -> None:
        """Close the port's listener from ``start`` to ``end`` (the simulator's clock)."""
        await self.clock.sleep_until(start)
        site = self._sites.pop(port, None)
        if site is not None:
            await site.stop()
        await self.clock.sleep_until(end)
        if port not in self._sites and port in self._runners:
            await self._listen(port)

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        runners, self._runners = self._runners, {}
        self._sites.clear()
        for runner in runners.values():
            await runner.cleanup()

    async def __aenter__(self) -> Simulator:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def stats(self, *, detail: bool = False) -> dict[str, Any]:
        """The stats JSON: per provider and total; ``detail`` adds transfers per consent."""
        out: dict[str, Any] = {
            "providers": {org: sim.stats.snapshot() for org, sim in self.providers.items()},
            "total": self.total.snapshot(),
            # the timeline's time 0 on the simulator's monotonic clock (a scaled clock's
            # monotonic agrees across processes: tests place an outage on their own clock)
            "timeline_t0": min((sim.started_at for sim in self.providers.values()),
                               default=None),
        }
        if detail:
            out["consents"] = {org: sim.consents() for org, sim in self.providers.items()}
        return out

    def reset(self) -> None:
        """Clear every counter and the rule state (transfers, ids seen, buckets)."""
        self.total.reset()
        for sim in self.providers.values():
            sim.reset()

    # -- serving -------------------------------------------------------------------------
    def _make_handler(self, port: int) -> Any:
        exact = self._exact[port]
        heads = self._by_head[port]
        loop_time = asyncio.get_running_loop().time

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            method, path = request.method, request.path
            target = exact.get((method, path))
            item_id: str | None = None
            if target is None:
                # the id is one percent-encoded segment (routes.detail_path): split the
                # path as sent, then decode the id
                head, _, tail = request.raw_path.partition("?")[0].rpartition("/")
                head, tail = unquote(head), unquote(tail)
                sim_by_head = heads.get((method, head))
                if sim_by_head is None or not tail:
                    return _json(404, {"rsp_code": "40001", "rsp_msg": "no such route"},
                                 request.headers.get("x-api-tran-id"))
                target = (sim_by_head, _DETAIL)
                item_id = tail
            sim, kind = target
            if sim is None:
                return await self._admin(request, kind)
            headers = request.headers
            label = (sim.list_label, sim.detail_label, sim.token_label)[kind]
            sim.begin(label, headers.get("x-api-type"))
            started = loop_time()
            code = "reset"
            try:
                if kind == _TOKEN:
                    form = await _form(request)
                    reply = sim.refresh(form, headers)
                else:
                    if kind == _DETAIL and item_id is None:
                        item_id = await _body_id(request, sim.routes.id_key)
                    reply = sim.call(kind == _DETAIL, headers, request.query, item_id)
                if reply.delay > 0:
                    await asyncio.sleep(reply.delay)
                if reply.reset:
                    _reset_connection(request)
                    return web.Response(status=500)
                code = reply.code
                return _json(reply.status, reply.body, headers.get("x-api-tran-id"))
            finally:
                sim.end(code, (loop_time() - started) * 1000.0)

        return handle

    async def _admin(self, request: web.BaseRequest, kind: int) -> web.StreamResponse:
        if kind == -1:
            detail = request.query.get("detail") == "consents"
            return _json(200, self.stats(detail=detail), None)
        self.reset()
        return _json(200, {"rsp_code": "00000", "rsp_msg": "reset"}, None)


def _json(status: int, body: dict[str, Any] | None, tran: str | None) -> web.Response:
    headers = {"x-api-tran-id": tran} if tran is not None else None
    return web.Response(status=status, body=json.dumps(body, separators=(",", ":")).encode(),
                        content_type=_JSON, headers=headers)


def _reset_connection(request: web.BaseRequest) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


async def _form(request: web.BaseRequest) -> dict[str, str]:
    """A token request body: form-encoded or JSON."""
    try:
        if request.content_type == _JSON:
            raw = await request.json()
            return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        return {k: str(v) for k, v in (await request.post()).items()}
    except ValueError:
        return {}


async def _body_id(request: web.BaseRequest, id_key: str) -> str | None:
    """The item id in a POST detail call's JSON body (None if absent or malformed)."""
    try:
        raw = await request.json()
    except ValueError:
        return None
    value = raw.get(id_key) if isinstance(raw, dict) else None
    return str(value) if isinstance(value, str | int) and str(value) else None
