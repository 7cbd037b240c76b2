"""``run``: today's plan for every provider at once, in one process, then the summary.

Reads the providers and today's saved plan (planning and saving it first if none is saved),
builds one resilience chain and one client per provider, runs every provider's dispatcher
concurrently, writes outcomes in batches, and on SIGTERM/SIGINT stops claiming, lets
in-flight calls finish within a grace period, releases unstarted claims and writes the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Any, TextIO

import httpx
from sqlalchemy import insert, update
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.client import MydataClient, RefreshResult, make_http_client
from batch.clock import KST, Clock
from batch.db import schema, work
from batch.db.engine import init_db, transaction
from batch.db.loaders import read_institutions
from batch.dispatch import progress
from batch.dispatch.policy import RetryPolicy
from batch.dispatch.provider import DispatchSettings, ProviderDispatcher
from batch.dispatch.writer import OutcomeWriter
from batch.errors import InputError, describe
from batch.lifecycle import TokenRefreshed
from batch.planner import ProviderLimits, build_week_plan, load_day_plan, save_plan
from batch.resilience.breaker import State
from batch.resilience.chain import ProviderChain
from batch.resilience.settings import ChainSettings
from batch.tranid import TranIdGenerator
from planning.calendar import week_start
from planning.minutes import spread
from planning.windows import Window, day_minutes

log = logging.getLogger("mydata.run")

EXIT_OK = 0
EXIT_ATTENTION = 1  # work left undone or failures an operator must see
EXIT_INTERRUPTED = 3


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What one ``run`` invocation is asked to do."""

    window_override: tuple[Window, ...] | None = None
    only: tuple[str, ...] = ()
    lease: timedelta = timedelta(minutes=10)
    grace_seconds: float = 30.0
    progress: str = "auto"  # auto | tty | log | none
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    max_connections: int = 200
    page_limit: int = 500

    def __post_init__(self) -> None:
        if self.grace_seconds < 0:
            raise ValueError("grace_seconds must be >= 0")
        if self.progress not in ("auto", "tty", "log", "none"):
            raise ValueError("progress must be auto, tty, log or none")


@dataclass(slots=True)
class RunResult:
    summary: dict[str, Any]
    exit_code: int


async def run_day(
    engine: AsyncEngine,
    *,
    clock: Clock,
    options: RunOptions,
    stream: TextIO | None = None,
    http_factory: Callable[[int], httpx.AsyncClient] | None = None,
    install_signals: bool = True,
) -> RunResult:
    """Run today's work; returns the summary and the exit code."""
    stream = stream or sys.stderr
    await init_db(engine)
    institutions = await read_institutions(engine)
    providers = [p for p in institutions.providers if not options.only
                 or p.org_code in options.only]
    unknown = set(options.only) - {p.org_code for p in institutions.providers}
    if unknown:
        raise InputError(f"unknown org_code(s) for --only: {', '.join(sorted(unknown))}")
    now = clock.now()
    today = now.date()
    week = week_start(today)

    plans = await load_day_plan(engine, day=today)
    day_start = datetime.combine(today, time(0), KST)
    if not plans or any(p.created_at is None or p.created_at < day_start
                        for p in plans.values()):
        # Each night re-levels the rest of the week from what actually happened. A plan
        # saved today (by `plan --save`, or an earlier run today) is kept as it is.
        # An override run does today's work now: plan today with its whole capacity.
        log.info("planning the rest of the week", extra={
            "action": "plan", "run_id": options.run_id,
            "reason": "no plan saved" if not plans else "plan saved before today"})
        plan_now = day_start if options.window_override is not None else now
        await save_plan(engine, await build_week_plan(engine, week_of=today, today=today,
                                                       now=plan_now))
        plans = await load_day_plan(engine, day=today)

    before = await work.attempted_today(engine, day=today)
    async with transaction(engine) as conn:
        await conn.execute(insert(schema.runs).values(
            run_id=options.run_id, day=today, worker_id=options.worker_id, started_at=now,
            status="running"))

    store = work.SqlWorkStore(engine)
    writer = OutcomeWriter(store, run_id=options.run_id, worker=options.worker_id, day=today,
                           clock=clock)
    tran_ids = TranIdGenerator(institutions.operator_org_code)
    http = (http_factory or (lambda n: make_http_client(max_connections=n)))(
        options.max_connections)
    policy_by_org: dict[str, RetryPolicy] = {}
    dispatchers: list[ProviderDispatcher] = []
    chains: dict[str, ProviderChain] = {}
    for p in providers:
        plan = plans.get(p.org_code)
        quota = plan.batch_quota if plan else 0
        cap = ProviderLimits.from_provider(p).per_minute_cap
        if options.window_override is not None:
            open_minutes = day_minutes(options.window_override)
            series = spread(quota, open_minutes, cap)
            minutes = dict(zip(series.index.tolist(), series.tolist(), strict=True))
        else:
            open_minutes = day_minutes(p.windows)
            minutes = dict(plan.minutes) if plan else {}
        chain = ProviderChain(p.org_code, ChainSettings.from_provider(p), clock=clock)
        chains[p.org_code] = chain
        client = MydataClient(p, http=http, chain=chain, tran_ids=tran_ids, clock=clock,
                              page_limit=options.page_limit)
        policy_by_org[p.org_code] = RetryPolicy(max_attempts=p.max_attempts_per_week,
                                                windows=tuple(p.windows))
        dispatchers.append(ProviderDispatcher(
            p.org_code, store=store, refresh=_refresher(client, store), writer=writer, clock=clock,
            settings=DispatchSettings(worker_id=options.worker_id, lease=options.lease),
            policy=policy_by_org[p.org_code], day=today, week=week, quota=quota,
            minutes=minutes, per_minute_cap=cap, window_minutes=open_minutes,
            attempted_before=before.get(p.org_code, 0),
            breaker_open=_open_check(chain), breaker_state=_state_of(chain),
        ))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals: list[signal.Signals] = []
    if install_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
                signals.append(sig)
    tty = options.progress == "tty" or (options.progress == "auto" and stream.isatty())
    writer_task = writer.start()
    progress_task = None
    if options.progress != "none":
        progress_task = asyncio.create_task(progress.report(
            dispatchers, clock=clock, tty=tty, stream=stream, run_id=options.run_id))
    t0 = clock.monotonic()
    try:
        await asyncio.gather(*(d.run(stop, grace=options.grace_seconds) for d in dispatchers))
    finally:
        if progress_task is not None:
            progress_task.cancel()
            await asyncio.gather(progress_task, return_exceptions=True)
        persisted = await writer.close()
        await asyncio.gather(writer_task, return_exceptions=True)
        await http.aclose()
        for sig in signals:
            loop.remove_signal_handler(sig)
    elapsed = clock.monotonic() - t0

    provs = []
    for d in dispatchers:
        s = d.stats.summary()
        s["chain"] = chains[d.org_code].snapshot()
        provs.append(s)
    interrupted = stop.is_set()
    attention = any(p["deferred"] or p["dead_lettered"] or p["by_outcome"].get("client")
                    for p in provs) or not persisted
    exit_code = EXIT_INTERRUPTED if interrupted else EXIT_ATTENTION if attention else EXIT_OK
    status = ("interrupted" if interrupted else "incomplete" if attention else "done")
    summary: dict[str, Any] = {
        "run_id": options.run_id,
        "date": today.isoformat(),
        "week_start": week.isoformat(),
        "worker_id": options.worker_id,
        "status": status,
        "exit_code": exit_code,
        "elapsed_seconds": round(elapsed, 2),
        "window_override": [str(w) for w in options.window_override]
        if options.window_override else None,
        "outcomes_persisted": persisted,
        "unwritten_outcomes": writer.pending,
        "providers": provs,
        "totals": _totals(provs),
    }
    try:
        async with transaction(engine) as conn:
            await conn.execute(update(schema.runs).where(schema.runs.c.run_id == options.run_id)
                               .values(finished_at=clock.now(), status=status,
                                       summary=json.dumps(summary)))
    except Exception as exc:
        log.error("could not store the run summary", extra={
            "action": "summary_failed", "run_id": options.run_id,
            "error": describe(exc)})
    return RunResult(summary, exit_code)


