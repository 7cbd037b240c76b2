from __future__ import annotations

import asyncio
import tomllib
from datetime import date
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.cli import main
from batch.config import load_institutions
from batch.db.engine import make_engine
from batch.db.schema import consents, institutions, usage_daily
from batch.seed import BACKLOG_SHARE, NEW_SHARE, SeedParams, load_seed, load_time, write_seed
from planning.calendar import next_due_week, week_start
from planning.windows import day_minutes, parse_windows
from tests.sealing import CIPHER

TODAY = date(2026, 11, 25)  # a Wednesday: three days of this week are already past


def _files(out: Path) -> list[bytes]:
    return [(out / n).read_bytes() for n in ("institutions.toml", "consents.csv", "usage.csv")]


def test_same_seed_writes_identical_files(tmp_path: Path) -> None:
    params = SeedParams(today=TODAY, consents=3000, seed=7)
    write_seed(params, tmp_path / "a")
    write_seed(params, tmp_path / "b")
    write_seed(SeedParams(today=TODAY, consents=3000, seed=8), tmp_path / "c")

    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert _files(tmp_path / "a")[1] != _files(tmp_path / "c")[1]


def test_providers_have_valid_windows_and_limits_across_industries(tmp_path: Path) -> None:
    result = write_seed(SeedParams(today=TODAY, providers=12, consents=1000), tmp_path)

    insts = load_institutions(result.files.institutions)  # the validating parser
    assert {p.industry for p in insts.providers} >= {"bank", "card", "invest", "insu",
                                                     "capital"}
    for i, p in enumerate(insts.providers):
        assert 1 <= len(p.windows) <= 3
        assert len(day_minutes(p.windows)) >= 360
        assert 50 <= p.calls_per_second <= 300 and 20 <= p.max_concurrency <= 60
        assert p.base_url == f"http://127.0.0.1:{19001 + i}"
    with result.files.institutions.open("rb") as f:
        assert tomllib.load(f)["operator_org_code"] == "OPERATOR01"


def test_consents_are_mostly_due_this_week_with_new_backlog_and_done(tmp_path: Path) -> None:
    result = write_seed(SeedParams(today=TODAY, consents=20_000), tmp_path)
    df = pd.read_csv(result.files.consents, dtype=str, keep_default_na=False)
    assert len(df) == 20_000
    assert not df.duplicated(["user_id", "org_code"]).any()
    assert df["refresh_token"].str.len().min() > 10

    this_week = week_start(TODAY)
    due = [next_due_week(pd.Timestamp(last).to_pydatetime() if last else None,
                         pd.Timestamp(c).to_pydatetime())
           for c, last in zip(df["consented_at"], df["last_scheduled_at"], strict=True)]
    share = pd.Series(due).value_counts(normalize=True)
    new = (df["last_scheduled_at"] == "").mean()
    # Wednesday: three days of the week past, a seventh of the regular consents done each
    done = 3 * (1 - NEW_SHARE - BACKLOG_SHARE) / 7
    assert abs(share.get(this_week + pd.Timedelta(days=7), 0) - done) < 0.02  # done already
    assert abs(share[this_week] - (1 - BACKLOG_SHARE - done)) < 0.02  # due now (and the new)
    assert 0.03 < new < 0.08                            # never fetched
    assert 0.01 < share[share.index < this_week].sum() < 0.1   # a small backlog
    assert (df.groupby("org_code").size().max() > 2 * df.groupby("org_code").size().min())


def test_last_fetches_fall_inside_the_providers_windows(tmp_path: Path) -> None:
    result = write_seed(SeedParams(today=TODAY, consents=2000), tmp_path)
    windows = {p.org_code: set(day_minutes(parse_windows(p.windows)))
               for p in result.providers}
    df = pd.read_csv(result.files.consents, dtype=str, keep_default_na=False)
    fetched = df[df["last_scheduled_at"] != ""]
    for org, text in zip(fetched["org_code"], fetched["last_scheduled_at"], strict=True):
        t = pd.Timestamp(text)
        assert t.hour * 60 + t.minute in windows[org]


