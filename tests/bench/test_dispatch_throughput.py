"""``run`` against the simulator, beside a bare aiohttp loop making the same calls, one run.

Run: ``pytest -s tests/bench/test_dispatch_throughput.py``. The simulator runs in its own
subprocess (latency 0, one item per consent, no rate or concurrency rule in the way), so it
never shares the client's core. In order:

(a) a bare aiohttp loop: per refresh the list call then the detail call with the same
    paths, parameters and headers as ``MydataClient`` (new token and tran id each), as fast
    as it can, at concurrency 50 and 200; the better of the two is the baseline;
(a2) the same loop through ``make_http_client`` (the httpx API over the aiohttp transport,
    as the product calls), no chain, no database: what the HTTP layer alone costs;
(a3) the same loop sending exactly as the product sends: ``MydataClient.refresh`` (its
    request building, its transport call, its response reading and classification) over a
    pass-through chain, no chain layers, no database: the floor of our HTTP layer;
(b) ``run_day`` with the full chain, the producer's claims and the batched outcome writes,
    on SQLite and on PostgreSQL, offered a one-minute plan a little above (a2) (our path
    cannot beat its own HTTP layer) so it saturates without a backlog that takes minutes to
    drain; what it cannot start in the minute is deferred, as in a real run; calls/s =
    calls / (first start .. last finish), ratio to (a), (a2) and (a3) (goal >= 0.8x (a3)).
    Every row also gives this process's CPU time a call, and (b) the least of (a3)'s over
    its own: the goal's ratio as cost rather than rate. Neither is steady on a shared
    2-CPU machine (2026-12-03, three runs: (a3) 1,645-2,503 calls/s, 396-621 us a call;
    the simulator's process shares the cores), so (a3) runs again after each (b) row, and
    each row is also set against the mean of the (a3) runs just before and after it
    ("around"). Under the table, who used the cores during each row (tests/bench/cpu.py):
    the loop's thread, this process, the simulator and PostgreSQL's server, each as a
    share of one core: a row measures the client's cost only if its loop was busy;
(c) ``run_day`` paced at a planned 500 calls/s for two minutes: slice-start lateness p50/p99
    and missed slices (goal p99 < 5 ms, none missed);
(d) from the same run, refreshes done per minute (from ``call_outcomes``) against the plan
    (goal within 1% with healthy providers).

Time is real: the run's clock is a ``ScaledClock`` at speed 1, which only moves the wall
clock so a planned minute starts 3 s after the clock is made (no waiting for the next real
minute); seconds are real seconds, so calls/s and lateness are not distorted. The plan is
saved per minute (``plan_minutes``) inside a six-hour window rather than passed as a
window override: with an override the window would end with the planned minutes, and a
window's last minute is squeezed into 50 s (finish margin), which would plan 600 calls/s
instead of 500 in (c).
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import textwrap
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.client import MydataClient, make_http_client
from batch.clock import KST, ScaledClock, SystemClock
from batch.config import Institutions, load_institutions
from batch.db import schema
from batch.db.engine import init_db, make_engine
from batch.db.loaders import load_institutions as store_institutions
from batch.dispatch.runner import RunOptions, run_day
from batch.resilience.chain import Attempt
from batch.resilience.outcomes import Outcome
from batch.simulator import SimulatorProcess
from batch.tranid import TranIdGenerator
from planning.calendar import week_start
from tests.bench.cpu import Shares, shares
from tests.bench.loop_steps import loop_steps
from tests.conftest import PG_ADMIN_URL, _admin
from tests.integration.helpers import free_ports
from tests.sealing import CIPHER, seal

PROVIDERS = int(os.environ.get("DISPATCH_BENCH_PROVIDERS", "4"))
BARE_SECONDS = float(os.environ.get("DISPATCH_BENCH_BARE_SECONDS", "5"))
BARE_CONCURRENCY = (50, 200)
#: the saturation plan offers this much more than the bare loop did
OVERLOAD = float(os.environ.get("DISPATCH_BENCH_OVERLOAD", "1.1"))
#: comma-separated; empty skips the case
SAT_BACKENDS = tuple(b for b in os.environ.get("DISPATCH_BENCH_BACKENDS",
                                               "sqlite,postgresql").split(",") if b)
#: (b)'s rows again, this many rounds of every backend in turn, (a3) between each: one run
#: then gives each backend's median ratio over its rounds (the machine's speed swings a
#: tenth or more between rows: one row is one draw)
SAT_ROUNDS = int(os.environ.get("DISPATCH_BENCH_ROUNDS", "1"))
PACED_BACKENDS = tuple(b for b in os.environ.get("DISPATCH_BENCH_PACED_BACKENDS",
                                                 "postgresql").split(",") if b)
PACED_CALLS_PER_SECOND = 500
PACED_MINUTES = int(os.environ.get("DISPATCH_BENCH_PACED_MINUTES", "2"))
#: time the paced run's event-loop steps (tests/bench/loop_steps.py): where its lateness
#: comes from, wall time against this thread's CPU
STEPS = os.environ.get("BENCH_STEPS") == "1"
CALLS_PER_REFRESH = 2  # list (one page) + one detail: the scenario gives one item each

DAY = date(2026, 11, 30)
WEEK = week_start(DAY)
FIRST_MINUTE = 60  # 01:00 KST
_COUNTER = itertools.count()


def _institutions_toml(ports: list[int]) -> str:
    lines = ['operator_org_code = "OPERATOR01"']
    for i, port in enumerate(ports):
        lines += [
            "[[providers]]",
            f'org_code = "BANK{i:06d}"',
            'industry = "bank"',
            f'base_url = "http://127.0.0.1:{port}"',
            'windows = ["0100:0700"]',
            # no limiter, no cap from the provider's rate: the plan alone sets the pace
            "calls_per_second = 1000000",
            # The product's default: at most 20 refreshes under way a provider (the
            # dispatcher's in-flight cap, its starts waiting for room as refreshes end),
            # 80 in all, near (a3)'s best concurrency. Calls through the same HTTP layer
            # cost more CPU the more are under way (2026-12-06, (a3)'s loop by hand, three
            # rounds: 50 workers on 50 connections 158-175 us a call, 200 on 200 178-190,
            # 400 on 200 199-222); until then a provider started at most its cap a slice,
            # so this was 100 (400 under way on 200 connections) for the run to saturate.
            "max_concurrency = 20",
            "read_timeout = 60",
            "call_deadline = 600",
            "[providers.bulkhead]",
            "max_wait = 600.0",
        ]
    return "\n".join(lines) + "\n"


@dataclass
class Setup:
    path: Path
    insts: Institutions
    sim: SimulatorProcess


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    path = tmp_path / "institutions.toml"
    path.write_text(_institutions_toml(free_ports(PROVIDERS)))
    scen = tmp_path / "scenario.toml"
    scen.write_text("[defaults]\nlatency_median_ms = 0\nitems_min = 1\nitems_max = 1\n")
    with SimulatorProcess(path, scenario_path=scen, window_override=["0000:2359"]) as sim:
        yield Setup(path, load_institutions(path), sim)


# -- (a) the bare loop -----------------------------------------------------------------


async def bare_loop(bases: list[tuple[str, str]], concurrency: int,
                    seconds: float) -> tuple[int, int]:
    """(calls, calls answered 00000): refreshes as MydataClient makes them, bank industry."""
    calls = ok = 0
    deadline = time.monotonic() + seconds

    async def worker(session: aiohttp.ClientSession, base: str, org: str) -> None:
        nonlocal calls, ok
        while time.monotonic() < deadline:
            n = next(_COUNTER)
            h = {"Authorization": f"Bearer bare-{n}",
                 "x-api-tran-id": f"OPERATOR01B{2 * n:014d}", "x-api-type": "scheduled"}
            async with session.get(f"{base}/v1/bank/accounts", headers=h, params={
                    "org_code": org, "search_timestamp": "0", "limit": "500"}) as r:
                body = await r.json(content_type=None)
            calls += 1
            ok += body["rsp_code"] == "00000"
            items = [a["account_num"] for a in body.get("account_list") or []]
            for item in items:
                h = dict(h, **{"x-api-tran-id": f"OPERATOR01B{2 * n + 1:014d}"})
                async with session.post(f"{base}/v1/bank/accounts/deposit/basic", headers=h,
                                        json={"org_code": org, "account_num": item,
                                              "search_timestamp": 0}) as r:
                    body = await r.json(content_type=None)
                calls += 1
                ok += body["rsp_code"] == "00000"

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        await asyncio.gather(*(worker(s, *bases[i % len(bases)]) for i in range(concurrency)))
    return calls, ok


async def httpx_loop(bases: list[tuple[str, str]], concurrency: int,
                     seconds: float) -> tuple[int, int]:
    """The same loop through ``make_http_client`` (httpx over aiohttp), no chain, no DB."""
    calls = ok = 0
    deadline = time.monotonic() + seconds

    async def worker(http: httpx.AsyncClient, base: str, org: str) -> None:
        nonlocal calls, ok
        while time.monotonic() < deadline:
            n = next(_COUNTER)
            h = {"Authorization": f"Bearer httpx-{n}",
                 "x-api-tran-id": f"OPERATOR01H{2 * n:014d}", "x-api-type": "scheduled"}
            r = await http.get(f"{base}/v1/bank/accounts", headers=h, params={
                "org_code": org, "search_timestamp": 0, "limit": 500})
            body = json.loads(r.content)
            calls += 1
            ok += body["rsp_code"] == "00000"
            for item in [a["account_num"] for a in body.get("account_list") or []]:
                h = dict(h, **{"x-api-tran-id": f"OPERATOR01H{2 * n + 1:014d}"})
                r = await http.post(f"{base}/v1/bank/accounts/deposit/basic", headers=h,
                                    json={"org_code": org, "account_num": item,
                                          "search_timestamp": 0})
                calls += 1
                ok += json.loads(r.content)["rsp_code"] == "00000"

    async with make_http_client(max_connections=concurrency) as http:
        await asyncio.gather(*(worker(http, *bases[i % len(bases)])
                               for i in range(concurrency)))
    return calls, ok


class _PassThrough:
    """A chain with no layers: one attempt, the call's timeout as its only argument."""

    async def call(self, attempt: Attempt, *, deadline: float | None = None) -> Outcome:
        return await attempt(60.0)


