"""run_day in its steps: read inputs, make sure of the plan (nightly re-plan, stale plans,
an override's window), build each provider's pieces (minutes cut to the windows in force),
execute, record; a run that ends on an error is closed as failed with the reason."""

from __future__ import annotations

import io
import logging
from datetime import datetime, timedelta

import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import KST, FakeClock
from batch.config import parse_institutions
from batch.db import schema
from batch.db.loaders import load_institutions
from batch.dispatch.pacing import SLICE_SECONDS, slice_offset
from batch.dispatch.runner import (
    DayPlans,
    RunInputs,
    RunOptions,
    build_pieces,
    ensure_plan,
    execute,
    provider_minutes,
    read_inputs,
    run_day,
)
from batch.errors import InputError
from batch.planner import DayPlan, build_week_plan, load_day_plan, save_plan
from planning.windows import day_minutes, parse_window, parse_windows
from tests.integration.helpers import (
    DAY,
    free_ports,
    institutions_toml,
    make_institutions,
    populate,
)
from tests.sealing import CIPHER

# 07:00 on Monday: every provider's window 00:00-06:00 is over, so a run plans and stops.
AFTER_WINDOW = datetime(2026, 11, 30, 7, 0, tzinfo=KST)


def _options(**kw: object) -> RunOptions:
    return RunOptions(progress="none", **kw)  # type: ignore[arg-type]


async def _run(engine: AsyncEngine, when: datetime = AFTER_WINDOW, **kw: object) -> object:
    res = await run_day(engine, cipher=CIPHER, clock=FakeClock(when), options=_options(**kw),
                        stream=io.StringIO(), install_signals=False)
    return res.summary


async def _plan_rows(engine: AsyncEngine) -> dict[object, int]:
    async with engine.connect() as conn:
        rows = (await conn.execute(select(schema.plan_days.c.day,
                                          schema.plan_days.c.batch_quota))).all()
    return {r.day: int(r.batch_quota) for r in rows}


async def test_a_plan_saved_before_today_is_relevelled_from_what_is_due(
    engine: AsyncEngine,
) -> None:
    now = datetime(2026, 11, 30, 1, 0, tzinfo=KST)
    insts = make_institutions(free_ports(1), industries=("bank",))
    await populate(engine, insts, per_provider=30, now=now, quota=7)
    async with engine.begin() as conn:
        await conn.execute(update(schema.plan_days).values(created_at=now - timedelta(days=1)))
    summary = await _run(engine)
    (p,) = summary.providers  # type: ignore[attr-defined]
    # today's window is over: the 30 due consents level flat over Tuesday..Saturday
    assert p.count("planned") == 0
    rows = await _plan_rows(engine)
    assert sum(rows.values()) == 30 and rows[DAY + timedelta(1)] == 6
    assert "plan saved before today" in (summary.replanned or "")  # type: ignore[attr-defined]


async def test_a_plan_saved_for_another_day_is_no_plan_for_today(engine: AsyncEngine) -> None:
    # yesterday's saved plan (Sunday's), run on Monday: the run says that today has none
    now = datetime(2026, 11, 30, 1, 0, tzinfo=KST)
    insts = make_institutions(free_ports(1), industries=("bank",))
    await populate(engine, insts, per_provider=30, now=now, quota=7)
    async with engine.begin() as conn:
        await conn.execute(update(schema.plan_minutes).values(day=DAY - timedelta(days=1)))
        await conn.execute(update(schema.plan_days).values(day=DAY - timedelta(days=1)))
    summary = await _run(engine)
    assert summary.replanned == "no plan saved for today, Mon 2026-11-30"  # type: ignore[attr-defined]


async def test_a_plan_saved_today_is_kept(engine: AsyncEngine) -> None:
    now = datetime(2026, 11, 30, 0, 30, tzinfo=KST)
    insts = make_institutions(free_ports(1), industries=("bank",))
    await populate(engine, insts, per_provider=30, now=now, quota=7)
    summary = await _run(engine)
    assert summary.providers[0].count("planned") == 7  # type: ignore[attr-defined]
    assert summary.replanned is None  # type: ignore[attr-defined]


