"""The snapshot and the numbers derived from it, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import date, timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.dashboard.data import (
    DayLoad,
    Snapshot,
    focus_day_for,
    load_snapshot,
    parse_run_totals,
)
from batch.dashboard.figures import (
    ALL,
    DAY_KEYS,
    Status,
    day_loads,
    flatness,
    load_frame,
    peak_to_mean,
    progress,
    summary,
)
from batch.db import schema
from batch.planner import DEFAULT_CALLS_PER_CONSENT
from tests.dashboard.conftest import (
    ACCESS,
    BANK,
    CARD,
    NOW,
    REFRESH,
    TODAY,
    WEEK,
    Week,
)


async def test_snapshot_holds_each_days_plan_usage_and_done_per_provider(week: Week) -> None:
    snap = await load_snapshot(week.engine, week=TODAY, now=NOW)
    assert snap.week_start == WEEK and snap.today == TODAY and snap.focus_day == TODAY
    assert snap.providers == (BANK, CARD)
    assert dict(snap.calls_per_consent) == {BANK: 3.0, CARD: 2.0}
    bank = day_loads(snap, BANK)
    assert [x.user_calls for x in bank] == [12_345, 22_222, 31_000, 41_000, 51_000, 61_000,
                                            71_000]
    assert [x.batch_quota for x in bank] == [9_000, 8_000, 7_000, 6_000, 5_000, 4_000, 3_000]
    assert [x.batch_done for x in bank] == [4, 3, 1, 0, 0, 0, 0]
    assert day_loads(snap, CARD)[6].unplaceable == 777


async def test_user_plus_batch_is_in_calls_with_each_providers_calls_per_consent(
        week: Week) -> None:
    snap = await load_snapshot(week.engine, week=WEEK, now=NOW)
    bank, card = day_loads(snap, BANK), day_loads(snap, CARD)
    # BANK: 3 calls per consent (the default); CARD: 2 (its options)
    assert [x.batch_planned_calls for x in bank] == [27_000, 24_000, 21_000, 18_000, 15_000,
                                                     12_000, 9_000]
    assert [x.batch_planned_calls for x in card] == [600] * 6 + [3_000]
    assert [x.total_planned_calls for x in card] == [1_800, 2_800, 3_800, 4_800, 5_800,
                                                     6_800, 10_200]
    assert [x.total_planned_calls for x in bank][:2] == [12_345 + 27_000, 22_222 + 24_000]


async def test_batch_calls_made_count_every_outcome_and_only_run_days_have_actuals(
        week: Week) -> None:
    snap = await load_snapshot(week.engine, week=WEEK, now=NOW)
    bank, card = day_loads(snap, BANK), day_loads(snap, CARD)
    # Tuesday: 1 done (3 calls) and 5 retry_later (2 calls each); done counts only the 1
    assert [x.batch_calls_made for x in bank] == [12, 9, 13, 0, 0, 0, 0]
    assert [x.batch_done for x in bank][:3] == [4, 3, 1]
    assert [x.total_actual_calls for x in bank] == [12_357, 22_231, 31_013] + [None] * 4
    # CARD ran nothing on Sunday and Monday (past days: user + 0); 2 done today
    assert [x.total_actual_calls for x in card] == [1_200, 2_200, 3_206] + [None] * 4


async def test_total_sums_providers_with_actual_usage_where_known(week: Week) -> None:
    snap = await load_snapshot(week.engine, week=WEEK, now=NOW)
    total = day_loads(snap, ALL)
    assert [x.total_planned_calls for x in total] == [
        12_345 + 27_000 + 1_800, 22_222 + 24_000 + 2_800, 52_000 + 3_800, 59_000 + 4_800,
        66_000 + 5_800, 73_000 + 6_800, 80_000 + 10_200]
    assert (total[0].batch_planned_calls, total[0].batch_quota) == (27_600, 9_300)
    assert [x.batch_done for x in total] == [4, 3, 3, 0, 0, 0, 0]
    assert [x.batch_calls_made for x in total] == [12, 9, 19, 0, 0, 0, 0]
    assert total[0].forecast_user_calls == 11_000 + 1_200
    assert total[0].actual_user_calls == 12_345 + 1_200  # CARD has no actual: its forecast
    assert total[3].actual_user_calls is None


async def test_run_health_reads_runs_outcomes_and_only_open_dead_letters(week: Week) -> None:
    snap = await load_snapshot(week.engine, week=WEEK, now=NOW)
    assert [r.run_id for r in snap.runs] == ["run-2", "run-1"]  # latest first
    assert snap.runs[1].totals is not None and snap.runs[1].totals.attempted == 8_290
    assert snap.runs[0].totals is None
    by = {(o.org_code, o.kind, o.action): (o.count, o.calls) for o in snap.outcomes}
    assert by == {(BANK, "success", "done"): (1, 3), (BANK, "fault", "retry_later"): (5, 10),
                  (CARD, "success", "done"): (2, 6)}
    assert [(g.org_code, g.count) for g in snap.dead_letter_groups] == [(BANK, 1)]
    assert [d.attempts for d in snap.dead_letters] == [5]


async def test_today_is_behind_plan_when_done_trails_the_minute_plan(week: Week) -> None:
    snap = await load_snapshot(week.engine, week=WEEK, now=NOW)
    assert dict(snap.expected_by_now) == {BANK: 3_500}
    rows = {p.org_code: p for p in progress(snap)}
    assert rows[BANK].status is Status.BEHIND
    assert (rows[BANK].planned, rows[BANK].done) == (7_000, 1)
    assert rows[CARD].status is Status.IN_PROGRESS  # no minute plan: no expectation


async def test_a_past_week_focuses_on_its_last_day(week: Week) -> None:
    snap = await load_snapshot(week.engine, week=WEEK, now=NOW + timedelta(days=14))
    assert snap.focus_day == WEEK + timedelta(days=6)
    assert snap.expected_by_now == ()
    assert {p.status for p in progress(snap)} == {Status.BEHIND}  # Saturday: nothing done


async def test_the_tokens_are_never_in_the_snapshot_or_json(week: Week) -> None:
    snap = await load_snapshot(week.engine, week=WEEK, now=NOW)
    text = repr(snap) + json.dumps(summary(snap)) + load_frame(snap).to_csv()
    assert ACCESS not in text and REFRESH not in text
    assert "TOKEN" not in text


async def test_empty_database_gives_an_empty_week(engine: AsyncEngine) -> None:
    snap = await load_snapshot(engine, week=WEEK, now=NOW)
    assert not snap.has_plan and snap.providers == () and snap.loads == ()


def test_peak_to_mean_is_max_over_mean() -> None:
    assert peak_to_mean([1, 1, 1, 1]) == 1.0
    assert peak_to_mean([0, 0, 4, 0]) == 4.0
    assert peak_to_mean([0, 0]) is None
    assert peak_to_mean([]) is None


def test_flatness_compares_the_plan_with_a_uniform_split_in_calls() -> None:
    days = [date(2026, 11, 29) + timedelta(days=i) for i in range(7)]
    # user load high at the start; the plan fills the quiet days (2 calls per consent)
    users = [70, 60, 50, 40, 30, 20, 10]
    quotas = [0, 5, 10, 15, 20, 25, 30]
    loads = [DayLoad(BANK, d, u, None, q, 0, batch_planned_calls=2 * q)
             for d, u, q in zip(days, users, quotas, strict=True)]
    f = flatness(loads)
    assert f.planned == pytest.approx(1.0)
    # uniform: 210 calls / 7 = 30 a day on top of the users: peak 100 over mean 70
    assert f.uniform == pytest.approx(100 / 70)
    assert f.improvement == pytest.approx(1 - 70 / 100)


def test_a_day_load_refuses_a_quota_without_its_calls() -> None:
    with pytest.raises(ValueError, match="both known"):
        DayLoad(BANK, WEEK, 1, None, 10, 0)


async def test_an_institution_the_planner_would_refuse_is_reported_not_hidden(
        week: Week) -> None:
    async with week.engine.begin() as conn:
        await conn.execute(update(schema.institutions)
                           .where(schema.institutions.c.org_code == CARD)
                           .values(options='{"calls_per_consent": -1}'))
    snap = await load_snapshot(week.engine, week=WEEK, now=NOW)
    assert len(snap.config_errors) == 1 and CARD in snap.config_errors[0]
    assert "calls_per_consent" in snap.config_errors[0]
    assert snap.cpc(CARD) == DEFAULT_CALLS_PER_CONSENT
    assert summary(snap)["config_errors"] == list(snap.config_errors)


async def test_json_names_the_unit_of_every_day_number(week: Week) -> None:
    doc = summary(await load_snapshot(week.engine, week=WEEK, now=NOW))
    card = next(p for p in doc["providers"] if p["org_code"] == CARD)
    day = card["days"][2]
    assert set(day) == {"date", *DAY_KEYS}
    assert all(k.endswith(("_calls", "_consents")) for k in DAY_KEYS)
    assert (day["batch_planned_consents"], day["batch_planned_calls"]) == (300, 600)
    assert (day["batch_done_consents"], day["batch_actual_calls"]) == (2, 6)
    assert (day["user_plus_batch_planned_calls"], day["user_plus_batch_actual_calls"]) == (
        3_800, 3_206)
    assert card["days"][3]["user_plus_batch_actual_calls"] is None
    assert card["calls_per_consent"] == 2.0
    assert card["peak_to_mean_calls"] == round(10_200 / (36_000 / 7), 4)


def test_run_totals_are_read_from_the_typed_summary_and_ignore_other_shapes() -> None:
    from batch.dispatch.summary import RunSummary
    from tests.dispatch.test_summary import provider_stats

    assert parse_run_totals(None) is None
    assert parse_run_totals("not json") is None
    assert parse_run_totals('{"providers": [{"planned": "many"}]}') is None
    # the ad-hoc shape of old is no longer guessed at: no run_id, no org_code
    assert parse_run_totals('{"providers": [{"planned": 2}, {"planned": 3, "failed": 1}]}') \
        is None
    summary = RunSummary(run_id="r1", date="2026-11-30", week_start="2026-11-29",
                         worker_id="w", status="done", exit_code=0, elapsed_seconds=1.0,
                         providers=(provider_stats("BANK000001", planned=2),
                                    provider_stats("BANK000002", planned=3, failed=1)))
    totals = parse_run_totals(summary.dumps())
    assert totals is not None and (totals.planned, totals.failed) == (5, 1)
    assert totals.no_longer_due == 0  # a summary from before the count: none
    doc = summary.to_json()
    doc["providers"][0]["no_longer_due"] = 4
    doc["providers"][1]["no_longer_due"] = 2
    gone = parse_run_totals(json.dumps(doc))
    assert gone is not None and gone.no_longer_due == 6


def test_focus_day_is_today_inside_the_week_else_its_nearest_end() -> None:
    assert focus_day_for(WEEK, TODAY) == TODAY
    assert focus_day_for(WEEK, TODAY + timedelta(days=30)) == WEEK + timedelta(days=6)
    assert focus_day_for(WEEK, WEEK - timedelta(days=30)) == WEEK


def test_snapshot_rejects_a_week_start_that_is_not_sunday() -> None:
    with pytest.raises(ValueError, match="not a Sunday"):
        Snapshot(TODAY, TODAY, TODAY, NOW, (), (), (), (), (), ())