async def client_loop(insts: Institutions, concurrency: int, seconds: float, *,
                      transport: httpx.AsyncBaseTransport | None = None,
                      work: Callable[[], object] | None = None) -> tuple[int, int]:
    """(a3): refreshes through ``MydataClient`` exactly as the product sends them (request
    building, transport call, response reading, classification), no chain, no DB
    (``transport``: another one than the product's, e.g. an in-process one; ``work``: run
    once a call made, between the refreshes: tests/bench/test_interleave_cost.py)."""
    calls = ok = 0
    deadline = time.monotonic() + seconds
    clock = SystemClock()
    tran_ids = TranIdGenerator("OPERATOR01", node_id=7)

    async def worker(client: MydataClient) -> None:
        nonlocal calls, ok
        while time.monotonic() < deadline:
            n = next(_COUNTER)
            r = await client.refresh(access_token=f"a3-{n}", refresh_token=None)
            calls += r.calls
            ok += r.calls if r.outcome.ok else 0
            if work is not None:
                for _ in range(r.calls):
                    work()

    async with make_http_client(max_connections=concurrency, transport=transport) as http:
        clients = [MydataClient(p, http=http, chain=_PassThrough(), tran_ids=tran_ids,
                                clock=clock) for p in insts.providers]
        await asyncio.gather(*(worker(clients[i % len(clients)])
                               for i in range(concurrency)))
    return calls, ok