async def test_a_run_closes_an_earlier_run_whose_process_died_not_a_cluster_workers(
    engine: AsyncEngine,
) -> None:
    # A single-process run killed -9 left its runs row "running"; the next run holds the
    # run lock, so that one cannot be alive: closed as failed, saying so. A cluster
    # worker's run is not this run's to judge (its live peers close it when it dies).
    from batch.db.nodes import register_node
    insts = make_institutions(free_ports(1), industries=("bank",))
    await populate(engine, insts, per_provider=1, now=AFTER_WINDOW)
    earlier = AFTER_WINDOW - timedelta(hours=6)
    async with engine.begin() as conn:
        await conn.execute(schema.runs.insert(), [
            {"run_id": rid, "day": DAY, "worker_id": rid, "started_at": earlier,
             "status": "running"} for rid in ("killed", "cluster-worker")])
    await register_node(engine, worker_id="killed", run_id="killed", now=earlier,
                        cluster=False, heartbeat_timeout=30)
    await register_node(engine, worker_id="cluster-worker", run_id="cluster-worker",
                        now=earlier, cluster=True, heartbeat_timeout=30)
    summary = await _run(engine)
    r = schema.runs.c
    async with engine.connect() as conn:
        rows = {row.run_id: row for row in await conn.execute(
            select(r.run_id, r.status, r.finished_at, r.error))}
    assert rows["killed"].status == "failed" and rows["killed"].finished_at is not None
    assert rows["killed"].error == (
        "its process ended without closing the run (killed, or its machine went down): "
        f"found open by run {summary.run_id}")  # type: ignore[attr-defined]
    assert (rows["cluster-worker"].status, rows["cluster-worker"].finished_at) == (
        "running", None)
    assert rows[summary.run_id].error is None  # type: ignore[attr-defined]


# --- step 1: read inputs ----------------------------------------------------------------

async def test_read_inputs_filters_by_only_and_refuses_an_unknown_org(
    engine: AsyncEngine,
) -> None:
    insts = make_institutions(free_ports(2))
    await populate(engine, insts, per_provider=1, now=AFTER_WINDOW)
    first = insts.providers[0].org_code
    inputs = await read_inputs(engine, cipher=CIPHER, clock=FakeClock(AFTER_WINDOW),
                               options=_options(only=(first,)))
    assert [p.org_code for p in inputs.providers] == [first]
    assert (inputs.today, inputs.week, inputs.operator_org_code) == (
        DAY, DAY - timedelta(1), "OPERATOR01")
    with pytest.raises(InputError, match="NOPE000000"):
        await read_inputs(engine, cipher=CIPHER, clock=FakeClock(AFTER_WINDOW),
                          options=_options(only=("NOPE000000",)))


