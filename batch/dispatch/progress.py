"""Progress for a person (a live line per provider on a terminal) or for cron (a log line
per provider per minute), and, before a provider's window opens, when it will."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import date, datetime, time, timedelta
from typing import TextIO

from batch.clock import KST, Clock
from batch.dispatch.provider import ProviderDispatcher

log = logging.getLogger("mydata.progress")


def line(d: ProviderDispatcher) -> str:
    s = d.stats
    errors = s.attempted - s.succeeded
    return (f"{d.org_code}  minute {s.minute_started:>6,}/{s.minute_planned:<6,}  "
            f"day {s.attempted_before + s.attempted:>8,}/{s.day_quota:<8,}  "
            f"ok {s.succeeded:>8,}  err {errors:>6,}  in-flight {s.in_flight:>5,}  "
            f"breaker {s.breaker_state}")


def next_opening(minutes: Sequence[int], day: date, now: datetime) -> datetime | None:
    """The start of the first planned minute of ``day`` still ahead of ``now``; None when
    one has begun in the last minute (the window is open) or none is left."""
    start = datetime.combine(day, time(0), KST)
    for m in sorted(minutes):
        at = start + timedelta(minutes=m)
        if at > now:
            return at
        if now - at < timedelta(minutes=1):
            return None
    return None


def waiting_text(org_code: str, opens: datetime, now: datetime) -> str:
    """``BANK000001 opens at 00:30, in 4 h 12 min``."""
    left = max(0, int((opens - now).total_seconds() + 59) // 60)
    h, m = divmod(left, 60)
    when = f"{h} h {m} min" if h else f"{m} min"
    day = "" if opens.astimezone(KST).date() == now.astimezone(KST).date() else \
        f" {opens.astimezone(KST):%Y-%m-%d}"
    return f"{org_code} opens at{day} {opens.astimezone(KST):%H:%M}, in {when}"


def _waiting(d: ProviderDispatcher, day: date, now: datetime) -> datetime | None:
    if d.stats.minutes or d.stats.minute_planned:
        return None  # a minute has begun: it is running, not waiting
    return next_opening(d.minutes, day, now)


def status_line(d: ProviderDispatcher, day: date, now: datetime) -> str:
    """The live line: the wait before the window, or the counters once it is open."""
    opens = _waiting(d, day, now)
    if opens is not None:
        return waiting_text(d.org_code, opens, now)
    if not d.minutes:
        return f"{d.org_code}  nothing planned today"
    return line(d)


async def report(dispatchers: Sequence[ProviderDispatcher], *, clock: Clock, tty: bool,
                 stream: TextIO, run_id: str, day: date) -> None:
    """Run until cancelled."""
    drawn = 0
    interval = 1.0 if tty else 60.0
    told: dict[str, datetime] = {}
    first = True
    while True:
        if not first:
            await clock.sleep(interval)
        now = clock.now()
        if tty:
            if drawn:
                stream.write(f"\x1b[{drawn}F")
            for d in dispatchers:
                stream.write("\x1b[2K" + status_line(d, day, now) + "\n")
            drawn = len(dispatchers)
            stream.flush()
        else:
            for d in dispatchers:
                opens = _waiting(d, day, now)
                if opens is not None:
                    if told.get(d.org_code) != opens:  # once per wait, not once a minute
                        told[d.org_code] = opens
                        log.info(waiting_text(d.org_code, opens, now), extra={
                            "action": "waiting", "run_id": run_id, "org_code": d.org_code,
                            "opens_at": opens.isoformat()})
                    continue
                if first:
                    continue
                s = d.stats
                log.info("progress", extra={
                    "action": "progress", "run_id": run_id, "org_code": d.org_code,
                    "minute_planned": s.minute_planned, "minute_started": s.minute_started,
                    "day_quota": s.day_quota,
                    "day_attempted": s.attempted_before + s.attempted,
                    "succeeded": s.succeeded, "in_flight": s.in_flight,
                    "breaker": s.breaker_state,
                })
        first = False
