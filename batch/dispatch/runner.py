"""``run``: today's plan for every provider at once, in one process, then the summary.

In named steps, each its own function: read the inputs (:func:`read_inputs`), make sure of
today's plan (:func:`ensure_plan`: re-made when none is saved, it is stale, or an override
asks for today's window), build each provider's pieces (:func:`build_pieces`: one resilience
chain and client per provider, minutes cut to the windows in force), execute them
concurrently (:func:`execute`: outcomes written in batches; on SIGTERM/SIGINT claiming stops,
in-flight calls finish within a grace period, unstarted claims are released), and record the
typed summary (:func:`record`). A run that ends on an error closes its ``runs`` row as
failed, with the reason (:func:`close_failed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, TextIO

import httpx
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.aio import cancel_and_wait
from batch.client import CallChain, MydataClient, RefreshResult, make_http_client
from batch.clock import KST, Clock
from batch.config import Provider
from batch.crypto import TokenCipher, TokenKeyError
from batch.db import schema, work
from batch.db.engine import init_db, transaction
from batch.db.loaders import read_institutions
from batch.db.nodes import fail_runs, register_node
from batch.db.runlock import plan_lock
from batch.db.tokens import check_tokens
from batch.dispatch import progress
from batch.dispatch.pacing import slice_offset
from batch.dispatch.policy import RetryPolicy
from batch.dispatch.provider import DispatchSettings, ProviderDispatcher
from batch.dispatch.summary import ProviderSummary, RunSummary, format_summary
from batch.dispatch.writer import OutcomeWriter
from batch.errors import InputError, describe
from batch.lifecycle import TokenRefreshed
from batch.observe.session import Observability, ObserveOptions
from batch.planner import (
    DayPlan,
    ProviderLimits,
    build_week_plan,
    load_day_plan,
    save_plan,
    stale_reasons,
    unplaceable_this_week,
)
from batch.resilience.bulkhead import worker_share
from batch.resilience.chain import ProviderChain
from batch.resilience.outcomes import Kind, Outcome
from batch.resilience.settings import ChainSettings
from batch.tranid import TranIdGenerator
from planning.calendar import week_start
from planning.minutes import minute_caps, spread
from planning.windows import Window, day_minutes

if TYPE_CHECKING:  # cluster mode (batch/cluster/): imported only with --redis
    from batch.cluster.session import ClusterSession

log = logging.getLogger("mydata.run")

EXIT_OK = 0
EXIT_ATTENTION = 1  # work left undone or failures an operator must see
EXIT_INTERRUPTED = 3
#: refreshes under way per provider, per unit of its max_concurrency: one each. A refresh
#: holds a bulkhead permit for its calls and spends next to nothing between them, so as many
#: refreshes as permits keep the bulkhead full; more only queued there (a future, a timer
#: and a wake-up per call: 2 % of a saturated run's CPU, tests/bench/profile_dispatch.py),
#: or were refused. A refresh waiting for its rate-limit slot or a retry's backoff holds
#: no permit: while the provider's rate binds, or it fails, fewer calls are in flight.
IN_FLIGHT_PER_SLOT = 1
#: allocations between collections of the youngest generation while dispatching (700 by
#: default; see _freeze_heap)
GC_YOUNG = 100_000


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
    #: at most this many calls in flight to any one provider from this worker (None: the
    #: provider's max_concurrency, in cluster mode this worker's share of it)
    concurrency: int | None = None
    page_limit: int = 500
    observe: ObserveOptions = field(default_factory=ObserveOptions)
    #: cluster mode (``--redis``): the shared plan, limits and worker registry
    cluster: ClusterSession | None = None

    def __post_init__(self) -> None:
        if self.grace_seconds < 0:
            raise ValueError("grace_seconds must be >= 0")
        if self.progress not in ("auto", "tty", "log", "none"):
            raise ValueError("progress must be auto, tty, log or none")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")


@dataclass(frozen=True, slots=True)
class RunResult:
    summary: RunSummary
    exit_code: int


@dataclass(frozen=True, slots=True)
class RunInputs:
    """Step 1: what the run works from, read once at its start."""

    now: datetime
    today: date
    week: date
    providers: tuple[Provider, ...]
    operator_org_code: str
    #: this process's node number (batch/db/nodes.py): no other process has had it
    node_id: int
    #: ``keys rotate`` bound every stored token: a ``v1`` one is refused at its refresh
    tokens_bound: bool = False

    @property
    def limits(self) -> dict[str, ProviderLimits]:
        return {p.org_code: ProviderLimits.from_provider(p) for p in self.providers}


@dataclass(frozen=True, slots=True)
class DayPlans:
    """Step 2: today's plan per provider, and why it was re-made at the start (if it was)."""

    plans: dict[str, DayPlan]
    replanned: str | None = None
    #: consents the week's plan cannot place, per provider (they miss their week)
    unplaceable: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Pieces:
    """Step 3: what executes the day: one store and writer, one dispatcher and chain per
    provider, the shared HTTP client."""

    store: work.SqlWorkStore
    writer: OutcomeWriter
    http: httpx.AsyncClient
    dispatchers: list[ProviderDispatcher]
    chains: dict[str, ProviderChain]
    obs: Observability
    node_id: int = 0


