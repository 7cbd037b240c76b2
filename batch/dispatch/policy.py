"""How often and how soon a failed consent is tried again within its week.

The lifecycle's rules (which outcome becomes which transition) live in
:mod:`batch.lifecycle`; this is the settings object they read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from batch.clock import KST
from planning.windows import MINUTES_PER_DAY, Window, day_minutes


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When a failed consent may be tried again, and how many tries a week it gets.

    ``windows`` are the provider's windows (none: open all day); a retry is never put past
    the week's last open minute while that minute is still ahead.
    """

    max_attempts: int = 5
    base_delay: timedelta = timedelta(minutes=10)
    max_delay: timedelta = timedelta(hours=6)
    unknown_delay: timedelta = timedelta(minutes=30)
    windows: tuple[Window, ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.base_delay <= timedelta(0) or self.max_delay < self.base_delay:
            raise ValueError("base_delay must be > 0 and max_delay >= base_delay")
        if self.unknown_delay < timedelta(0):
            raise ValueError("unknown_delay must be >= 0")

    def delay(self, attempts_so_far: int) -> timedelta:
        factor: int = 2 ** max(0, attempts_so_far - 1)
        return min(self.max_delay, self.base_delay * factor)

    def last_open_minute(self, week: date) -> datetime:
        """The start of the last minute a call may start in the week beginning ``week``."""
        last = max(day_minutes(self.windows), default=MINUTES_PER_DAY - 1)
        return datetime.combine(week + timedelta(days=6), time(0), KST) + timedelta(minutes=last)

    def retry_at(self, now: datetime, delay: timedelta, *, week: date) -> datetime:
        """``now + delay``, but never past the week's last open minute while it is ahead."""
        latest = self.last_open_minute(week)
        at = now + delay
        return min(at, latest) if now < latest else at
