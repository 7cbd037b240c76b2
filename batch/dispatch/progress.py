"""Progress for a person (a live line per provider on a terminal) or for cron (a log line
per provider per minute)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TextIO

from batch.clock import Clock
from batch.dispatch.provider import ProviderDispatcher

log = logging.getLogger("mydata.progress")


def line(d: ProviderDispatcher) -> str:
    s = d.stats
    errors = s.attempted - s.succeeded
    return (f"{d.org_code}  minute {s.minute_started:>6,}/{s.minute_planned:<6,}  "
            f"day {s.attempted_before + s.attempted:>8,}/{s.day_quota:<8,}  "
            f"ok {s.succeeded:>8,}  err {errors:>6,}  in-flight {s.in_flight:>5,}  "
            f"breaker {s.breaker_state}")


async def report(dispatchers: Sequence[ProviderDispatcher], *, clock: Clock, tty: bool,
                 stream: TextIO, run_id: str) -> None:
    """Run until cancelled."""
    drawn = 0
    interval = 1.0 if tty else 60.0
    while True:
        await clock.sleep(interval)
        if tty:
            if drawn:
                stream.write(f"\x1b[{drawn}F")
            for d in dispatchers:
                stream.write("\x1b[2K" + line(d) + "\n")
            drawn = len(dispatchers)
            stream.flush()
        else:
            for d in dispatchers:
                s = d.stats
                log.info("progress", extra={
                    "action": "progress", "run_id": run_id, "org_code": d.org_code,
                    "minute_planned": s.minute_planned, "minute_started": s.minute_started,
                    "day_quota": s.day_quota,
                    "day_attempted": s.attempted_before + s.attempted,
                    "succeeded": s.succeeded, "in_flight": s.in_flight,
                    "breaker": s.breaker_state,
                })