@dataclass(frozen=True, slots=True)
class Execution:
    """Step 4: how the execution ended."""

    interrupted: bool
    persisted: bool
    unwritten: int
    elapsed: float


def _step(name: str, run_id: str, **extra: object) -> None:
    log.info(name.replace("_", " "), extra={"action": f"step_{name}", "run_id": run_id,
                                             **extra})


async def read_inputs(engine: AsyncEngine, *, clock: Clock, options: RunOptions,
                      cipher: TokenCipher) -> RunInputs:
    """Step 1: the schema, the stored tokens open with ``cipher`` (a wrong key stops here,
    before anything is written or called), the providers (``--only``) and the start time."""
    if options.cluster is None or not await options.cluster.schema_current(engine):
        await init_db(engine)  # cluster mode: never DDL under running workers (deadlocks)
    stored = await check_tokens(engine, cipher)
    institutions = await read_institutions(engine)
    unknown = set(options.only) - {p.org_code for p in institutions.providers}
    if unknown:
        raise InputError(f"unknown org_code(s) for --only: {', '.join(sorted(unknown))}")
    providers = tuple(p for p in institutions.providers
                      if not options.only or p.org_code in options.only)
    now = clock.now()
    today = now.astimezone(KST).date()
    # The run lock is held by the caller (`run`: batch/db/runlock.py); the node number is
    # handed out here, before anything else is written.
    cl = options.cluster
    node_id = await register_node(engine, worker_id=options.worker_id, run_id=options.run_id,
                                  now=now, cluster=cl is not None,
                                  heartbeat_timeout=30.0 if cl is None
                                  else cl.options.dead_after / cl.server_scale(engine))
    return RunInputs(now=now, today=today, week=week_start(today), providers=providers,
                     operator_org_code=institutions.operator_org_code, node_id=node_id,
                     tokens_bound=stored.bound_since is not None)


