"""A small, hand-computed week written straight into the schema tables."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from html.parser import HTMLParser

import pytest
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema
from planning.calendar import KST

WEEK = date(2026, 11, 29)  # a Sunday
TODAY = WEEK + timedelta(days=2)  # Tuesday
NOW = datetime(2026, 12, 1, 3, 0, tzinfo=KST)  # 03:00 KST, minute 180
BANK, CARD = "BANK000001", "CARD000001"
ACCESS = "ACCESS-TOKEN-zq81xk-DO-NOT-SHOW"
REFRESH = "REFRESH-TOKEN-pw72vy-DO-NOT-SHOW"
EVIL = "<script>alert('x')</script>"

# calls per consent: BANK the planner's default (3), CARD 2 from its options
CPC = {BANK: 3, CARD: 2}
# per provider and day (Sun..Sat): forecast user calls and the batch quota (consents)
FORECAST = {BANK: [11_000, 21_000, 31_000, 41_000, 51_000, 61_000, 71_000],
            CARD: [1_200, 2_200, 3_200, 4_200, 5_200, 6_200, 7_200]}
QUOTA = {BANK: [9_000, 8_000, 7_000, 6_000, 5_000, 4_000, 3_000],
         CARD: [300, 300, 300, 300, 300, 300, 1_500]}
ACTUAL = {BANK: {0: 12_345, 1: 22_222}}  # usage known for Sunday and Monday only
DONE = {(BANK, 0): 4, (BANK, 1): 3, (BANK, 2): 1, (CARD, 2): 2}  # 3 calls each
# plus 5 retry_later outcomes of 2 calls each for BANK today
UNPLACEABLE = {(CARD, 6): 777}
MINUTES = ((30, 1_000), (100, 1_000), (180, 1_500), (181, 2_000), (300, 1_500))


@dataclass(frozen=True)
class Week:
    engine: AsyncEngine


def at(day_offset: int, hour: int = 1) -> datetime:
    return datetime(2026, 11, 29, hour, 0, tzinfo=KST) + timedelta(days=day_offset)


async def populate(engine: AsyncEngine) -> None:
    """Two providers, a full plan, some usage, outcomes, runs, dead letters and minutes."""
    stamp = datetime(2026, 11, 28, tzinfo=UTC)
    days = [WEEK + timedelta(days=i) for i in range(7)]
    async with engine.begin() as conn:
        await conn.execute(insert(schema.institutions), [
            {"org_code": org, "industry": ind, "base_url": "http://127.0.0.1:9001",
             "windows": '["0030:0530"]', "calls_per_second": 50, "max_concurrency": 20,
             "options": options, "updated_at": stamp}
            for org, ind, options in ((BANK, "bank", "{}"),
                                      (CARD, "card", '{"calls_per_consent": 2}'))])
        await conn.execute(insert(schema.consents), [
            {"user_id": f"user{i}", "org_code": org, "access_token": f"{ACCESS}-{i}",
             "refresh_token": f"{REFRESH}-{i}", "consented_at": stamp, "due_week": WEEK,
             "not_before": stamp, "updated_at": stamp,
             "last_error": f"token {ACCESS}-{i} rejected"}
            for i, org in enumerate((BANK, BANK, CARD))])
        ids = list((await conn.execute(select(schema.consents.c.id)
                                       .order_by(schema.consents.c.id))).scalars())
        await conn.execute(insert(schema.plan_days), [
            {"org_code": org, "day": d, "week_start": WEEK,
             "forecast_user_calls": FORECAST[org][i], "batch_quota": QUOTA[org][i],
             "capacity": 50_000, "unplaceable": UNPLACEABLE.get((org, i), 0),
             "created_at": stamp}
            for org in (BANK, CARD) for i, d in enumerate(days)])
        await conn.execute(insert(schema.usage_daily), [
            {"org_code": org, "day": days[i], "user_calls": n}
            for org, by_day in ACTUAL.items() for i, n in by_day.items()])
        outcomes = []
        for (org, i), n in DONE.items():
            outcomes += [{"run_id": f"run-{i}", "consent_id": ids[0], "org_code": org,
                          "day": days[i], "kind": "success", "action": "done",
                          "rsp_code": "00000", "calls": 3, "at": at(i)}] * n
        outcomes += [{"run_id": "run-2", "consent_id": ids[1], "org_code": BANK, "day": TODAY,
                      "kind": "fault", "action": "retry_later", "rsp_code": "50001",
                      "calls": 2, "at": at(2)}] * 5
        await conn.execute(insert(schema.call_outcomes), outcomes)
        summary = {"run_id": "run-1", "date": "2026-11-30", "providers": [
            {"org_code": BANK, "planned": 8_000, "attempted": 7_990, "succeeded": 7_950,
             "failed": 40, "deferred": 10, "dead_lettered": 3},
            {"org_code": CARD, "planned": 300, "attempted": 300, "succeeded": 300,
             "failed": 0, "deferred": 0, "dead_lettered": 0}]}
        await conn.execute(insert(schema.runs), [
            {"run_id": "run-1", "day": days[1], "worker_id": "host-a", "started_at": at(1),
             "finished_at": at(1, 6), "status": "ok", "summary": json.dumps(summary)},
            {"run_id": "run-2", "day": TODAY, "worker_id": EVIL, "started_at": at(2),
             "finished_at": None, "status": "running", "summary": None},
        ])
        await conn.execute(insert(schema.dead_letters), [
            {"consent_id": ids[0], "org_code": BANK, "week_start": WEEK, "attempts": 5,
             "last_error": f"50001 five times {EVIL}", "entered_at": at(1, 5),
             "requeued_at": None},
            {"consent_id": ids[1], "org_code": BANK, "week_start": WEEK, "attempts": 5,
             "last_error": "requeued already", "entered_at": at(1, 4),
             "requeued_at": at(1, 7)},
        ])
        # BANK's minute plan today: its 7,000, of which 3,500 are due by minute 180
        await conn.execute(insert(schema.plan_minutes), [
            {"org_code": BANK, "day": TODAY, "minute": m, "target": t}
            for m, t in MINUTES])


@pytest.fixture
async def week(engine: AsyncEngine) -> Week:
    await populate(engine)
    return Week(engine)


class Tables(HTMLParser):
    """Each ``<table id=...>`` as rows of cell texts."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._id: str | None = None
        self._cell: list[str] | None = None
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._id = dict(attrs).get("id")
            if self._id:
                self.tables[self._id] = []
        elif tag == "tr" and self._id:
            self.tables[self._id].append([])
        elif tag in ("td", "th") and self._id:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._id = None
        elif tag in ("td", "th") and self._id and self._cell is not None:
            self.tables[self._id][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def row(self, table: str, name: str, unit: str | None = None) -> list[str]:
        """The cells after the row's name, or after its name and ``unit`` when given."""
        for r in self.tables[table]:
            if r and r[0] == name and (unit is None or r[1:2] == [unit]):
                return r[1:] if unit is None else r[2:]
        raise KeyError(f"{name!r} ({unit}) not in table {table!r}")
