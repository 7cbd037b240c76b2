"""The minute plan: a day's quota spread over a provider's window minutes.

Evenly, within a per-minute cap, and (when an hourly user profile is known) lower where user
traffic is higher; whole numbers that add up exactly (largest remainder, ties spread out
along the window rather than bunched at its start).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from planning.windows import MINUTES_PER_DAY

#: Golden-ratio order: a tie-break key that spreads equal remainders evenly over a window.
_PHI = (math.sqrt(5.0) - 1.0) / 2.0
#: No refresh starts in the last seconds of a window segment (the dispatcher's default
#: finish margin), so its calls end inside the window: that minute holds less.
FINISH_MARGIN_SECONDS = 10.0


def minute_caps(minutes: Sequence[int], per_minute_cap: int,
                finish_margin: float = FINISH_MARGIN_SECONDS) -> list[int]:
    """Each minute's cap: ``per_minute_cap``, but the last minute of each run of
    consecutive minutes (the next one not among them, or the day's last: the day's run ends
    at midnight) only has 60 - ``finish_margin`` seconds for its starts, so
    floor(cap * (60 - margin) / 60), and never less than one where the cap allows one (a
    refresh a minute is no rate to squeeze). Planning a full minute there at the cap left
    the rest deferred, and on a week's last window, late for the week: the demo on
    Saturday 23:57:30 KST (window 2358:0000) planned 1,400 + 1,400 at BANK000001's cap
    (70 calls/s, 3 calls a consent), and 197 of them could not start."""
    if not 0 <= finish_margin < 60:
        raise ValueError("finish_margin must be in [0, 60) seconds")
    inside = set(minutes)
    short = max(min(per_minute_cap, 1),
                math.floor(per_minute_cap * (60.0 - finish_margin) / 60.0 + 1e-9))
    return [short if m + 1 not in inside or m + 1 >= MINUTES_PER_DAY else per_minute_cap
            for m in minutes]


def spread(quota: int, minutes: Sequence[int], per_minute_cap: int | Sequence[int],
           weights: Sequence[float] | None = None) -> pd.Series:
    """Targets per minute of day for ``quota`` consents over ``minutes``.

    The result is indexed by minute of day (in the order given), sums to exactly
    ``min(quota, sum of the caps)``, and no minute exceeds its cap (``per_minute_cap``: one
    for every minute, or one per minute, e.g. :func:`minute_caps`).
    ``weights`` (one per minute, >= 0, any scale) is the user load in those minutes: a
    minute's share is damped-inverse to it, ``1 / (weight + mean weight)``, so a minute at
    the mean user load gets half the share of an idle one and never drops to zero.
    """
    if isinstance(quota, bool) or int(quota) != quota or quota < 0:
        raise ValueError(f"quota must be a whole number >= 0, got {quota!r}")
    mins = np.asarray(list(minutes), dtype=np.int64)
    given: list[Any] = ([per_minute_cap] * mins.size if np.ndim(per_minute_cap) == 0
                        else list(per_minute_cap))  # type: ignore[arg-type]
    if len(given) != mins.size:
        raise ValueError(f"{len(given)} caps given for {mins.size} minutes")
    for c in given:
        if isinstance(c, bool) or int(c) != c or c < 0:
            raise ValueError(f"per_minute_cap must be a whole number >= 0, got {c!r}")
    if mins.size and (mins.min() < 0 or mins.max() >= MINUTES_PER_DAY):
        raise ValueError("minutes must lie in 0..1439")
    if np.unique(mins).size != mins.size:
        raise ValueError("minutes must not repeat")
    index = pd.Index(mins, name="minute")
    m = mins.size
    cap = np.asarray(given, dtype=np.int64)
    total = min(int(quota), int(cap.sum()))
    if m == 0 or total == 0:
        return pd.Series(np.zeros(m, dtype=np.int64), index=index, name="target")

    if weights is None:
        share = np.full(m, 1.0 / m)
    else:
        wv = np.asarray(list(weights), dtype=np.float64)
        if wv.shape != (m,):
            raise ValueError(f"{wv.size} weights given for {m} minutes")
        if not np.all(np.isfinite(wv)) or np.any(wv < 0):
            raise ValueError("weights must be finite and >= 0")
        top = float(wv.max())
        # shares do not depend on the weights' scale: dividing by the largest keeps
        # 1 / (weight + mean) finite for tiny (subnormal) weights
        wv = wv / top if top > 0 else wv
        mean = float(wv.mean())
        inv = np.ones(m) if mean == 0 else 1.0 / (wv + mean)
        share = inv / inv.sum()

    ideal = _capped(total, share, cap)
    floor = np.minimum(np.floor(ideal + 1e-9).astype(np.int64), cap)
    rest = total - int(floor.sum())
    if rest > 0:
        frac = np.round(ideal - floor, 9)
        tie = (np.arange(m) * _PHI) % 1.0
        open_ = floor < cap
        order = np.lexsort((tie, -frac))            # largest remainder first, ties spread
        order = order[open_[order]]
        floor[order[:rest]] += 1
    return pd.Series(floor, index=index, name="target")


def _capped(total: int, share: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Real targets proportional to ``share``, none above its ``cap`` (water-filling the
    excess)."""
    ideal = total * share
    fixed = np.zeros(share.size, dtype=bool)
    for _ in range(share.size):
        over = (ideal > cap + 1e-9) & ~fixed
        if not over.any():
            break
        fixed |= over
        ideal[fixed] = cap[fixed]
        left = total - int(cap[fixed].sum())
        free = ~fixed
        if not free.any() or share[free].sum() == 0:
            break
        ideal[free] = left * share[free] / share[free].sum()
    return ideal


def hourly_weights(minutes: Sequence[int], hourly: Mapping[int, float] | Sequence[float]
                   ) -> list[float]:
    """Per-minute weights from an hourly user profile (hour 0..23 -> load)."""
    if isinstance(hourly, Mapping):
        return [float(hourly.get(m // 60, 0.0)) for m in minutes]
    prof = list(hourly)
    if len(prof) != 24:
        raise ValueError("an hourly profile has 24 values")
    return [float(prof[m // 60]) for m in minutes]