async def open_run(engine: AsyncEngine, inputs: RunInputs, options: RunOptions) -> None:
    """The ``runs`` row, ``running`` until :func:`record` or :func:`close_failed`.

    Outside cluster mode this run holds the run lock, so any other single-process run
    still open lost its process (kill -9, a crash, the machine): it is closed here as
    failed, saying so, instead of reading "running" for ever (a dead cluster worker's run
    is closed by the worker that sees it dead: batch/cluster/registry.py)."""
    async with transaction(engine) as conn:
        if options.cluster is None:
            n, r = schema.nodes.c, schema.runs.c
            lost = (await conn.execute(select(r.run_id).where(
                r.finished_at.is_(None), r.run_id != options.run_id,
                r.run_id.in_(select(n.run_id).where(n.cluster.is_(False),
                                                    n.run_id.is_not(None)))))).scalars().all()
            if lost:
                await conn.execute(fail_runs(r.run_id.in_(lost), at=inputs.now, reason=(
                    "its process ended without closing the run (killed, or its machine "
                    f"went down): found open by run {options.run_id}")))
            for run_id in lost:
                log.warning("an earlier run's process ended without closing it: closed "
                            "as failed", extra={"action": "lost_run_closed",
                                                "lost_run": run_id})
        await conn.execute(insert(schema.runs).values(
            run_id=options.run_id, day=inputs.today, worker_id=options.worker_id,
            started_at=inputs.now, status="running"))


async def ensure_plan(engine: AsyncEngine, inputs: RunInputs, options: RunOptions
                      ) -> DayPlans:
    """Step 2: today's saved plan, re-made first when it cannot be run as it is.

    Each night re-levels the rest of the week from what actually happened; a plan saved
    today is kept unless it is stale: made before consents or institutions were loaded
    again, or under other limits or windows than those in force now. An override run plans
    today for the override's window (from now), so a saved plan that gave today nothing
    still gets today's work done.
    """
    plans = await load_day_plan(engine, day=inputs.today)
    reasons = await stale_reasons(engine, plans, inputs.limits, now=inputs.now,
                                  today_windows=options.window_override)
    if not reasons:
        return DayPlans(plans, unplaceable=await unplaceable_this_week(engine, week=inputs.week))
    reason = "; ".join(reasons)
    if options.window_override is not None:
        reason = (f"today planned for the window override "
                  f"{', '.join(str(w) for w in options.window_override)} ({reason})")
    log.info("planning the rest of the week", extra={
        "action": "plan", "run_id": options.run_id, "reason": reason})
    await save_plan(engine, await build_week_plan(
        engine, week_of=inputs.today, today=inputs.today, now=inputs.now,
        today_windows=options.window_override))
    return DayPlans(await load_day_plan(engine, day=inputs.today), reason,
                    await unplaceable_this_week(engine, week=inputs.week))


def provider_minutes(plan: DayPlan | None, open_minutes: Sequence[int], *,
                     per_minute_cap: int, override: bool = False) -> dict[int, int]:
    """The plan's minutes that lie inside the windows in force now (a plan saved before a
    window change must not call outside the new windows). Under an override, a plan that
    does not record what it was made for (saved by an older version) has its quota spread
    over the override's minutes, as before."""
    if plan is None:
        return {}
    if override and plan.limits_key is None:
        series = spread(plan.batch_quota, open_minutes,
                        minute_caps(open_minutes, per_minute_cap))
        return {int(m): int(t) for m, t in zip(series.index, series, strict=True) if t > 0}
    allowed = set(open_minutes)
    return {m: t for m, t in plan.minutes.items() if m in allowed}


