"""Progress while waiting for a window: when it opens, on a terminal and in the log."""

from __future__ import annotations

import asyncio
import io
import logging
from dataclasses import dataclass, field
from datetime import date, datetime

import pytest

from batch.clock import KST, FakeClock
from batch.dispatch.progress import next_opening, report, waiting_text
from batch.dispatch.stats import ProviderStats

DAY = date(2026, 11, 30)
AT_2018 = datetime(2026, 11, 30, 20, 18, tzinfo=KST)


@dataclass
class _Dispatcher:
    org_code: str
    minutes: list[int]
    stats: ProviderStats = field(init=False)

    def __post_init__(self) -> None:
        self.stats = ProviderStats(self.org_code, day_quota=10)


def test_the_wait_is_said_in_hours_and_minutes() -> None:
    opens = datetime(2026, 12, 1, 0, 30, tzinfo=KST)
    assert waiting_text("BANK000001", opens, datetime(2026, 11, 30, 20, 18, tzinfo=KST)) == \
        "BANK000001 opens at 2026-12-01 00:30, in 4 h 12 min"
    assert waiting_text("BANK000001", datetime(2026, 11, 30, 20, 30, tzinfo=KST), AT_2018) == \
        "BANK000001 opens at 20:30, in 12 min"


def test_next_opening_is_the_first_planned_minute_ahead_or_none_once_open() -> None:
    assert next_opening([1230, 1231], DAY, AT_2018) == datetime(2026, 11, 30, 20, 30,
                                                                 tzinfo=KST)
    assert next_opening([1218, 1219], DAY, AT_2018.replace(second=30)) is None   # open now
    assert next_opening([600], DAY, AT_2018) is None                             # all past


async def _one_round(tty: bool, *dispatchers: _Dispatcher) -> str:
    stream = io.StringIO()
    task = asyncio.create_task(report(dispatchers, clock=FakeClock(AT_2018),  # type: ignore[arg-type]
                                      tty=tty, stream=stream, run_id="r1", day=DAY))
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return stream.getvalue()


async def test_a_terminal_shows_when_each_window_opens() -> None:
    out = await _one_round(True, _Dispatcher("BANK000001", [1230, 1231]),
                           _Dispatcher("CARD000001", []))
    assert "BANK000001 opens at 20:30, in 12 min" in out
    assert "CARD000001  nothing planned today" in out


async def test_cron_logs_the_wait_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="mydata.progress"):
        await _one_round(False, _Dispatcher("BANK000001", [1230]))
    waits = [r for r in caplog.records if getattr(r, "action", "") == "waiting"]
    assert [r.getMessage() for r in waits] == ["BANK000001 opens at 20:30, in 12 min"]
    assert waits[0].opens_at == "2026-11-30T20:30:00+09:00"  # type: ignore[attr-defined]
