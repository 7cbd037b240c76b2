"""The page: numbers in the right day's cell, safe text, no external resources."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.dashboard.data import load_snapshot
from batch.dashboard.figures import summary
from batch.dashboard.page import write_dashboard
from batch.dashboard.render import num, render_page
from batch.db import schema
from tests.dashboard.conftest import ACCESS, BANK, CARD, EVIL, NOW, REFRESH, WEEK, Tables, Week


async def page_for(week: Week) -> str:
    return render_page(await load_snapshot(week.engine, week=WEEK, now=NOW))


async def test_each_days_numbers_sit_in_that_days_column(week: Week) -> None:
    tables = Tables(await page_for(week))
    head = tables.tables[f"load-{BANK}"][0]
    assert head[1:] == ["unit", "Sun 11-29", "Mon 11-30", "Tue 12-01", "Wed 12-02", "Thu 12-03",
                        "Fri 12-04", "Sat 12-05", "Week"]
    bank = f"load-{BANK}"
    assert tables.row(bank, "User calls, forecast", "calls") == [
        "11,000", "21,000", "31,000", "41,000", "51,000", "61,000", "71,000", "287,000"]
    assert tables.row(bank, "User calls, actual", "calls") == [
        "12,345", "22,222", "—", "—", "—", "—", "—", "34,567"]
    assert tables.row(bank, "Batch planned", "consents") == [
        "9,000", "8,000", "7,000", "6,000", "5,000", "4,000", "3,000", "42,000"]
    assert tables.row(bank, "Batch planned", "calls") == [
        "27,000", "24,000", "21,000", "18,000", "15,000", "12,000", "9,000", "126,000"]
    assert tables.row(bank, "Batch done", "consents") == [
        "4", "3", "1", "0", "0", "0", "0", "8"]
    assert tables.row(bank, "Batch calls made", "calls") == [
        "12", "9", "13", "—", "—", "—", "—", "34"]
    assert tables.row(bank, "User + batch, planned", "calls") == [
        "39,345", "46,222", "52,000", "59,000", "66,000", "73,000", "80,000", "415,567"]
    assert tables.row(bank, "User + batch, actual", "calls") == [
        "12,357", "22,231", "31,013", "—", "—", "—", "—", "65,601"]
    assert tables.row(f"load-{CARD}", "Unplaceable", "consents") == ["0"] * 6 + ["777", "777"]
    assert tables.row("load-all", "User + batch, planned", "calls") == [
        "41,145", "49,022", "55,800", "63,800", "71,800", "79,800", "90,200", "451,567"]


async def test_every_load_row_names_its_unit(week: Week) -> None:
    tables = Tables(await page_for(week))
    for table in ("load-all", f"load-{BANK}", f"load-{CARD}"):
        units = {r[1] for r in tables.tables[table][1:]}
        assert units == {"calls", "consents"}, table


async def test_flatness_table_shows_plan_and_uniform_ratios_in_calls(week: Week) -> None:
    tables = Tables(await page_for(week))
    # CARD at 2 calls per consent: user + batch calls 1,800..6,800 and 10,200 (mean
    # 36,000/7); uniform: users + 6,600/7 batch calls a day
    card = tables.row("flatness", CARD)
    assert card[0] == f"{10_200 / (36_000 / 7):.2f}×"
    assert card[1] == f"{(7_200 + 6_600 / 7) / (36_000 / 7):.2f}×"
    assert card[2] == "Sat 12-05"
    assert card[3] == "25.3 % higher"  # this fixture's plan is worse than a 1/7 split


async def test_today_shows_behind_plan_and_the_header_says_so(week: Week) -> None:
    page = await page_for(week)
    tables = Tables(page)
    assert tables.tables["progress-table"][0][1:4] == [
        "Planned, consents", "Expected by now, consents", "Done, consents"]
    assert tables.row("progress-table", BANK)[:3] == ["7,000", "3,500", "1"]
    assert "behind plan" in tables.row("progress-table", BANK)[-1]
    assert "in progress" in tables.row("progress-table", CARD)[-1]
    assert "1 behind plan" in page
    assert "1 dead letter open" in page and "777 unplaceable" in page
    assert "run-2" in page.split("</header>")[0]  # latest run in the header


async def test_text_from_the_database_is_escaped(week: Week) -> None:
    page = await page_for(week)
    assert EVIL not in page and "<script" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page


async def test_tokens_never_appear_in_page_or_json(week: Week) -> None:
    snap = await load_snapshot(week.engine, week=WEEK, now=NOW)
    for text in (render_page(snap, refresh_seconds=5), json.dumps(summary(snap))):
        assert ACCESS not in text and REFRESH not in text and "TOKEN" not in text


async def test_page_loads_nothing_from_outside(week: Week) -> None:
    page = await page_for(week)
    assert not re.search(r"""(src|href)\s*=""", page)
    assert "@import" not in page and "url(" not in page
    # the only URL is the SVG namespace, which is a name, not a fetch
    assert set(re.findall(r"https?://[^\s\"']+", page)) == {"http://www.w3.org/2000/svg"}
    assert "default-src 'none'" in page


async def test_empty_database_page_says_to_save_a_plan(engine: AsyncEngine) -> None:
    page = render_page(await load_snapshot(engine, week=WEEK, now=NOW))
    assert "No plan saved for this week" in page and "mydata-batch plan --save" in page
    assert "No institutions are loaded" in page and "mydata-batch db init" in page
    assert "Run health" in page and "<svg" not in page


async def test_providers_without_a_plan_page_says_run_plan_save(week: Week) -> None:
    later = await load_snapshot(week.engine, week=WEEK + timedelta(days=14), now=NOW)
    page = render_page(later)
    assert "No plan saved for this week" in page and "mydata-batch plan --save" in page
    assert "2026-12-13" in page and "<svg" not in page
    assert "No institutions are loaded" not in page


def test_numbers_have_thousands_separators() -> None:
    assert num(1_234_567) == "1,234,567"
    assert num(None) == "—"
    assert num(0) == "0"


async def test_write_dashboard_writes_the_page_for_the_demo(week: Week, tmp_path: Path) -> None:
    out = await write_dashboard(week.engine, tmp_path / "d.html", now=NOW)
    assert out == tmp_path / "d.html"
    assert Tables(out.read_text(encoding="utf-8")).row(
        f"load-{CARD}", "Batch planned", "consents")[-2:] == ["1,500", "3,300"]


async def test_a_running_run_without_news_for_hours_is_flagged_stale(week: Week) -> None:
    fresh = render_page(await load_snapshot(week.engine, week=WEEK, now=NOW))
    late = render_page(await load_snapshot(week.engine, week=WEEK,
                                           now=NOW + timedelta(hours=10)))
    assert "stale" not in fresh
    # run-2 started 01:00 KST on Tuesday and never finished; at 13:00 it is 12 h old
    assert "running, stale 12 h" in late.split("</header>")[0]


async def test_options_the_planner_refuses_are_flagged_on_the_page(week: Week) -> None:
    async with week.engine.begin() as conn:
        await conn.execute(update(schema.institutions)
                           .where(schema.institutions.c.org_code == CARD)
                           .values(options="not json"))
    page = await page_for(week)
    assert "1 institution options refused" in page.split("</header>")[0]
    assert f"institution {CARD}: options are not JSON" in page
    # its batch calls assume the default 3 calls per consent: 300 consents, 900 calls
    assert Tables(page).row(f"load-{CARD}", "Batch planned", "calls")[0] == "900"


async def test_overdue_consents_show_per_provider_in_the_header_table_and_json(
        week: Week) -> None:
    today = WEEK + timedelta(days=2)
    async with week.engine.begin() as conn:
        await conn.execute(update(schema.plan_days).where(
            schema.plan_days.c.org_code == CARD, schema.plan_days.c.day >= today)
            .values(overdue=40))
        # an earlier day's count is history, not what is still overdue
        await conn.execute(update(schema.plan_days).where(
            schema.plan_days.c.org_code == BANK, schema.plan_days.c.day < today)
            .values(overdue=99))
    snap = await load_snapshot(week.engine, week=WEEK, now=NOW)
    assert (snap.overdue(CARD), snap.overdue(BANK)) == (5 * 40, 0)
    page = render_page(snap)
    assert f"overdue: {CARD} 200" in page
    assert "Overdue (earlier week)" in page
    by_org = {p["org_code"]: p for p in summary(snap)["providers"]}
    assert (by_org[CARD]["overdue_consents"], by_org[BANK]["overdue_consents"]) == (200, 0)


async def test_a_failed_run_shows_its_reason(week: Week) -> None:
    async with week.engine.begin() as conn:
        run_id = (await conn.execute(schema.runs.select().limit(1))).first().run_id
        await conn.execute(update(schema.runs).where(schema.runs.c.run_id == run_id)
                           .values(status="failed", error="DatabaseError: disk full"))
    snap = await load_snapshot(week.engine, week=WEEK, now=NOW)
    page = render_page(snap)
    assert 'title="DatabaseError: disk full">failed</span>' in page
    assert {r["error"] for r in summary(snap)["runs"]} >= {"DatabaseError: disk full"}


async def test_a_runs_quota_no_longer_due_has_its_own_column(week: Week) -> None:
    async with week.engine.begin() as conn:
        row = (await conn.execute(schema.runs.select().where(
            schema.runs.c.run_id == "run-1"))).one()
        doc = json.loads(row.summary)
        doc["providers"][0]["no_longer_due"] = 1_234
        await conn.execute(update(schema.runs).where(schema.runs.c.run_id == "run-1")
                           .values(summary=json.dumps(doc)))
    snap = await load_snapshot(week.engine, week=WEEK, now=NOW)
    page = render_page(snap)
    head = page.split("<th class=n>Deferred</th>")[1]
    assert head.startswith("<th class=n title=") and "No longer due</th>" in head
    # run-1: deferred 10, then 1,234 no longer due, then 3 dead-lettered
    assert "<td class=n>10</td><td class=n>1,234</td><td class=n>3</td>" in page
    assert {r["run_id"]: (r["totals"] or {}).get("no_longer_due")
            for r in summary(snap)["runs"]} == {"run-1": 1234, "run-2": None}
    assert '<td class="muted" colspan=7>no summary</td>' in page