def build_pieces(inputs: RunInputs, plans: DayPlans, options: RunOptions, *,
                 engine: AsyncEngine, cipher: TokenCipher, clock: Clock,
                 attempted_before: dict[str, int],
                 http_factory: Callable[[int], httpx.AsyncClient] | None = None) -> Pieces:
    """Step 3: build each provider's pieces (chain, client, policy, dispatcher)."""
    today, week = inputs.today, inputs.week
    store = work.SqlWorkStore(engine, cipher)
    writer = OutcomeWriter(store, run_id=options.run_id, worker=options.worker_id, day=today,
                           clock=clock)
    tran_ids = TranIdGenerator(inputs.operator_org_code, node_id=inputs.node_id)
    http = (http_factory or (lambda n: make_http_client(max_connections=n)))(
        options.max_connections)
    policy_by_org: dict[str, RetryPolicy] = {}
    dispatchers: list[ProviderDispatcher] = []
    chains: dict[str, ProviderChain] = {}
    obs = Observability(engine, clock=clock, run_id=options.run_id, day=today,
                        options=options.observe)
    # cluster mode: one circuit per provider across the workers (batch/cluster/circuit_node.py)
    node = None if options.cluster is None else options.cluster.circuit_node(options.worker_id)
    for index, p in enumerate(inputs.providers):
        plan = plans.plans.get(p.org_code)
        quota = plan.batch_quota if plan else 0
        cap = ProviderLimits.from_provider(p).per_minute_cap
        open_minutes = day_minutes(options.window_override or p.windows)
        minutes = provider_minutes(plan, open_minutes, per_minute_cap=cap,
                                   override=options.window_override is not None)
        if plan is not None and not set(plan.minutes) <= set(open_minutes):
            log.warning("planned minutes outside the windows in force are not run", extra={
                "action": "minutes_outside_windows", "run_id": options.run_id,
                "org_code": p.org_code, "dropped": len(plan.minutes) - len(minutes)})
        chain = ProviderChain(p.org_code, ChainSettings.from_provider(p), clock=clock,
                              listeners=obs.listeners if node is None
                              else (*obs.listeners, node.feed))
        chains[p.org_code] = chain
        if options.cluster is not None:  # cluster mode: the shared limit behind the local
            options.cluster.attach(chain, cap=options.concurrency)
        elif options.concurrency is not None:
            chain.bulkhead.set_limit(worker_share(chain.bulkhead.limit, 1, options.concurrency))
        gate: CallChain = chain if node is None else node.gate(chain, listeners=obs.listeners)
        client = MydataClient(p, http=http, chain=gate, tran_ids=tran_ids, clock=clock,
                              page_limit=options.page_limit)
        policy_by_org[p.org_code] = RetryPolicy(max_attempts=p.max_attempts_per_week,
                                                windows=tuple(p.windows))
        dispatchers.append(ProviderDispatcher(
            p.org_code, store=store, refresh=_refresher(client, store),
            writer=writer, clock=clock,
            settings=DispatchSettings(worker_id=options.worker_id, lease=options.lease),
            policy=policy_by_org[p.org_code], day=today, week=week, quota=quota,
            minutes=minutes, per_minute_cap=cap, window_minutes=open_minutes,
            attempted_before=attempted_before.get(p.org_code, 0),
            breaker_open=_open_check(chain) if node is None
            else node.gates[p.org_code].breaker_open,
            breaker_state=_state_of(chain) if node is None
            else node.gates[p.org_code].breaker_state,
            allowance=None if options.cluster is None else options.cluster.allowance(
                p.org_code, day=today, quota=quota,
                attempted_before=attempted_before.get(p.org_code, 0), run_id=options.run_id),
            max_in_flight=_in_flight_cap(chain),
            # the i-th of N providers' starts fall i/N along the slices' carried fraction
            phase=index / len(inputs.providers),
            offset=slice_offset(index),
        ))
    return Pieces(store, writer, http, dispatchers, chains, obs, inputs.node_id)


def _freeze_heap() -> tuple[int, ...] | None:
    """Everything made before the day's dispatching (modules, SQLAlchemy's metadata, pandas,
    the plan, the chains) moves out of the garbage collector's sight: its full collections
    scanned all of it again and again, stalling the loop for 100-400 ms at random refresh
    steps with 300 providers. The youngest generation is collected every GC_YOUNG
    allocations instead of 700: a refresh's objects mostly die before that, and 300
    providers ran 6,400 young collections in two minutes (2 s of the loop's time; 900 at
    20,000). A saturated run holds thousands of claims and refreshes in flight, all young:
    at 20,000 each young collection walked them again, 91 of 10-13 ms of CPU in a minute
    (8-10 us a call); at 100,000, 5-6 of about 1 ms. Returns the thresholds to restore
    (None: nothing changed)."""
    if not gc.isenabled() or gc.get_freeze_count():
        return None
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(max(old[0], GC_YOUNG), *old[1:])
    return old


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """The collector as the dispatcher runs under it (:func:`_freeze_heap`) for a block,
    thawed after (the day's dispatching; the benchmarks time the producer's claims so)."""
    old = _freeze_heap()
    try:
        yield
    finally:
        if old is not None:
            gc.unfreeze()
            gc.set_threshold(*old)


