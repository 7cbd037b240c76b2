"""Daily quotas: how many due consents each provider takes each day of the week.

For one provider, over days ``0..D-1`` with a forecast base load ``b[d]`` (user calls), a
capacity ``c[d]`` (consents) and classes of consents ``(release, deadline, count)``, choose
integer quotas ``x[d]`` such that every consent can be given a day inside its class's
``[release, deadline]`` and ``x[d] <= c[d]``, that make the peak of ``b[d] + w * x[d]``
(``w`` = calls per consent) the smallest possible, and among those the flattest (least sum
of squares).

How, and why it is exact:
1. What cannot fit at all is found by an earliest-deadline-first sweep at full capacity
   (EDF finds a maximum assignment on interval-shaped classes); it is reported as
   ``unplaceable``, never silently dropped.
2. The least peak: a binary search on the level ``P``; at ``P`` each day may take
   ``min(c[d], floor((P - b[d]) / w))``, and the classes fit iff Hall's condition holds on
   every interval of days (the EDF feasibility condition for intervals).
3. The flattest plan under that peak: the sets of assignable quota vectors are the
   independent vectors of a polymatroid (``x(S) <= #consents whose interval meets S``), cut
   by the box of step 2; a greedy that always gives the next consent to the feasible day with
   the lowest total minimises any separable convex cost over its bases (Federgruen and
   Groenevelt, 1986). The greedy is run in bulk rounds, so it costs a few dozen steps per
   provider whatever the counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

MAX_DAYS = 14

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ConsentClass:
    """``count`` consents that may go on any day from ``release`` to ``deadline`` (indices)."""

    release: int
    deadline: int
    count: int

    def __post_init__(self) -> None:
        if self.release < 0:
            raise ValueError(f"release {self.release} is before the first day")
        if self.deadline < self.release:
            raise ValueError(f"deadline {self.deadline} is before release {self.release}")
        if self.count < 0:
            raise ValueError(f"count {self.count} is negative")


@dataclass(frozen=True, slots=True)
class Leveled:
    """One provider's quotas: ``quotas[d]`` consents on day ``d``.

    ``assignment[i][d]`` is how many consents of class ``i`` go on day ``d`` (a witness that
    every deadline and release holds); ``unplaceable[i]`` how many of class ``i`` fit nowhere.
    """

    quotas: tuple[int, ...]
    peak: float
    assignment: tuple[tuple[int, ...], ...]
    unplaceable: tuple[int, ...]

    @property
    def total_unplaceable(self) -> int:
        return sum(self.unplaceable)


def _check(base: Sequence[float] | FloatArray, capacity: Sequence[int] | IntArray,
           classes: Sequence[ConsentClass], weight: float) -> tuple[FloatArray, IntArray]:
    b = np.asarray(base, dtype=np.float64)
    c = np.asarray(capacity, dtype=np.int64)
    days = len(b)
    if b.ndim != 1 or c.shape != b.shape:
        raise ValueError("base and capacity must be 1-d and of the same length")
    if not 1 <= days <= MAX_DAYS:
        raise ValueError(f"{days} days given; 1..{MAX_DAYS} are supported")
    if not np.all(np.isfinite(b)) or np.any(b < 0):
        raise ValueError("base load must be finite and >= 0")
    if np.any(c < 0):
        raise ValueError("capacity must be >= 0")
    if not (math.isfinite(weight) and weight > 0):
        raise ValueError("weight (calls per consent) must be a positive number")
    for k in classes:
        if k.deadline >= days:
            raise ValueError(f"class deadline {k.deadline} is beyond the last day {days - 1}")
    return b, c


def edf_assign(capacity: Sequence[int] | IntArray, classes: Sequence[ConsentClass]
               ) -> tuple[IntArray, IntArray]:
    """Earliest-deadline-first sweep: (assignment[class, day], left over per class).

    On interval-shaped classes this places as many consents as any assignment can.
    """
    days = len(capacity)
    order = sorted(range(len(classes)), key=lambda i: (classes[i].deadline, classes[i].release))
    left = np.array([k.count for k in classes], dtype=np.int64)
    out = np.zeros((len(classes), days), dtype=np.int64)
    for d in range(days):
        room = int(capacity[d])
        for i in order:
            if room == 0:
                break
            k = classes[i]
            if k.release <= d <= k.deadline and left[i] > 0:
                take = min(room, int(left[i]))
                out[i, d] = take
                left[i] -= take
                room -= take
    return out, left


def _demand(days: int, classes: Sequence[ConsentClass]) -> IntArray:
    """dem[s, t]: consents whose whole interval lies in days s..t."""
    dem = np.zeros((days, days), dtype=np.int64)
    for k in classes:
        if k.count:
            dem[: k.release + 1, k.deadline:] += k.count
    return dem


def _fits(caps: FloatArray, dem: IntArray) -> bool:
    """Hall's condition on every interval of days (upper triangle only)."""
    cum = np.concatenate(([0.0], np.cumsum(caps)))
    room = cum[None, 1:] - cum[:-1, None]          # room[s, t] = caps[s..t].sum()
    return bool(np.all(np.triu(dem - room) <= 1e-9))