def test_usage_history_shows_weekday_payday_and_month_end_effects(tmp_path: Path) -> None:
    result = write_seed(SeedParams(today=TODAY, providers=5, consents=20_000, weeks=16),
                        tmp_path)
    df = pd.read_csv(result.files.usage, parse_dates=["date"])
    assert df["date"].max() == pd.Timestamp(TODAY) - pd.Timedelta(days=1)
    assert df.groupby("org_code").size().eq(16 * 7).all()
    ratio: dict[str, float] = {}
    by_industry = {p.org_code: p.industry for p in result.providers}
    for org, g in df.groupby("org_code"):
        weekend = g["date"].dt.day_of_week >= 5
        ratio[by_industry[str(org)]] = (g.loc[~weekend, "user_calls"].mean()
                                        / g.loc[weekend, "user_calls"].mean())
        weekdays = g[~weekend]
        payday = weekdays["date"].dt.day.between(23, 25)
        assert weekdays.loc[payday, "user_calls"].mean() > 1.05 * weekdays.loc[
            ~payday, "user_calls"].mean()
    assert all(r > 1.15 for r in ratio.values())
    assert ratio["invest"] > 2 * ratio["bank"] - 1       # securities trade on weekdays
    card = df[df["org_code"] == next(o for o, i in by_industry.items() if i == "card")]
    end = card["date"].dt.is_month_end | (card["date"].dt.day == 1)
    mid = card["date"].dt.day.between(8, 18)
    assert card.loc[end, "user_calls"].mean() > 1.1 * card.loc[mid, "user_calls"].mean()


async def test_seed_files_load_through_the_loaders(engine: AsyncEngine, tmp_path: Path) -> None:
    result = write_seed(SeedParams(today=TODAY, consents=5000), tmp_path)
    counts = await load_seed(engine, result.files, cipher=CIPHER, now=load_time(TODAY, pd.Timestamp(
        "2026-11-25T13:00:00+09:00").to_pydatetime()))

    assert counts == (5, 5000, 5 * 8 * 7)
    async with engine.connect() as conn:
        got = [int((await conn.execute(select(func.count()).select_from(t))).scalar_one())
               for t in (institutions, consents, usage_daily)]
        per_org = dict((await conn.execute(
            select(consents.c.org_code, func.count()).group_by(consents.c.org_code))).all())
    assert got == [5, 5000, 280]
    assert {k.strip(): v for k, v in per_org.items()} == {
        p.org_code: p.consents for p in result.providers}


def test_seed_command_writes_loads_and_summarises(db_url: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["--db", db_url, "seed", "--consents", "3000",
                                    "--today", "2026-11-25", "--out", str(out)])
    assert res.exit_code == 0, res.stderr
    assert "seeded 5 providers, 3000 consents" in res.stdout
    assert (out / "consents.csv").exists()

    async def count() -> int:
        engine = make_engine(db_url)
        try:
            async with engine.connect() as conn:
                return int((await conn.execute(
                    select(func.count()).select_from(consents))).scalar_one())
        finally:
            await engine.dispose()

    assert asyncio.run(count()) == 3000


@pytest.mark.parametrize("bad", [["--providers", "0"], ["--today", "25/11/2026"],
                                 ["--base-port", "65535", "--providers", "5"]])
def test_seed_refuses_bad_options_with_exit_2(tmp_path: Path, bad: list[str]) -> None:
    res = CliRunner().invoke(main, ["--db", str(tmp_path / "x.db"), "seed",
                                    "--out", str(tmp_path / "o"), *bad])
    assert res.exit_code == 2
    assert not (tmp_path / "o" / "consents.csv").exists()


def test_users_hold_consents_at_several_providers_but_once_at_each(tmp_path: Path) -> None:
    write_seed(SeedParams(today=TODAY, providers=5, consents=5000), tmp_path)
    df = pd.read_csv(tmp_path / "consents.csv", dtype=str)
    per_user = df.groupby("user_id")["org_code"].agg(["size", "nunique"])
    assert (per_user["size"] == per_user["nunique"]).all()
    assert (per_user["size"] > 1).mean() > 0.2


def test_a_single_provider_gets_every_consent(tmp_path: Path) -> None:
    result = write_seed(SeedParams(today=TODAY, providers=1, consents=5000), tmp_path)
    df = pd.read_csv(tmp_path / "consents.csv", dtype=str)
    assert len(df) == 5000 and df["user_id"].is_unique
    assert result.providers[0].consents == 5000


def test_on_a_saturday_a_seventh_of_the_week_is_left(tmp_path: Path) -> None:
    """The week's last day holds what one day holds, not the week: the demo run on a
    Saturday must fit its window."""
    saturday = date(2026, 12, 5)
    result = write_seed(SeedParams(today=saturday, consents=20_000), tmp_path)
    due = sum(p.due_this_week for p in result.providers)
    left = 1 - 6 * (1 - NEW_SHARE - BACKLOG_SHARE) / 7
    assert abs(due / 20_000 - left) < 0.02, due  # ~21 %: a seventh, the new, the backlog


def test_on_a_sunday_nothing_is_done_yet_this_week(tmp_path: Path) -> None:
    sunday = date(2026, 11, 29)
    result = write_seed(SeedParams(today=sunday, consents=3000), tmp_path)
    df = pd.read_csv(result.files.consents, dtype=str, keep_default_na=False)
    fetched = df.loc[df["last_scheduled_at"] != "", "last_scheduled_at"]
    assert fetched.map(lambda t: pd.Timestamp(t).date()).max() < sunday
    assert sum(p.due_this_week for p in result.providers) == 3000