async def test_each_run_takes_a_tran_id_node_number_no_other_run_had_from_the_database(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Edge 10: the node part of x-api-tran-id is unique by construction (the registry's
    # autoincrement id), not a random number per process; pinned where a run takes it.
    import batch.dispatch.runner as runner_mod
    from batch.tranid import TranIdGenerator

    used: list[int | None] = []

    class Recording(TranIdGenerator):
        __slots__ = ()

        def __init__(self, operator_org_code: str, node_id: int | None = None) -> None:
            used.append(node_id)
            super().__init__(operator_org_code, node_id=node_id)

    monkeypatch.setattr(runner_mod, "TranIdGenerator", Recording)
    insts = make_institutions(free_ports(1), industries=("bank",))
    await populate(engine, insts, per_provider=1, now=AFTER_WINDOW)
    async with engine.connect() as conn:
        before = {int(r.node_id) for r in (await conn.execute(select(schema.nodes))).all()}
    runs = []
    for run_id in ("run-a", "run-b"):
        inputs = await read_inputs(engine, cipher=CIPHER, clock=FakeClock(AFTER_WINDOW),
                                   options=_options(run_id=run_id))
        pieces = build_pieces(inputs, DayPlans({}), _options(run_id=run_id), engine=engine,
                              cipher=CIPHER, clock=FakeClock(AFTER_WINDOW),
                              attempted_before={},
                              http_factory=lambda n: httpx.AsyncClient())
        await pieces.http.aclose()
        runs.append((run_id, inputs.node_id))
    async with engine.connect() as conn:
        rows = {(str(r.run_id), int(r.node_id)) for r in (await conn.execute(
            select(schema.nodes.c.run_id, schema.nodes.c.node_id))).all()}
    a, b = (n for _, n in runs)
    assert set(runs) <= rows                       # each number is the registry's row
    assert a not in before and b not in before and b > a
    assert used == [a, b]                          # and it is what the tran ids carry


# --- step 2: make sure of the plan (edge 3, edge 19, issue 13 item 3) --------------------

async def _saved_plan(engine: AsyncEngine, windows: str, *, when: datetime,
                      consents: int = 60) -> None:
    toml = institutions_toml(free_ports(1), industries=("bank",)).replace(
        '["0000:0600"]', windows)
    await populate(engine, parse_institutions(toml), per_provider=consents, now=when)
    await save_plan(engine, await build_week_plan(engine, week_of=DAY, today=DAY, now=when))


async def _reload(engine: AsyncEngine, windows: str, when: datetime) -> None:
    toml = institutions_toml(free_ports(1), industries=("bank",)).replace(
        '["0000:0600"]', windows)
    await load_institutions(engine, parse_institutions(toml), now=when)


async def test_a_plan_made_under_other_windows_is_replanned_for_the_new_ones(
    engine: AsyncEngine,
) -> None:
    early = datetime(2026, 11, 30, 0, 10, tzinfo=KST)
    await _saved_plan(engine, '["0000:0600"]', when=early)
    await _reload(engine, '["1200:1800"]', early + timedelta(minutes=5))
    clock = FakeClock(early + timedelta(minutes=10))
    inputs = await read_inputs(engine, cipher=CIPHER, clock=clock, options=_options())
    plans = await ensure_plan(engine, inputs, _options())
    assert plans.replanned is not None
    assert "institutions loaded again" in plans.replanned
    assert "0000:0600" in plans.replanned and "1200:1800" in plans.replanned
    (plan,) = plans.plans.values()
    assert plan.minutes and set(plan.minutes) <= set(range(12 * 60, 18 * 60))


async def test_consents_loaded_again_make_the_plan_stale(engine: AsyncEngine) -> None:
    from batch.db.marks import mark_loaded

    early = datetime(2026, 11, 30, 0, 10, tzinfo=KST)
    await _saved_plan(engine, '["0000:0600"]', when=early)
    clock = FakeClock(early + timedelta(minutes=10))
    inputs = await read_inputs(engine, cipher=CIPHER, clock=clock, options=_options())
    assert (await ensure_plan(engine, inputs, _options())).replanned is None
    async with engine.begin() as conn:  # what load_consents records in its transaction
        await mark_loaded(conn, "consents", early + timedelta(minutes=5))
    again = await ensure_plan(engine, inputs, _options())
    assert again.replanned == "consents loaded again since the plan was made"
    assert (await ensure_plan(engine, inputs, _options())).replanned is None  # re-made once


async def test_an_override_replans_today_when_the_saved_plan_gave_it_nothing(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture,
) -> None:
    # `plan --save` at 07:00: the window 00:00-06:00 is over, today gets no capacity
    await _saved_plan(engine, '["0000:0600"]', when=AFTER_WINDOW, consents=60)
    assert (await load_day_plan(engine, day=DAY))["BANK000000"].batch_quota == 0
    override = (parse_window("2000:2030", step=1),)
    options = _options(window_override=override)
    inputs = await read_inputs(engine, cipher=CIPHER,
                               clock=FakeClock(AFTER_WINDOW + timedelta(hours=1)),
                               options=options)
    with caplog.at_level(logging.INFO, logger="mydata.run"):
        plans = await ensure_plan(engine, inputs, options)
    plan = plans.plans["BANK000000"]
    assert plan.batch_quota > 0
    assert set(plan.minutes) <= set(range(20 * 60, 20 * 60 + 30))
    assert sum(plan.minutes.values()) == plan.batch_quota
    assert plans.replanned is not None and "window override 2000:2030" in plans.replanned
    assert any("window override 2000:2030" in str(getattr(r, "reason", ""))
               for r in caplog.records)


# --- step 3: build each provider's pieces -------------------------------------------------

def test_planned_minutes_outside_the_windows_in_force_are_cut() -> None:
    plan = DayPlan("BANK000001", DAY, 6, {59: 2, 60: 2, 61: 2}, limits_key="0000:0100|1|1")
    open_ = day_minutes(parse_windows(["0100:0700"]))
    assert provider_minutes(plan, open_, per_minute_cap=10) == {60: 2, 61: 2}
    assert provider_minutes(plan, open_, per_minute_cap=10, override=True) == {60: 2, 61: 2}
    assert provider_minutes(None, [60], per_minute_cap=10) == {}


def test_under_an_override_a_plan_of_unknown_origin_is_spread_over_the_override() -> None:
    old = DayPlan("BANK000001", DAY, 6, {59: 6})           # saved by an older version
    assert provider_minutes(old, [600, 601], per_minute_cap=10, override=True) == {
        600: 3, 601: 3}
    assert provider_minutes(old, [600, 601], per_minute_cap=10) == {}


async def test_build_gives_each_dispatcher_only_minutes_inside_its_current_windows(
    engine: AsyncEngine,
) -> None:
    early = datetime(2026, 11, 30, 0, 10, tzinfo=KST)
    await _saved_plan(engine, '["0000:0600"]', when=early)
    await _reload(engine, '["0300:0900"]', early)
    inputs = await read_inputs(engine, cipher=CIPHER, clock=FakeClock(early), options=_options())
    stale = DayPlans(await load_day_plan(engine, day=DAY))  # as if the plan were run as is
    assert min(stale.plans["BANK000000"].minutes) < 180
    pieces = build_pieces(inputs, stale, _options(), engine=engine, cipher=CIPHER,
                          clock=FakeClock(early),
                          attempted_before={},
                          http_factory=lambda n: httpx.AsyncClient())
    try:
        (d,) = pieces.dispatchers
        assert d.minutes and min(d.minutes) >= 180 and max(d.minutes) < 360
        assert set(pieces.chains) == {"BANK000000"}
    finally:
        await pieces.http.aclose()


async def test_concurrency_caps_each_providers_bulkhead_below_its_max_concurrency(
    engine: AsyncEngine,
) -> None:
    clock, inputs, plans = await _planned(engine)
    limits = {}
    for cap in (None, 3, 500):
        pieces = build_pieces(inputs, plans, _options(concurrency=cap), engine=engine,
                              cipher=CIPHER, clock=clock, attempted_before={},
                              http_factory=lambda n: httpx.AsyncClient())
        limits[cap] = {org: c.bulkhead.limit for org, c in pieces.chains.items()}
        await pieces.http.aclose()
    assert limits[None] == {p.org_code: p.max_concurrency for p in inputs.providers}
    assert set(limits[3].values()) == {3}
    assert limits[500] == limits[None]  # a cap above the provider's limit changes nothing
    with pytest.raises(ValueError, match="concurrency"):
        _options(concurrency=0)


async def test_build_gives_the_ith_of_n_providers_its_phase_and_slice_offset(
    engine: AsyncEngine,
) -> None:
    toml = institutions_toml(free_ports(3), industries=("bank", "card", "invest"))
    await populate(engine, parse_institutions(toml), per_provider=20, now=AFTER_WINDOW)
    await save_plan(engine, await build_week_plan(engine, week_of=DAY, today=DAY,
                                                  now=AFTER_WINDOW))
    clock = FakeClock(AFTER_WINDOW)
    inputs = await read_inputs(engine, cipher=CIPHER, clock=clock, options=_options())
    plans = await ensure_plan(engine, inputs, _options())
    pieces = build_pieces(inputs, plans, _options(), engine=engine, cipher=CIPHER,
                          clock=clock, attempted_before={},
                          http_factory=lambda n: httpx.AsyncClient())
    try:
        n = len(inputs.providers)
        assert n == 3 and len(pieces.dispatchers) == n
        for i, d in enumerate(pieces.dispatchers):
            assert d._period_phase == i / n
            assert d._offset == pytest.approx(slice_offset(i) * SLICE_SECONDS)
    finally:
        await pieces.http.aclose()


async def _planned(engine: AsyncEngine) -> tuple[FakeClock, RunInputs, DayPlans]:
    """After the windows: a saved plan, the run's inputs and its plans (steps 1 and 2)."""
    await _saved_plan(engine, '["0000:0600"]', when=AFTER_WINDOW)
    clock = FakeClock(AFTER_WINDOW)
    inputs = await read_inputs(engine, cipher=CIPHER, clock=clock, options=_options())
    return clock, inputs, await ensure_plan(engine, inputs, _options())


# --- step 4 and 5: execute, record; a failed run --------------------------------------------

async def test_execute_with_nothing_planned_ends_at_once_and_writes_everything(
    engine: AsyncEngine,
) -> None:
    clock, inputs, plans = await _planned(engine)
    pieces = build_pieces(inputs, plans, _options(), engine=engine, cipher=CIPHER,
                          clock=clock,
                          attempted_before={}, http_factory=lambda n: httpx.AsyncClient())
    done = await execute(pieces, _options(), clock=clock, day=DAY, stream=io.StringIO(),
                         install_signals=False)
    assert (done.interrupted, done.persisted, done.unwritten) == (False, True, 0)
    assert pieces.http.is_closed


async def test_a_run_that_records_its_summary_closes_the_row_done(engine: AsyncEngine) -> None:
    await _saved_plan(engine, '["0000:0600"]', when=AFTER_WINDOW)
    summary = await _run(engine)
    async with engine.connect() as conn:
        row = (await conn.execute(select(schema.runs))).one()
    assert (row.status, row.error) == ("done", None)
    assert row.finished_at is not None
    from batch.dispatch.summary import RunSummary
    assert RunSummary.from_json(row.summary) == summary


async def test_a_run_that_ends_on_an_error_is_closed_as_failed_with_the_reason(
    engine: AsyncEngine,
) -> None:
    await _saved_plan(engine, '["0000:0600"]', when=AFTER_WINDOW)

    def broken(n: int) -> httpx.AsyncClient:
        raise OSError("no file descriptors left")

    with pytest.raises(OSError):
        await run_day(engine, cipher=CIPHER, clock=FakeClock(AFTER_WINDOW), options=_options(),
                      stream=io.StringIO(), install_signals=False, http_factory=broken)
    async with engine.connect() as conn:
        row = (await conn.execute(select(schema.runs))).one()
    assert row.status == "failed"
    assert row.finished_at is not None
    assert "no file descriptors left" in row.error


async def test_every_step_logs_a_line(engine: AsyncEngine,
                                      caplog: pytest.LogCaptureFixture) -> None:
    await _saved_plan(engine, '["0000:0600"]', when=AFTER_WINDOW)
    with caplog.at_level(logging.INFO, logger="mydata.run"):
        await _run(engine)
    steps = [getattr(r, "action", "") for r in caplog.records
             if str(getattr(r, "action", "")).startswith("step_")]
    assert steps == ["step_read_inputs", "step_plan", "step_build", "step_execute",
                     "step_record"]


async def test_a_run_whose_week_plan_cannot_place_consents_needs_attention(
    engine: AsyncEngine,
) -> None:
    # Saturday 07:00: the week's last window (00:00-06:00) is over, so the consents still
    # due miss their week. The run must say so and exit 1, not report a clean day.
    saturday = datetime(2026, 12, 5, 7, 0, tzinfo=KST)
    insts = make_institutions(free_ports(1), industries=("bank",))
    await populate(engine, insts, per_provider=12, now=saturday - timedelta(days=5), quota=12)
    res = await run_day(engine, cipher=CIPHER, clock=FakeClock(saturday), options=_options(),
                        stream=io.StringIO(), install_signals=False)
    (p,) = res.summary.providers
    assert p.count("unplaceable_this_week") == 12
    assert (res.exit_code, res.summary.status) == (1, "incomplete")
    from batch.dispatch.summary import format_summary
    assert "cannot place (they miss their week): BANK000000 12" in format_summary(res.summary)


async def test_the_quota_left_is_deferred_only_while_that_many_are_still_due(
    engine: AsyncEngine,
) -> None:
    # planned at 00:05; run at 07:00, the day's window (00:00-06:00) over: the whole day's
    # quota is left
    from batch.db.revocation import revoke
    from batch.dispatch.summary import format_summary

    await _saved_plan(engine, '["0000:0600"]', when=AFTER_WINDOW - timedelta(hours=6, minutes=55))
    (p,) = (s := await _run(engine)).providers  # type: ignore[attr-defined]
    quota = p.count("planned")
    assert quota > 3 and (p.count("deferred"), p.extra["no_longer_due"]) == (quota, 0)
    assert (s.exit_code, s.status) == (1, "incomplete")
    async with engine.connect() as conn:
        ids = sorted((await conn.execute(select(schema.consents.c.id))).scalars().all())
    # all but 3 revoked since the plan was made: 3 are deferred, the rest no longer due
    await revoke(engine, now=AFTER_WINDOW, ids=ids[3:])
    (p,) = (s := await _run(engine)).providers  # type: ignore[attr-defined]
    assert (p.count("deferred"), p.extra["no_longer_due"]) == (3, quota - 3)
    assert (s.exit_code, s.status) == (1, "incomplete")
    assert f"no longer due (revoked, or refreshed by another run, meanwhile; not " \
           f"deferred): {p.org_code} {quota - 3}" in format_summary(s)
    # all revoked: nothing deferred, and the day is done
    await revoke(engine, now=AFTER_WINDOW, ids=ids[:3])
    (p,) = (s := await _run(engine)).providers  # type: ignore[attr-defined]
    assert (p.count("deferred"), p.extra["no_longer_due"]) == (0, quota)
    assert (s.exit_code, s.status) == (0, "done")


async def test_a_run_that_left_outcomes_unwritten_does_not_count_what_is_still_due(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the database is likely gone: the count would wait out a connect timeout, and the run
    # needs an operator whatever it says
    from dataclasses import replace

    import batch.dispatch.runner as runner
    from batch.db import work

    await _saved_plan(engine, '["0000:0600"]', when=AFTER_WINDOW - timedelta(hours=6, minutes=55))
    real = runner.execute
    counted: list[object] = []

    async def unwritten(*a: object, **k: object) -> runner.Execution:
        return replace(await real(*a, **k), persisted=False, unwritten=5)  # type: ignore[arg-type]

    async def count(*a: object, **k: object) -> dict[str, int]:
        counted.append(k)
        return {}

    monkeypatch.setattr(runner, "execute", unwritten)
    monkeypatch.setattr(work, "still_due", count)
    (p,) = (s := await _run(engine)).providers  # type: ignore[attr-defined]
    assert counted == []
    assert "no_longer_due" not in p.extra and p.count("deferred") == p.count("planned") > 0
    assert (s.exit_code, s.status, s.outcomes_persisted) == (1, "incomplete", False)


def test_the_heap_made_before_dispatching_is_frozen_and_thawed_after() -> None:
    import gc

    from batch.dispatch import runner

    before = gc.get_threshold()
    old = runner._freeze_heap()
    try:
        assert old == before
        assert gc.get_freeze_count() > 0  # the setup's objects: out of every collection
        assert gc.get_threshold()[0] == max(before[0], runner.GC_YOUNG)
        assert runner._freeze_heap() is None  # frozen already: nothing changed twice
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    gc.disable()
    try:
        assert runner._freeze_heap() is None  # the embedding program manages the collector
    finally:
        gc.enable()
    with runner.frozen_heap():
        assert gc.get_freeze_count() > 0 and gc.get_threshold()[0] >= runner.GC_YOUNG
    assert (gc.get_freeze_count(), gc.get_threshold()) == (0, before)