def _caps(level: float, b: FloatArray, c: IntArray, w: float) -> FloatArray:
    return np.minimum(c, np.maximum(0.0, np.floor((level - b) / w + 1e-12)))


def _min_peak(b: FloatArray, c: IntArray, w: float, dem: IntArray, *, continuous: bool) -> float:
    """The least level at which all classes fit (binary search; exact to ~1e-12 relative)."""
    def caps(level: float) -> FloatArray:
        if continuous:
            return np.minimum(c, np.maximum(0.0, (level - b) / w))
        return _caps(level, b, c, w)

    lo = float(b.max())
    if _fits(caps(lo), dem):
        return lo
    hi = float(np.max(b + w * c))
    if not _fits(caps(hi), dem):
        raise ValueError("classes do not fit even at full capacity")
    for _ in range(200):
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
        mid = (lo + hi) / 2
        if _fits(caps(mid), dem):
            hi = mid
        else:
            lo = mid
    return hi


def _greedy_flatten(b: FloatArray, w: float, u: IntArray, classes: Sequence[ConsentClass],
                    total: int) -> IntArray:
    """Give ``total`` consents one at a time to the feasible day with the lowest total.

    Run in bulk: a group of days within ``w`` of the lowest total rises in whole rounds until
    another day joins, a constraint is about to bind, or the consents run out.
    """
    days = len(b)
    masks = np.arange(1, 1 << days, dtype=np.int64)
    member = ((masks[:, None] >> np.arange(days)) & 1).astype(np.int64)   # subset x day
    rho = np.zeros(len(masks), dtype=np.int64)                           # consents meeting S
    for k in classes:
        if k.count:
            span = ((1 << (k.deadline + 1)) - 1) ^ ((1 << k.release) - 1)
            rho += k.count * ((masks & span) != 0)
    x = np.zeros(days, dtype=np.int64)
    blocked = u <= 0
    rem = total
    while rem > 0:
        idx = np.flatnonzero(~blocked)
        if idx.size == 0:
            raise AssertionError("greedy ran out of days before placing every consent")
        t = b + w * x
        t_lo = float(t[idx].min())
        in_group = t[idx] < t_lo + w
        group = idx[in_group]
        rest = idx[~in_group]
        k_join = math.floor((float(t[rest].min()) - t_lo) / w) if rest.size else rem
        slack = rho - member @ x
        cnt = member[:, group].sum(axis=1)
        hit = cnt > 0
        step = min(k_join, int((slack[hit] // cnt[hit]).min()),
                   int((u[group] - x[group]).min()), rem // group.size)
        if step >= 1:
            x[group] += step
            rem -= step * group.size
            continue
        d = int(idx[np.argmin(t[idx])])
        if x[d] < u[d] and bool(np.all(slack[member[:, d] == 1] >= 1)):
            x[d] += 1
            rem -= 1
        else:
            blocked[d] = True
    return x


def level(base: Sequence[float] | FloatArray, capacity: Sequence[int] | IntArray,
          classes: Sequence[ConsentClass], *, weight: float = 1.0) -> Leveled:
    """The least-peak, then flattest, integer quotas for one provider (see module doc)."""
    b, c = _check(base, capacity, classes, weight)
    days = len(b)
    _, left = edf_assign(c, classes)
    placeable = [ConsentClass(k.release, k.deadline, k.count - int(n))
                 for k, n in zip(classes, left, strict=True)]
    total = sum(k.count for k in placeable)
    if total == 0:
        x = np.zeros(days, dtype=np.int64)
    else:
        peak = _min_peak(b, c, weight, _demand(days, placeable), continuous=False)
        u = _caps(peak, b, c, weight).astype(np.int64)
        x = _greedy_flatten(b, weight, u, placeable, total)
    assignment, rest = edf_assign(x, placeable)
    if rest.any():
        raise AssertionError("leveled quotas are not assignable; this is a bug")
    return Leveled(
        quotas=tuple(int(v) for v in x),
        peak=float(np.max(b + weight * x)),
        assignment=tuple(tuple(int(v) for v in row) for row in assignment),
        unplaceable=tuple(int(v) for v in left),
    )


def lower_bound(base: Sequence[float] | FloatArray, capacity: Sequence[int] | IntArray,
                classes: Sequence[ConsentClass], *, weight: float = 1.0) -> float:
    """The continuous-relaxation (LP) optimum of the peak: no integer plan can beat it.

    Computed from Hall's interval condition with fractional quotas, independently of the
    greedy; consents that fit nowhere are left out first, as in :func:`level`.
    """
    b, c = _check(base, capacity, classes, weight)
    _, left = edf_assign(c, classes)
    placeable = [ConsentClass(k.release, k.deadline, k.count - int(n))
                 for k, n in zip(classes, left, strict=True)]
    return _min_peak(b, c, weight, _demand(len(b), placeable), continuous=True)


def least_peak(base: Sequence[float] | FloatArray, capacity: Sequence[int] | IntArray,
               classes: Sequence[ConsentClass], *, weight: float = 1.0) -> float:
    """The least peak any integer plan can reach (binary search on Hall's condition alone,
    without the greedy): :func:`level` must meet it exactly."""
    b, c = _check(base, capacity, classes, weight)
    _, left = edf_assign(c, classes)
    placeable = [ConsentClass(k.release, k.deadline, k.count - int(n))
                 for k, n in zip(classes, left, strict=True)]
    return _min_peak(b, c, weight, _demand(len(b), placeable), continuous=False)


def deadline_misses(quotas: Sequence[int] | IntArray, classes: Sequence[ConsentClass]) -> int:
    """Consents that no day inside their interval can take under these quotas."""
    _, left = edf_assign(quotas, classes)
    return int(left.sum())


def plan_quotas(days: pd.DataFrame, classes: pd.DataFrame,
                weights: Mapping[str, float] | float = 1.0) -> pd.DataFrame:
    """Level every provider.

    ``days``: org_code, date, base_load, capacity (one row per provider and planned day).
    ``classes``: org_code, release, deadline (dates among that provider's days), count.
    ``weights``: calls per consent, per provider or one for all.
    Returns ``days`` with ``batch_quota``, ``unplaceable`` (counted on the class's deadline
    day) and ``total`` (= base_load + weight * batch_quota) added, rows in (org_code, date)
    order.
    """
    out: list[pd.DataFrame] = []
    by_org = {str(k): g for k, g in classes.groupby("org_code", sort=False)}
    for org, g in days.sort_values(["org_code", "date"]).groupby("org_code", sort=True):
        org = str(org)
        w = float(weights[org] if isinstance(weights, Mapping) else weights)
        dates = list(g["date"])
        pos = {d: i for i, d in enumerate(dates)}
        ks: list[ConsentClass] = []
        cg = by_org.get(org)
        if cg is not None:
            for r, e, n in zip(cg["release"], cg["deadline"], cg["count"], strict=True):
                if r not in pos or e not in pos:
                    raise ValueError(f"{org}: class ({r}, {e}) falls outside the planned days")
                ks.append(ConsentClass(pos[r], pos[e], int(n)))
        res = level(g["base_load"].to_numpy(float), g["capacity"].to_numpy(np.int64), ks,
                    weight=w)
        unpl = np.zeros(len(dates), dtype=np.int64)
        for k, n in zip(ks, res.unplaceable, strict=True):
            unpl[k.deadline] += n
        frame = g.copy()
        frame["batch_quota"] = np.asarray(res.quotas, dtype=np.int64)
        frame["unplaceable"] = unpl
        frame["total"] = frame["base_load"].to_numpy(float) + w * frame["batch_quota"]
        out.append(frame)
    if not out:
        return days.assign(batch_quota=pd.Series(dtype="int64"),
                           unplaceable=pd.Series(dtype="int64"),
                           total=pd.Series(dtype="float64"))
    return pd.concat(out, ignore_index=True)
