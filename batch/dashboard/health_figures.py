"""The run-health section's figures, pure: per-minute series and per-provider totals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from batch.observe.minutes import MinuteRow
from batch.observe.recorder import KINDS


@dataclass(frozen=True, slots=True)
class ProviderHealth:
    """One provider's run in a line: the totals the alerts read."""

    org_code: str
    planned: int
    started: int
    calls: int
    retried: int
    max_attempts: int
    timeouts: int
    p99_latency_ms: float | None
    lateness_p99_ms: float | None
    open_minutes: float
    by_kind: dict[str, int]

    @property
    def retry_ratio(self) -> float | None:
        return self.retried / self.calls if self.calls else None

    @property
    def max_attempt_ratio(self) -> float | None:
        return self.max_attempts / self.calls if self.calls else None


def totals(org_code: str, rows: Sequence[MinuteRow]) -> ProviderHealth:
    def worst(values: list[float | None]) -> float | None:
        found = [v for v in values if v is not None]
        return max(found) if found else None

    return ProviderHealth(
        org_code=org_code, planned=sum(r.planned for r in rows),
        started=sum(r.started for r in rows), calls=sum(r.calls for r in rows),
        retried=sum(r.retried for r in rows), max_attempts=sum(r.max_attempts for r in rows),
        timeouts=sum(r.timeout for r in rows),
        p99_latency_ms=worst([r.latency_p99_ms for r in rows]),
        lateness_p99_ms=worst([r.lateness_p99_ms for r in rows]),
        open_minutes=sum(r.breaker_open_seconds for r in rows) / 60,
        by_kind={k: sum(getattr(r, k) for r in rows) for k in KINDS})


def ratio_series(rows: Sequence[MinuteRow]) -> tuple[list[float | None], list[float | None]]:
    """Per minute: retried / calls and max-attempt calls / calls (None without calls)."""
    retry = [r.retried / r.calls if r.calls else None for r in rows]
    maxed = [r.max_attempts / r.calls if r.calls else None for r in rows]
    return retry, maxed


def outcome_series(rows: Sequence[MinuteRow]) -> dict[str, list[int]]:
    """Per outcome class, its count per minute (classes never seen are left out)."""
    out = {k: [int(getattr(r, k)) for r in rows] for k in KINDS}
    return {k: v for k, v in out.items() if any(v)}