# A bare 100 ms ticker in its own process during the paced run: how late an idle asyncio
# loop wakes on this machine at the same time (the noise floor our lateness sits on).
TICKER = textwrap.dedent("""
    import asyncio, json, sys, time
    async def main(seconds):
        late = []
        t0 = time.monotonic() + 0.1
        for k in range(int(seconds * 10)):
            d = t0 + k * 0.1
            delay = d - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            late.append(time.monotonic() - d)
        late.sort()
        pick = lambda q: late[max(0, min(len(late) - 1, int(q * len(late) + 0.999) - 1))]
        print(json.dumps({"p50": pick(0.5) * 1e3, "p99": pick(0.99) * 1e3,
                          "max": late[-1] * 1e3, "missed": sum(x >= 0.1 for x in late)}))
    asyncio.run(main(float(sys.argv[1])))
""")


# -- (b)-(d) the full path -------------------------------------------------------------


async def _prepare(url: str, insts: Institutions, plan: dict[int, int]) -> AsyncEngine:
    """A fresh database: the providers, sum(plan) due consents each, the plan per minute."""
    engine = make_engine(url)
    await init_db(engine)
    now = datetime(2026, 11, 30, 0, 50, tzinfo=KST)
    await store_institutions(engine, insts, now=now)
    per_provider = sum(plan.values())
    async with engine.begin() as conn:
        for p in insts.providers:
            for lo in range(0, per_provider, 20_000):
                await conn.execute(insert(schema.consents), [
                    {"user_id": f"u{i}", "org_code": p.org_code,
                     "access_token": seal(f"tok-{p.org_code}-{i}", p.org_code, f"u{i}"),
                     "refresh_token": seal(f"r-{i}", p.org_code, f"u{i}", "refresh_token"),
                     "consented_at": now - timedelta(days=40),
                     "last_scheduled_at": now - timedelta(days=7), "due_week": WEEK,
                     "not_before": now - timedelta(days=40), "updated_at": now}
                    for i in range(lo, min(per_provider, lo + 20_000))])
            await conn.execute(insert(schema.plan_days).values(
                org_code=p.org_code, day=DAY, week_start=WEEK, forecast_user_calls=0,
                batch_quota=per_provider, capacity=10**9, unplaceable=0, created_at=now))
            await conn.execute(insert(schema.plan_minutes), [
                {"org_code": p.org_code, "day": DAY, "minute": m, "target": n}
                for m, n in plan.items()])
    return engine


