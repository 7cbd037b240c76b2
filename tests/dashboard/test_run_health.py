"""The run-health section: per provider, per minute, from run_minutes; escaped; no token."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from batch.dashboard.health_data import load_run_health
from batch.dashboard.health_figures import totals
from batch.dashboard.health_render import run_health_section
from batch.dashboard.page import dashboard_html
from tests.dashboard.conftest import ACCESS, BANK, CARD, EVIL, NOW, REFRESH, TODAY, Tables, Week
from tests.dashboard.health_rows import RUN, add_minutes


async def test_the_latest_run_of_the_day_is_read_per_provider_per_minute(week: Week) -> None:
    await add_minutes(week.engine)
    health = await load_run_health(week.engine, day=TODAY, now=NOW)
    assert health.run_id == RUN
    assert health.providers() == sorted([BANK, CARD, EVIL[:10]])
    bank = totals(BANK, health.of(BANK))
    assert (bank.planned, bank.calls, bank.open_minutes) == (1200, 4 * 100 + 5 * 95, 3.0)
    assert bank.retried == 2 * 4 + sum(10 + 8 * i for i in (4, 5, 9, 10, 11))
    assert bank.p99_latency_ms == 80.0 + 400 * 11
    assert bank.by_kind["rejected"] == 3 * 40
    assert health.state.dead_letters == {BANK: 1}


async def test_the_page_shows_run_health_charts_and_the_backlog_escaped(week: Week) -> None:
    await add_minutes(week.engine)
    page = await dashboard_html(week.engine, now=NOW)
    assert '<section id="run-health">' in page
    # six charts per provider: planned/started, outcomes, breaker, ratios, p99, lateness
    assert page.count('class="chart"') == 6 * 3
    assert "BANK000001: breaker state per minute" in page
    t = Tables(page)
    assert t.row("run-health-totals", BANK)[:3] == ["1,200", "875", "875"]
    assert t.row("backlog", BANK)[0] == "1"
    assert EVIL not in page and "&lt;script&gt;" in page
    assert ACCESS not in page and REFRESH not in page


async def test_a_day_without_minutes_says_so(engine: AsyncEngine) -> None:
    health = await load_run_health(engine, day=TODAY, now=NOW)
    html = run_health_section(health)
    assert "No run wrote per-minute health" in html
    assert "No open dead letters, no consent overdue." in html