def _refresher(client: MydataClient, store: work.WorkStore
               ) -> Callable[[work.Claim, float | None], Any]:
    async def refresh(claim: work.Claim, not_after: float | None) -> RefreshResult:
        async def save(access: str, refresh_token: str | None) -> None:
            await store.save_token(TokenRefreshed(claim.id, access, refresh_token))
        return await client.refresh(access_token=claim.access_token,
                                    refresh_token=claim.refresh_token,
                                    progress=claim.progress, dead_items=claim.dead_items,
                                    not_after=not_after, on_token=save)
    return refresh


def _open_check(chain: ProviderChain) -> Callable[[], bool]:
    def is_open() -> bool:
        return chain.breaker.state in (State.OPEN, State.FORCED_OPEN)
    return is_open


def _state_of(chain: ProviderChain) -> Callable[[], str]:
    def state() -> str:
        return str(chain.breaker.state.value)
    return state


_SUMMED = ("planned", "attempted_before_run", "attempted", "succeeded", "already_transferred",
           "dead_assets", "failed", "deferred", "not_attempted", "dead_lettered", "calls",
           "missed_slices", "slices")


def _totals(provs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {k: sum(int(p[k]) for p in provs) for k in _SUMMED}


def format_summary(summary: dict[str, Any]) -> str:
    """The end-of-run summary as an aligned table for a person."""
    cols = [("provider", "org_code", 10), ("planned", "planned", 9),
            ("attempted", "attempted", 9), ("ok", "succeeded", 9), ("failed", "failed", 7),
            ("deferred", "deferred", 8), ("dead-ltr", "dead_lettered", 8),
            ("calls", "calls", 8), ("calls/s", "calls_per_second", 8)]
    head = "  ".join(f"{h:>{w}}" if i else f"{h:<{w}}" for i, (h, _, w) in enumerate(cols))
    head += "  late p50/p99 ms  missed  breaker"
    out = [f"run {summary['run_id']}  {summary['date']}  status {summary['status']}  "
           f"({summary['elapsed_seconds']} s)", head, "-" * len(head)]
    for p in summary["providers"]:
        row = "  ".join(
            (f"{p[k]:<{w}}" if i == 0 else
             f"{p[k]:>{w},}" if isinstance(p[k], int) else f"{p[k]:>{w}}")
            for i, (_, k, w) in enumerate(cols))
        late = p["slice_lateness_ms"]
        row += f"  {late['p50']:>6.2f}/{late['p99']:<8.2f}  {p['missed_slices']:>6}  {p['breaker']}"
        out.append(row)
    t = summary["totals"]
    out.append("-" * len(head))
    out.append(f"{'total':<10}  " + "  ".join(
        f"{t[k]:>{w},}" for _, k, w in cols[1:-1]))
    return "\n".join(out)