def _in_flight_cap(chain: ProviderChain) -> Callable[[], int]:
    """Refreshes one provider may have under way: its bulkhead's limit (which cluster mode
    sets to this worker's share of the provider's concurrency) times IN_FLIGHT_PER_SLOT."""
    bulkhead = chain.bulkhead
    return lambda: IN_FLIGHT_PER_SLOT * bulkhead.limit


def dump_tasks(stream: TextIO) -> None:
    """``kill -USR1``: every asyncio task and where it waits, to stderr (a stuck run)."""
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    print(f"--- {len(tasks)} tasks ---", file=stream)
    for t in tasks:
        print(f"task {t.get_name()}:", file=stream)
        t.print_stack(limit=12, file=stream)
    stream.flush()


async def execute(pieces: Pieces, options: RunOptions, *, clock: Clock, day: date,
                  stream: TextIO, install_signals: bool = True,
                  stop: asyncio.Event | None = None) -> Execution:
    """Step 4: every provider's dispatcher at once; SIGTERM/SIGINT (or ``stop`` set by the
    caller: the run lock lost to another run) stop claiming, in-flight calls get the grace
    period, unstarted claims are released and outcomes written."""
    stop = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    signals: list[signal.Signals] = []
    if install_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
                signals.append(sig)
        with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
            loop.add_signal_handler(signal.SIGUSR1, dump_tasks, sys.stderr)
            signals.append(signal.SIGUSR1)
    tty = options.progress == "tty" or (options.progress == "auto" and stream.isatty())
    writer = pieces.writer
    writer_task = writer.start()
    progress_task = None
    if options.progress != "none":
        progress_task = asyncio.create_task(progress.report(
            pieces.dispatchers, clock=clock, tty=tty, stream=stream, run_id=options.run_id,
            day=day))
    await pieces.obs.start(pieces.chains, pieces.dispatchers)  # the port, the minute export
    circuit = None if options.cluster is None else options.cluster.circuit
    if options.cluster is not None:  # cluster mode: heartbeat, shared permits
        await options.cluster.start(pieces.node_id)
    t0 = clock.monotonic()
    try:
        with frozen_heap():
            if circuit is not None:  # cluster mode: the circuit's feed, view and coordinator
                await circuit.start()
            await asyncio.gather(*(d.run(stop, grace=options.grace_seconds)
                                   for d in pieces.dispatchers))
    finally:
        if progress_task is not None:
            await cancel_and_wait([progress_task])
        persisted = await writer.close()
        await asyncio.gather(writer_task, return_exceptions=True)
        await pieces.store.settle()  # cancelled claims given back before the engine goes
        await pieces.http.aclose()
        await pieces.obs.stop()  # the last minute rows; the port closed
        if circuit is not None:
            await circuit.stop()  # a last push; the coordinator's lease given up
        if options.cluster is not None:
            await options.cluster.stop()
        for sig in signals:
            loop.remove_signal_handler(sig)
    return Execution(interrupted=stop.is_set(), persisted=persisted, unwritten=writer.pending,
                     elapsed=clock.monotonic() - t0)


def _capped(stats: dict[str, Any], due: Mapping[str, int] | None) -> dict[str, Any]:
    """``deferred`` no more than the provider's consents still due (:func:`leftover_due`):
    the rest of the day's quota was revoked, or refreshed by another run, meanwhile."""
    if due is None:
        return stats
    left = stats["deferred"]
    deferred = min(left, due.get(stats["org_code"], 0))
    return {**stats, "deferred": deferred, "no_longer_due": left - deferred}


