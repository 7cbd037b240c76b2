"""What one provider's run did: counters, slice lateness, planned vs done per minute."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from batch.dispatch.pacing import SLICE_SECONDS, percentile
from batch.lifecycle import Step


@dataclass(slots=True)
class MinuteRecord:
    minute: int
    planned: int
    started: int


@dataclass(slots=True)
class ProviderStats:
    """Mutable counters for one provider, updated by the dispatcher, read by progress."""

    org_code: str
    day_quota: int = 0
    attempted_before: int = 0
    started: int = 0
    in_flight: int = 0
    calls: int = 0
    #: transitions by :class:`batch.lifecycle.Step` value
    by_action: Counter[str] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    by_code: Counter[str] = field(default_factory=Counter)
    dead_lettered: int = 0
    lateness: list[float] = field(default_factory=list)
    missed_slices: int = 0
    minutes: list[MinuteRecord] = field(default_factory=list)
    skipped_breaker_open: int = 0
    #: slices whose starts waited: as many refreshes under way as the provider can take
    busy_slices: int = 0
    claim_errors: int = 0
    #: claims found no longer ours at their start mark (revoked, or the lease taken by
    #: another worker that saw this one dead): dropped, never started
    claims_lost: int = 0
    first_start: float | None = None
    last_finish: float | None = None
    minute_planned: int = 0
    minute_started: int = 0
    #: the provider's breaker state, read when asked (the dispatcher gives its chain's;
    #: asked by progress lines and summaries, not set at each of thousands of finishes)
    state_of: Callable[[], str] = field(default=lambda: "closed", repr=False)

    @property
    def breaker_state(self) -> str:
        return self.state_of()

    def freeze_state(self) -> None:
        """Keep the breaker's state as it is now (the run is over)."""
        state = self.state_of()
        self.state_of = lambda: state

    def tick(self, lateness: float) -> None:
        self.lateness.append(lateness)
        if lateness >= SLICE_SECONDS:
            self.missed_slices += 1

    @property
    def attempted(self) -> int:
        return sum(self.by_action.values()) - self._count(Step.NOT_ATTEMPTED)

    @property
    def succeeded(self) -> int:
        return self._count(Step.DONE)

    @property
    def left(self) -> int:
        """Of the day's quota, what neither this run nor the day's earlier runs attempted
        (the summary's ``deferred`` before it is capped by what is still due)."""
        return max(0, self.day_quota - self.attempted_before - self.attempted)

    def _count(self, step: Step) -> int:
        return self.by_action.get(step.value, 0)

    def summary(self) -> dict[str, Any]:
        late = sorted(self.lateness)
        active = ((self.last_finish - self.first_start)
                  if self.first_start is not None and self.last_finish is not None else 0.0)
        attempted = self.attempted
        benign = (self._count(Step.DONE) + self._count(Step.DONE_FOR_WEEK)
                  + self._count(Step.DEAD_ASSET))
        planned_sum = sum(m.planned for m in self.minutes)
        err = sum(abs(m.planned - m.started) for m in self.minutes)
        return {
            "org_code": self.org_code,
            "planned": self.day_quota,
            "attempted_before_run": self.attempted_before,
            "attempted": attempted,
            "succeeded": self.succeeded,
            "already_transferred": self._count(Step.DONE_FOR_WEEK),
            "dead_assets": self._count(Step.DEAD_ASSET),
            "failed": attempted - benign,
            "deferred": self.left,
            "not_attempted": self._count(Step.NOT_ATTEMPTED),
            "dead_lettered": self.dead_lettered,
            "by_outcome": dict(sorted(self.by_kind.items())),
            "by_action": dict(sorted(self.by_action.items())),
            "by_code": dict(sorted(self.by_code.items())),
            "calls": self.calls,
            "calls_per_second": round(self.calls / active, 1) if active > 0 else 0.0,
            "slice_lateness_ms": {
                "p50": round(percentile(late, 50) * 1000, 2),
                "p99": round(percentile(late, 99) * 1000, 2),
                "max": round(late[-1] * 1000, 2) if late else 0.0,
            },
            "slices": len(late),
            "missed_slices": self.missed_slices,
            "minutes": len(self.minutes),
            "planned_vs_started_error": round(err / planned_sum, 4) if planned_sum else 0.0,
            "skipped_breaker_open": self.skipped_breaker_open,
            "busy_slices": self.busy_slices,
            "claims_lost": self.claims_lost,
            "breaker": self.breaker_state,
        }
