"""Provider non-peak windows (``np_time_list``): parsing, validation, minutes of a day.

A window ``"hhmm:hhmm"`` recurs every day in KST; one whose end is not after its start runs
past midnight (``"2300:0100"`` covers 23:00-24:00 and 00:00-01:00 of every day). The
minutes of a calendar day that a provider allows are the union of its windows' minutes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MINUTES_PER_DAY = 1440
MAX_WINDOWS = 3
#: MYDATA.md: windows together cover at least 6 hours a day.
MIN_TOTAL_MINUTES = 360
STEP_MINUTES = 30

_PATTERN = re.compile(r"^(\d{2})(\d{2}):(\d{2})(\d{2})$")


class WindowError(ValueError):
    """A window string or a window list that breaks MYDATA.md's rules."""


@dataclass(frozen=True, slots=True)
class Window:
    """One daily window, ``start`` and ``end`` in minutes after midnight (end exclusive).

    ``end <= start`` means the window runs past midnight; ``end == 1440`` is written 2400.
    """

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < MINUTES_PER_DAY:
            raise WindowError(f"start minute {self.start} is outside 0..1439")
        if not 0 <= self.end <= MINUTES_PER_DAY:
            raise WindowError(f"end minute {self.end} is outside 0..1440")

    @property
    def crosses_midnight(self) -> bool:
        return self.end <= self.start and not (self.end == 0 and self.start == 0)

    @property
    def length(self) -> int:
        """Length in minutes (a window with equal ends would be the whole day: refused)."""
        return (self.end - self.start) % MINUTES_PER_DAY or MINUTES_PER_DAY

    def minutes(self) -> list[int]:
        """The minutes of a day (0..1439) this window covers, in day order."""
        if self.end > self.start:
            return list(range(self.start, self.end))
        return list(range(0, self.end)) + list(range(self.start, MINUTES_PER_DAY))

    def contains(self, minute_of_day: int) -> bool:
        if self.end > self.start:
            return self.start <= minute_of_day < self.end
        return minute_of_day >= self.start or minute_of_day < self.end

    def __str__(self) -> str:
        return f"{_hhmm(self.start)}:{_hhmm(self.end)}"


def _hhmm(minute: int) -> str:
    return f"{minute // 60:02d}{minute % 60:02d}"


def parse_window(text: str, *, step: int = STEP_MINUTES) -> Window:
    """Parse ``"hhmm:hhmm"``; both ends must fall on ``step``-minute boundaries.

    Registered windows use 30-minute steps; ``--window-override`` passes ``step=1``.
    """
    if not isinstance(text, str):
        raise WindowError(f"window {text!r} is not a string like '0030:0530'")
    m = _PATTERN.match(text.strip())
    if m is None:
        raise WindowError(f"window {text!r} is not 'hhmm:hhmm' (e.g. '0030:0530')")
    sh, sm, eh, em = (int(g) for g in m.groups())
    for h, mm, which in ((sh, sm, "start"), (eh, em, "end")):
        if mm >= 60 or h > 24 or (h == 24 and mm != 0):
            raise WindowError(f"window {text!r}: {which} {h:02d}{mm:02d} is not a time of day")
    start, end = sh * 60 + sm, eh * 60 + em
    if start == MINUTES_PER_DAY:
        raise WindowError(f"window {text!r}: start 2400 is not a time of day")
    if start % step or end % step:
        raise WindowError(f"window {text!r}: times must be in {step}-minute steps")
    if start == end:  # "0000:2400" is the whole day; "0100:0100" is nothing
        raise WindowError(f"window {text!r}: start and end are equal")
    return Window(start, end)


def parse_windows(
    texts: Iterable[str],
    *,
    step: int = STEP_MINUTES,
    max_windows: int = MAX_WINDOWS,
    min_total_minutes: int = MIN_TOTAL_MINUTES,
) -> tuple[Window, ...]:
    """Parse and validate a provider's window list per MYDATA.md.

    At most ``max_windows`` windows, together (their union: overlapping windows, like
    DESIGN.md's own ``["0030:0530", "2300:0100"]``, are merged, not counted twice) at least
    ``min_total_minutes`` (pass 0 to skip that rule, e.g. for an override).
    """
    if isinstance(texts, str):
        raise WindowError("windows must be a list of 'hhmm:hhmm' strings, not one string")
    windows = tuple(parse_window(t, step=step) for t in texts)
    if not windows:
        raise WindowError("at least one window is required")
    if len(windows) > max_windows:
        raise WindowError(f"{len(windows)} windows given; at most {max_windows} are allowed")
    seen: set[int] = set()
    for w in windows:
        seen.update(w.minutes())
    if len(seen) < min_total_minutes:
        raise WindowError(
            f"windows cover {len(seen)} minutes a day; at least {min_total_minutes} are required"
        )
    return windows


def day_minutes(windows: Sequence[Window]) -> list[int]:
    """The sorted minutes of a calendar day (0..1439) inside any of ``windows``."""
    mins: set[int] = set()
    for w in windows:
        mins.update(w.minutes())
    return sorted(mins)


def in_windows(windows: Sequence[Window], minute_of_day: int) -> bool:
    """Whether ``minute_of_day`` lies inside any window."""
    return any(w.contains(minute_of_day) for w in windows)