async def leftover_due(engine: AsyncEngine, pieces: Pieces, *, week: date
                       ) -> dict[str, int] | None:
    """Per provider that leaves part of its day's quota: its consents still due, up to that
    part (None if the database cannot say: nothing is capped then)."""
    bounds = {d.org_code: d.stats.left for d in pieces.dispatchers}
    if not any(bounds.values()):
        return {}
    try:
        return await work.still_due(engine, week=week, bounds=bounds)
    except Exception as exc:
        log.warning("could not count the consents still due; deferred counts all the day's "
                    "quota left", extra={"action": "still_due_failed", "error": describe(exc)})
        return None


def summarize(inputs: RunInputs, plans: DayPlans, pieces: Pieces, done: Execution,
              options: RunOptions, due: Mapping[str, int] | None = None) -> RunSummary:
    """The typed end-of-run summary, from each dispatcher's stats and chain; ``due`` (if
    known) caps each provider's ``deferred`` (:func:`leftover_due`)."""
    provs = tuple(ProviderSummary.from_stats(
        {**_capped(d.stats.summary(), due),
         "unplaceable_this_week": plans.unplaceable.get(d.org_code, 0)},
        chain=pieces.chains[d.org_code].snapshot()) for d in pieces.dispatchers)
    attention = any(p.attention for p in provs) or not done.persisted
    exit_code = (EXIT_INTERRUPTED if done.interrupted else EXIT_ATTENTION if attention
                 else EXIT_OK)
    status = "interrupted" if done.interrupted else "incomplete" if attention else "done"
    return RunSummary(
        run_id=options.run_id, date=inputs.today.isoformat(),
        week_start=inputs.week.isoformat(), worker_id=options.worker_id, status=status,
        exit_code=exit_code, elapsed_seconds=round(done.elapsed, 2), providers=provs,
        window_override=tuple(str(w) for w in options.window_override)
        if options.window_override else None,
        outcomes_persisted=done.persisted, unwritten_outcomes=done.unwritten,
        replanned=plans.replanned)


async def record(engine: AsyncEngine, summary: RunSummary, *, clock: Clock) -> None:
    """Step 5: close the ``runs`` row with the summary (a failure to is logged, not raised:
    the outcomes are written already)."""
    try:
        async with transaction(engine) as conn:
            await conn.execute(update(schema.runs).where(schema.runs.c.run_id == summary.run_id)
                               .values(finished_at=clock.now(), status=summary.status,
                                       summary=summary.dumps()))
    except Exception as exc:
        log.error("could not store the run summary", extra={
            "action": "summary_failed", "run_id": summary.run_id,
            "error": describe(exc)})


async def close_failed(engine: AsyncEngine, run_id: str, reason: str, *,
                       clock: Clock) -> None:
    """A run that ends on an error: its ``runs`` row is closed as failed, with the reason."""
    try:
        async with transaction(engine) as conn:
            await conn.execute(fail_runs(schema.runs.c.run_id == run_id, at=clock.now(),
                                         reason=reason))
    except Exception as exc:
        log.error("could not close the failed run", extra={
            "action": "close_failed_failed", "run_id": run_id, "error": describe(exc)})


