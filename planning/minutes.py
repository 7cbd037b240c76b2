"""The minute plan: a day's quota spread over a provider's window minutes.

Evenly, within a per-minute cap, and (when an hourly user profile is known) lower where user
traffic is higher; whole numbers that add up exactly (largest remainder, ties spread out
along the window rather than bunched at its start).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from planning.windows import MINUTES_PER_DAY

#: Golden-ratio order: a tie-break key that spreads equal remainders evenly over a window.
_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def spread(quota: int, minutes: Sequence[int], per_minute_cap: int,
           weights: Sequence[float] | None = None) -> pd.Series:
    """Targets per minute of day for ``quota`` consents over ``minutes``.

    The result is indexed by minute of day (in the order given), sums to exactly
    ``min(quota, per_minute_cap * len(minutes))``, and no minute exceeds the cap.
    ``weights`` (one per minute, >= 0, any scale) is the user load in those minutes: a
    minute's share is damped-inverse to it, ``1 / (weight + mean weight)``, so a minute at
    the mean user load gets half the share of an idle one and never drops to zero.
    """
    if isinstance(quota, bool) or int(quota) != quota or quota < 0:
        raise ValueError(f"quota must be a whole number >= 0, got {quota!r}")
    if isinstance(per_minute_cap, bool) or int(per_minute_cap) != per_minute_cap \
            or per_minute_cap < 0:
        raise ValueError(f"per_minute_cap must be a whole number >= 0, got {per_minute_cap!r}")
    mins = np.asarray(list(minutes), dtype=np.int64)
    if mins.size and (mins.min() < 0 or mins.max() >= MINUTES_PER_DAY):
        raise ValueError("minutes must lie in 0..1439")
    if np.unique(mins).size != mins.size:
        raise ValueError("minutes must not repeat")
    index = pd.Index(mins, name="minute")
    m = mins.size
    cap = int(per_minute_cap)
    total = min(int(quota), cap * m)
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


def _capped(total: int, share: np.ndarray, cap: int) -> np.ndarray:
    """Real targets proportional to ``share``, none above ``cap`` (water-filling the excess)."""
    ideal = total * share
    fixed = np.zeros(share.size, dtype=bool)
    for _ in range(share.size):
        over = (ideal > cap + 1e-9) & ~fixed
        if not over.any():
            break
        fixed |= over
        ideal[fixed] = cap
        left = total - cap * int(fixed.sum())
        free = ~fixed
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