@dataclass
class RunFigures:
    summary: dict[str, Any]
    calls: int
    seconds: float  # first refresh start .. last finish
    done_per_minute: dict[str, dict[int, int]]
    lateness_ms: tuple[float, float, float]  # p50, p99, max over every provider's slices
    slices: int
    missed: int
    started_error: float  # planned vs started, the dispatcher's own count
    elapsed_total: float
    cpu: float = 0.0  # this process's CPU seconds in run_day (its database threads too)
    shares: Shares | None = None  # who used the cores during run_day

    @property
    def cpu_us_per_call(self) -> float:
        return 1e6 * self.cpu / self.calls if self.calls else 0.0

    @property
    def calls_per_second(self) -> float:
        return self.calls / self.seconds if self.seconds > 0 else 0.0


async def _run(url: str, insts: Institutions, plan: dict[int, int],
               steps: list[str] | None = None, *, sim_pid: int | None = None) -> RunFigures:
    """``steps``: given, run_day's loop steps are timed (loop_steps.py) and reported there;
    ``sim_pid``: the simulator's process, for its share of the cores."""
    engine = await _prepare(url, insts, plan)
    try:
        start = datetime(2026, 11, 30, 0, 59, 57, tzinfo=KST)
        clock = ScaledClock(1.0, start=start)  # speed 1: real seconds, shifted wall clock
        t0, c0 = time.monotonic(), time.process_time()
        with loop_steps() if steps is not None else nullcontext() as probe, \
                shares(sim_pid) as used:
            res = await run_day(engine, cipher=CIPHER, clock=clock, options=RunOptions(
                progress="none", lease=timedelta(minutes=10)), stream=io.StringIO(),
                install_signals=False)
        cpu = time.process_time() - c0
        if probe is not None and steps is not None:
            steps += probe.report()
        elapsed_total = time.monotonic() - t0
        provs = res.summary.to_json()["providers"]
        assert res.summary.totals["not_attempted"] == 0, res.summary.totals
        async with engine.connect() as conn:
            rows = (await conn.execute(select(
                schema.call_outcomes.c.org_code, schema.call_outcomes.c.action,
                schema.call_outcomes.c.calls, schema.call_outcomes.c.at,
                schema.call_outcomes.c.elapsed_ms))).all()
    finally:
        await engine.dispose()
    midnight = datetime(2026, 11, 30, tzinfo=KST)
    done: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    starts, ends = [], []
    for org, action, _calls, at, elapsed_ms in rows:
        ends.append(at)
        starts.append(at - timedelta(milliseconds=elapsed_ms))
        if action == "done":
            done[str(org).strip()][int((at - midnight).total_seconds() // 60)] += 1
    seconds = (max(ends) - min(starts)).total_seconds() if rows else 0.0
    # the summary gives percentiles per provider; the worst provider is what we report
    p50 = max(p["slice_lateness_ms"]["p50"] for p in provs)
    p99 = max(p["slice_lateness_ms"]["p99"] for p in provs)
    mx = max(p["slice_lateness_ms"]["max"] for p in provs)
    err = max(p["planned_vs_started_error"] for p in provs)
    return RunFigures(res.summary.to_json(), sum(int(p["calls"]) for p in provs), seconds,
                      {k: dict(v) for k, v in done.items()}, (p50, p99, mx),
                      sum(int(p["slices"]) for p in provs),
                      sum(int(p["missed_slices"]) for p in provs), err, elapsed_total, cpu,
                      used)


def _minute_errors(fig: RunFigures, plan: dict[int, int]) -> list[float]:
    """|done - planned| / planned per provider and planned minute."""
    out = []
    for org_done in fig.done_per_minute.values():
        for m, n in plan.items():
            out.append(abs(org_done.get(m, 0) - n) / n)
    return out


@pytest.fixture
def fresh_db(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """fresh_db("sqlite"|"postgresql") -> the URL of a new empty database; all dropped after."""
    made: list[str] = []

    def make(backend: str) -> str:
        name = f"mydata_b_{uuid.uuid4().hex[:12]}"
        if backend == "sqlite":
            return f"sqlite+aiosqlite:///{tmp_path / name}.db"
        if backend != "postgresql":
            raise ValueError(f"unknown backend {backend!r}")
        try:
            asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
        except Exception as exc:
            pytest.skip(f"PostgreSQL unavailable: {exc}")
        made.append(name)
        return f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"

    try:
        yield make
    finally:
        for name in made:
            asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.mark.timeout(1200)
def test_dispatch_throughput_lateness_and_plan_error(
    setup: Setup, fresh_db: Callable[[str], str],
) -> None:
    sim, insts = setup.sim, setup.insts
    bases = [(p.base_url, p.org_code) for p in insts.providers]
    cpus = os.cpu_count()

    # (a) the bare loop ---------------------------------------------------------------
    asyncio.run(bare_loop(bases, 20, 1.0))  # warm up both sides
    cpu_per_call: dict[tuple[str, int], float] = {}  # (row, concurrency) -> CPU us a call

    def loop_rates(row: str, make: Callable[[int], Any]) -> dict[int, float]:
        rates = {}
        for conc in BARE_CONCURRENCY:
            c0 = time.process_time()
            calls, ok = asyncio.run(make(conc))
            cpu_per_call[row, conc] = 1e6 * (time.process_time() - c0) / max(1, calls)
            assert ok == calls, (ok, calls)
            rates[conc] = calls / BARE_SECONDS
        return rates

    bare = loop_rates("a", lambda conc: bare_loop(bases, conc, BARE_SECONDS))
    base_rate = max(bare.values())
    via_httpx = loop_rates("a2", lambda conc: httpx_loop(bases, conc, BARE_SECONDS))
    httpx_rate = max(via_httpx.values())
    via_client = loop_rates("a3", lambda conc: client_loop(insts, conc, BARE_SECONDS))
    client_rate = max(via_client.values())
    # CPU a call, which time taken by other processes does not move: the least of each row
    cpu_a, cpu_a2, cpu_a3 = (min(v for (r, _), v in cpu_per_call.items() if r == row)
                             for row in ("a", "a2", "a3"))
    sim.reset()

    # (b) saturation --------------------------------------------------------------------
    # Offered: a little above what the HTTP layer alone does (our path cannot beat it), so
    # the run saturates without a backlog that takes minutes to drain.
    # Each row is offered OVERLOAD times the faster of that and the (a3) run just before it:
    # a machine that sped up after the first rows (2026-12-07: (a3) 6,277 calls/s, then
    # 9,234 for the rest of the run) left a row offered less than it could start, and its
    # ratio then measured the plan, not our cost.
    floor_rate = max(httpx_rate, client_rate)
    offered: dict[str, list[int]] = defaultdict(list)  # refreshes a provider, per round
    sat: list[tuple[str, RunFigures]] = []  # every row, in the order run
    problems: list[str] = []  # checked after the table is printed
    # (a3) again after each (b) run, at its best concurrency: each (b) row is also set
    # against the mean of the (a3) runs just before and just after it, since the machine's
    # speed drifts over the minutes between them (2026-12-04, two runs of this bench an hour
    # apart: (a3) 4,334 and 3,586 calls/s, (b) against it 0.67-0.75x in one, 0.96-1.02x in
    # the other)
    best_conc = max(via_client, key=via_client.__getitem__)
    around: list[tuple[float, float]] = [(client_rate, cpu_per_call["a3", best_conc])]
    for backend in [b for _ in range(SAT_ROUNDS) for b in SAT_BACKENDS]:
        offered[backend].append(math.ceil(OVERLOAD * max(floor_rate, around[-1][0]) * 60
                                          / CALLS_PER_REFRESH / PROVIDERS))
        fig = asyncio.run(_run(fresh_db(backend), insts, {FIRST_MINUTE: offered[backend][-1]},
                               sim_pid=sim.pid))
        stats = sim.stats()
        sim.reset()
        c0 = time.process_time()
        calls, ok = asyncio.run(client_loop(insts, best_conc, BARE_SECONDS))
        assert ok == calls, (ok, calls)
        around.append((calls / BARE_SECONDS,
                       1e6 * (time.process_time() - c0) / max(1, calls)))
        sim.reset()
        totals = fig.summary["totals"]
        # saturated: what could not be started in the minute is deferred, never failed
        problems += [f"{backend} saturation: {totals}"] if totals["failed"] or \
            totals["succeeded"] != totals["attempted"] else []
        problems += [f"{backend}: simulator saw {stats['total']['calls']} calls, run counted "
                     f"{fig.calls}"] if stats["total"]["calls"] != fig.calls else []
        sat.append((backend, fig))

    # (c)+(d) paced at 500 calls/s ----------------------------------------------------
    per_minute = PACED_CALLS_PER_SECOND * 60 // CALLS_PER_REFRESH // PROVIDERS
    paced_plan = {FIRST_MINUTE + k: per_minute for k in range(PACED_MINUTES)}
    paced: dict[str, tuple[RunFigures, dict[str, Any], dict[str, float]]] = {}
    step_reports: dict[str, list[str]] = {}
    for backend in PACED_BACKENDS:
        url = fresh_db(backend)
        ticker = subprocess.Popen([sys.executable, "-c", TICKER, str(PACED_MINUTES * 60)],
                                  stdout=subprocess.PIPE, text=True)
        step_reports[backend] = []
        fig = asyncio.run(_run(url, insts, paced_plan, step_reports[backend] if STEPS
                               else None))
        idle = json.loads(ticker.communicate(timeout=120)[0])
        stats = sim.stats()
        sim.reset()
        paced[backend] = (fig, stats, idle)
        totals = fig.summary["totals"]
        problems += [f"{backend} paced: {totals}"] if totals["failed"] or totals["deferred"] \
            or totals["succeeded"] != totals["attempted"] else []

    # the table -------------------------------------------------------------------------
    print(f"\n== dispatch benchmark: {PROVIDERS} bank providers on one simulator process "
          f"(latency 0, 1 item), client in this process, {cpus} CPUs ==")
    print("(a) bare aiohttp loop, list + detail per refresh, same headers, "
          f"{BARE_SECONDS:g} s each:")
    for conc, rate in bare.items():
        print(f"    concurrency {conc:>4}: {rate:>8,.0f} calls/s  "
              f"{cpu_per_call['a', conc]:>6.0f} us CPU a call")
    print(f"    baseline (best): {base_rate:,.0f} calls/s")
    print("(a2) the same loop through make_http_client (httpx API over the aiohttp transport), "
          "no chain, no database:")
    for conc, rate in via_httpx.items():
        print(f"    concurrency {conc:>4}: {rate:>8,.0f} calls/s  "
              f"{cpu_per_call['a2', conc]:>6.0f} us CPU a call  "
              f"({rate / base_rate:.2f}x the baseline)")
    print("(a3) the same loop sending exactly as the product sends (MydataClient.refresh "
          "over a pass-through chain: request building, transport call, response reading), "
          "no chain, no database:")
    for conc, rate in via_client.items():
        print(f"    concurrency {conc:>4}: {rate:>8,.0f} calls/s  "
              f"{cpu_per_call['a3', conc]:>6.0f} us CPU a call  "
              f"({rate / base_rate:.2f}x the baseline, {rate / httpx_rate:.2f}x (a2))")
    print(f"(b) run_day, full chain + claims + batched writes, each row planned "
          f"{OVERLOAD:g}x the best of (a2), (a3) and the (a3) just before it in one minute ("
          + ", ".join(f"{b} {'/'.join(f'{n:,}' for n in ns)}" for b, ns in offered.items())
          + " refreshes/provider); goal >= 0.8x (a3):")
    print(f"    {'backend':<11}{'calls':>9}{'seconds':>9}{'calls/s':>10}{'vs (a)':>9}"
          f"{'vs (a2)':>9}{'vs (a3)':>9}"
          f"{'done':>9}{'deferred':>9}{'late p50':>10}{'p99 ms':>8}{'missed':>8}"
          f"{'CPU us':>8}{'(a3)/ours':>10}{'around: vs (a3)':>17}{'(a3)/ours':>10}")
    around_ratios: dict[str, list[tuple[float, float, float, float]]] = defaultdict(list)
    for k, (backend, fig) in enumerate(sat):
        t = fig.summary["totals"]
        (r0, u0), (r1, u1) = around[k], around[k + 1]
        # vs (a3), (a3)/ours, and both against the (a3) runs around the row
        ratios = (fig.calls_per_second / client_rate, cpu_a3 / fig.cpu_us_per_call,
                  fig.calls_per_second / ((r0 + r1) / 2), (u0 + u1) / 2 / fig.cpu_us_per_call)
        around_ratios[backend].append(ratios)
        print(f"    {backend:<11}{fig.calls:>9,}{fig.seconds:>9.1f}"
              f"{fig.calls_per_second:>10,.0f}{fig.calls_per_second / base_rate:>9.2f}"
              f"{fig.calls_per_second / httpx_rate:>9.2f}{ratios[0]:>9.2f}"
              f"{t['succeeded']:>9,}{t['deferred']:>9,}"
              f"{fig.lateness_ms[0]:>10.2f}{fig.lateness_ms[1]:>8.2f}{fig.missed:>8}"
              f"{fig.cpu_us_per_call:>8.0f}{ratios[1]:>10.2f}{ratios[2]:>17.2f}"
              f"{ratios[3]:>10.2f}")
    if SAT_ROUNDS > 1:  # one row is one draw of the machine's speed: the medians
        for backend, rs in around_ratios.items():
            med = [statistics.median(r[i] for r in rs) for i in range(4)]
            print(f"    {backend:<11}median of {len(rs)} rounds: vs (a3) {med[0]:.2f}, "
                  f"(a3)/ours {med[1]:.2f}; around: vs (a3) {med[2]:.2f}, (a3)/ours "
                  f"{med[3]:.2f} (each round's: "
                  + ", ".join(f"{r[2]:.2f}" for r in rs) + ")")
    print(f"    around: against the mean of the (a3) runs just before and just after the row, at "
          f"concurrency {best_conc} (the machine drifts between them): "
          + " -> ".join(f"{r:,.0f} calls/s {c:.0f} us" for r, c in around))
    print("    (saturated: the minute offered more than the loop could start; what was not "
          "started is deferred, as a real run would)")
    for backend, fig in sat:
        if not fig.summary["totals"]["deferred"]:
            print(f"    !!! {backend} started all it was offered: not saturated, its ratios "
                  "are floors (raise DISPATCH_BENCH_OVERLOAD)")
    for backend, fig in sat:  # a row is the client's cost only if its loop was busy
        if fig.shares is not None:
            print(f"    {backend} cores, run_day (3 s before its minute included): "
                  f"{fig.shares.line()}")
    print(f"    CPU us: this process's CPU time a call (run_day, its database threads "
          f"included); (a3)/ours: the least of (a3)'s, {cpu_a3:.0f} us, over ours, the "
          f"goal's ratio as cost ((a) {cpu_a:.0f} us, (a2) {cpu_a2:.0f} us)")
    print(f"(c) run_day paced at {PACED_CALLS_PER_SECOND} calls/s planned "
          f"({per_minute:,} refreshes/provider/minute x {PROVIDERS} x {CALLS_PER_REFRESH} "
          f"calls, {PACED_MINUTES} minutes):")
    print(f"    {'backend':<11}{'calls/s':>9}{'slices':>8}{'late p50':>10}{'p99':>7}"
          f"{'max ms':>8}{'missed':>8}   goal p99 < 5 ms, 0 missed")
    for backend, (fig, stats, idle) in paced.items():
        active = PACED_MINUTES * 60
        print(f"    {backend:<11}{fig.calls / active:>9,.0f}{fig.slices:>8,}"
              f"{fig.lateness_ms[0]:>10.2f}{fig.lateness_ms[1]:>7.2f}"
              f"{fig.lateness_ms[2]:>8.2f}{fig.missed:>8}"
              f"   (simulator peak_1s {stats['total']['peak_1s']})")
        print(f"    {'idle ticker':<11}{'':>9}{PACED_MINUTES * 600:>8,}{idle['p50']:>10.2f}"
              f"{idle['p99']:>7.2f}{idle['max']:>8.2f}{idle['missed']:>8}"
              "   (a bare asyncio loop in its own process at the same time: the noise floor)")
    for backend, lines in step_reports.items():  # BENCH_STEPS=1 (the probe slows it)
        if lines:
            print(f"    {backend}, " + "\n      ".join(lines))
    print("(d) planned vs done per minute (done = outcomes 'done' finishing in the minute), "
          "goal within 1%:")
    for backend, (fig, _, _) in paced.items():
        errs = _minute_errors(fig, paced_plan)
        print(f"    {backend:<11} max {max(errs) * 100:.3f}%  mean "
              f"{statistics.fmean(errs) * 100:.3f}%  over {len(errs)} provider-minutes; "
              f"planned vs started (dispatcher) max {fig.started_error * 100:.3f}%")
        for org, per_min in sorted(fig.done_per_minute.items()):
            cells = "  ".join(f"{m // 60:02d}:{m % 60:02d} {per_min.get(m, 0):,}/{n:,}"
                              for m, n in paced_plan.items())
            extra = {m: v for m, v in per_min.items() if m not in paced_plan}
            print(f"      {org}  {cells}" + (f"  (other minutes {extra})" if extra else ""))
    assert not problems, problems