async def run_day(
    engine: AsyncEngine,
    *,
    clock: Clock,
    options: RunOptions,
    cipher: TokenCipher,
    stream: TextIO | None = None,
    http_factory: Callable[[int], httpx.AsyncClient] | None = None,
    install_signals: bool = True,
    stop: asyncio.Event | None = None,
) -> RunResult:
    """Run today's work (read inputs, make sure of the plan, build each provider's pieces,
    execute, record); returns the summary and the exit code. Setting ``stop`` stops it as
    SIGTERM does."""
    stream = stream or sys.stderr
    run_id = options.run_id
    inputs = await read_inputs(engine, clock=clock, options=options, cipher=cipher)
    if inputs.tokens_bound:  # a v1 token put in after the check fails its consent alone
        cipher = cipher.bound()
    _step("read_inputs", run_id, providers=len(inputs.providers),
          date=inputs.today.isoformat())
    await open_run(engine, inputs, options)
    try:
        async with plan_lock(engine, shared=options.cluster is not None):
            plans = await ensure_plan(engine, inputs, options)  # one planner at a time
        _step("plan", run_id, replanned=plans.replanned,
              planned=sum(p.batch_quota for p in plans.plans.values()))
        before = await work.attempted_today(engine, day=inputs.today)
        pieces = build_pieces(inputs, plans, options, engine=engine, cipher=cipher,
                              clock=clock, attempted_before=before,
                              http_factory=http_factory)
        _step("build", run_id, dispatchers=len(pieces.dispatchers))
        done = await execute(pieces, options, clock=clock, day=inputs.today, stream=stream,
                             install_signals=install_signals, stop=stop)
        _step("execute", run_id, interrupted=done.interrupted, persisted=done.persisted)
    except Exception as exc:
        reason = describe(exc)
        log.error("run failed", extra={"action": "run_failed", "run_id": run_id,
                                       "error": reason})
        await close_failed(engine, run_id, reason, clock=clock)
        raise
    # outcomes left unwritten: the database is likely gone (each try waits out a connect
    # timeout), and the run needs an operator whatever the count would say
    due = await leftover_due(engine, pieces, week=inputs.week) if done.persisted else None
    summary = summarize(inputs, plans, pieces, done, options, due)
    await record(engine, summary, clock=clock)
    await pieces.obs.close()  # the gauges re-read (this run's status), the last textfile
    _step("record", run_id, status=summary.status, exit_code=summary.exit_code)
    return RunResult(summary, summary.exit_code)


async def _at_once(result: RefreshResult) -> RefreshResult:
    return result


def _refresher(client: MydataClient, store: work.WorkStore
               ) -> Callable[[work.Claim, float | None], Awaitable[RefreshResult]]:
    # A plain function handing back the client's coroutine, not a coroutine awaiting it:
    # every resumption of a refresh (each answer read) passes through one frame less.
    def refresh(claim: work.Claim, not_after: float | None) -> Awaitable[RefreshResult]:
        try:
            access = store.open_access(claim)
        except TokenKeyError as exc:  # this consent alone: dead-lettered, for the operator
            return _at_once(RefreshResult(Outcome(Kind.CLIENT, detail=str(exc)), calls=0))

        async def save(access: str, refresh_token: str | None) -> bool:
            # False: revoked while its call was in flight (not stored, not called again)
            return await store.save_token(TokenRefreshed.of(claim, access, refresh_token))
        # the refresh token opens only if a 40101 needs it (an AES-GCM decryption saved on
        # nearly every refresh); one that does not open fails its consent then, alone
        return client.refresh(
            access_token=access,
            refresh_token=(None if claim.refresh_token is None
                           else partial(store.open_refresh, claim)),
            progress=claim.progress, dead_items=claim.dead_items, not_after=not_after,
            on_token=save)
    return refresh


def _open_check(chain: ProviderChain) -> Callable[[], bool]:
    breaker = chain.breaker

    def is_open() -> bool:  # every slice with starts asks
        return breaker.is_open
    return is_open


def _state_of(chain: ProviderChain) -> Callable[[], str]:
    def state() -> str:
        return str(chain.breaker.state.value)
    return state


__all__ = ["EXIT_ATTENTION", "EXIT_INTERRUPTED", "EXIT_OK", "RunOptions", "RunResult",
           "RunSummary", "build_pieces", "close_failed", "ensure_plan", "execute",
           "format_summary", "open_run", "provider_minutes", "read_inputs", "record",
           "run_day", "summarize"]
