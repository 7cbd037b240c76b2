"""The end-of-run summary: one typed, frozen object, its JSON form and its table.

``run --json`` prints :meth:`RunSummary.to_json`; ``runs.summary`` stores it; the dashboard
and the demo read it back with :meth:`RunSummary.from_json`. DESIGN.md fixes ``run_id``,
``date`` and ``providers[]`` with ``org_code, planned, attempted, succeeded, failed,
deferred, dead_lettered``; every other key the summary has had is kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The counters of a provider's summary, summed into the run's totals.
COUNTERS = ("planned", "attempted_before_run", "attempted", "succeeded", "already_transferred",
            "dead_assets", "failed", "deferred", "not_attempted", "dead_lettered", "calls",
            "missed_slices", "slices", "unplaceable_this_week")
#: The counters DESIGN.md requires of every provider.
REQUIRED = ("planned", "attempted", "succeeded", "failed", "deferred", "dead_lettered")


class SummaryError(ValueError):
    """A stored summary that is not the shape :meth:`RunSummary.to_json` writes."""


def _int(doc: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SummaryError(f"{key} is not a whole number: {value!r}")
    return value


def _float(doc: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SummaryError(f"{key} is not a number: {value!r}")
    return float(value)


def _counts(value: Any, key: str) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
            for k, v in value.items()):
        raise SummaryError(f"{key} is not a mapping of counts")
    return dict(value)


@dataclass(frozen=True, slots=True)
class Lateness:
    """Slice-start lateness in milliseconds."""

    p50: float = 0.0
    p99: float = 0.0
    max: float = 0.0

    def to_json(self) -> dict[str, float]:
        return {"p50": self.p50, "p99": self.p99, "max": self.max}


@dataclass(frozen=True, slots=True, eq=True)
class ProviderSummary:
    """What one provider's run did. ``counters`` holds :data:`COUNTERS`; ``extra`` any other
    key of ``ProviderStats.summary()`` (kept as given, so new keys ride along)."""

    org_code: str
    counters: Mapping[str, int]
    by_outcome: Mapping[str, int] = field(default_factory=dict)
    by_action: Mapping[str, int] = field(default_factory=dict)
    by_code: Mapping[str, int] = field(default_factory=dict)
    calls_per_second: float = 0.0
    slice_lateness_ms: Lateness = Lateness()
    breaker: str = "closed"
    chain: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.org_code:
            raise SummaryError("org_code is empty")
        missing = [k for k in COUNTERS if k not in self.counters]
        if missing:
            raise SummaryError(f"{self.org_code}: missing counters {', '.join(missing)}")
        bad = [k for k, v in self.counters.items() if isinstance(v, bool) or v < 0]
        if bad:
            raise SummaryError(f"{self.org_code}: counters below zero: {', '.join(bad)}")

    def count(self, name: str) -> int:
        """One of :data:`COUNTERS`."""
        return self.counters[name]

    @property
    def attention(self) -> bool:
        """Deferred work, dead letters, our own 4xx bugs, or consents the week's plan cannot
        place (they miss their week): an operator must look."""
        return bool(self.counters["deferred"] or self.counters["dead_lettered"]
                    or self.counters["unplaceable_this_week"]
                    or self.by_outcome.get("client"))

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any], *,
                   chain: Mapping[str, Any] | None = None) -> ProviderSummary:
        """From ``ProviderStats.summary()`` (and the chain's snapshot)."""
        doc = dict(stats)
        if chain is not None:
            doc["chain"] = dict(chain)
        return cls.from_json(doc)

    @classmethod
    def from_json(cls, doc: Any) -> ProviderSummary:
        if not isinstance(doc, Mapping):
            raise SummaryError("a provider's summary is not an object")
        org = doc.get("org_code")
        if not isinstance(org, str):
            raise SummaryError("org_code is not text")
        counters = {k: _int(doc, k, None if k in REQUIRED else 0) for k in COUNTERS}
        late = doc.get("slice_lateness_ms") or {}
        if not isinstance(late, Mapping):
            raise SummaryError("slice_lateness_ms is not an object")
        chain = doc.get("chain")
        if chain is not None and not isinstance(chain, Mapping):
            raise SummaryError("chain is not an object")
        known = {*COUNTERS, "org_code", "by_outcome", "by_action", "by_code",
                 "calls_per_second", "slice_lateness_ms", "breaker", "chain"}
        return cls(
            org_code=org, counters=counters,
            by_outcome=_counts(doc.get("by_outcome"), "by_outcome"),
            by_action=_counts(doc.get("by_action"), "by_action"),
            by_code=_counts(doc.get("by_code"), "by_code"),
            calls_per_second=_float(doc, "calls_per_second"),
            slice_lateness_ms=Lateness(_float(late, "p50"), _float(late, "p99"),
                                       _float(late, "max")),
            breaker=str(doc.get("breaker", "closed")),
            chain=None if chain is None else dict(chain),
            extra={k: v for k, v in doc.items() if k not in known},
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"org_code": self.org_code}
        out.update(self.counters)
        out.update(self.extra)
        out.update({
            "by_outcome": dict(self.by_outcome), "by_action": dict(self.by_action),
            "by_code": dict(self.by_code), "calls_per_second": self.calls_per_second,
            "slice_lateness_ms": self.slice_lateness_ms.to_json(), "breaker": self.breaker,
        })
        if self.chain is not None:
            out["chain"] = dict(self.chain)
        return out


@dataclass(frozen=True, slots=True)
class RunSummary:
    """The end of one ``run``. ``replanned``: why the day was planned again at its start
    (None: the saved plan was run as it was); ``error``: why a run failed."""

    run_id: str
    date: str
    week_start: str
    worker_id: str
    status: str
    exit_code: int
    elapsed_seconds: float
    providers: tuple[ProviderSummary, ...]
    window_override: tuple[str, ...] | None = None
    outcomes_persisted: bool = True
    unwritten_outcomes: int = 0
    replanned: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if not self.run_id:
            raise SummaryError("run_id is empty")
        orgs = [p.org_code for p in self.providers]
        if len(set(orgs)) != len(orgs):
            raise SummaryError("a provider appears twice")

    @property
    def totals(self) -> dict[str, int]:
        return {k: sum(p.counters[k] for p in self.providers) for k in COUNTERS}

    def provider(self, org_code: str) -> ProviderSummary:
        for p in self.providers:
            if p.org_code == org_code:
                return p
        raise KeyError(org_code)

    def to_json(self) -> dict[str, Any]:
        """The ``run --json`` object (plain types only)."""
        return {
            "run_id": self.run_id, "date": self.date, "week_start": self.week_start,
            "worker_id": self.worker_id, "status": self.status, "exit_code": self.exit_code,
            "elapsed_seconds": self.elapsed_seconds,
            "window_override": list(self.window_override) if self.window_override else None,
            "replanned": self.replanned, "error": self.error,
            "outcomes_persisted": self.outcomes_persisted,
            "unwritten_outcomes": self.unwritten_outcomes,
            "providers": [p.to_json() for p in self.providers],
            "totals": self.totals,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def from_json(cls, doc: str | Mapping[str, Any]) -> RunSummary:
        """Read a summary back (the object or its JSON text); SummaryError when it is not
        the shape :meth:`to_json` writes."""
        if isinstance(doc, str):
            try:
                doc = json.loads(doc)
            except ValueError as exc:
                raise SummaryError(f"not JSON: {exc}") from None
        if not isinstance(doc, Mapping):
            raise SummaryError("a run summary is not an object")
        provs = doc.get("providers")
        if not isinstance(provs, Sequence) or isinstance(provs, str):
            raise SummaryError("providers is not a list")
        override = doc.get("window_override")
        run_id = doc.get("run_id")
        if not isinstance(run_id, str):
            raise SummaryError("run_id is not text")

        def text(key: str, default: str = "") -> str:
            value = doc.get(key, default)
            if not isinstance(value, str):
                raise SummaryError(f"{key} is not text")
            return value

        def maybe(key: str) -> str | None:
            value = doc.get(key)
            return None if value is None else str(value)

        return cls(
            run_id=run_id, date=text("date"), week_start=text("week_start"),
            worker_id=text("worker_id"), status=text("status", "done"),
            exit_code=_int(doc, "exit_code", 0), elapsed_seconds=_float(doc, "elapsed_seconds"),
            providers=tuple(ProviderSummary.from_json(p) for p in provs),
            window_override=tuple(str(w) for w in override) if override else None,
            outcomes_persisted=bool(doc.get("outcomes_persisted", True)),
            unwritten_outcomes=_int(doc, "unwritten_outcomes", 0),
            replanned=maybe("replanned"), error=maybe("error"),
        )


#: (heading, counter, width); "earlier": today's attempts by the runs before this one, so
#: that a second run of the day does not show its plan as untouched (planned 2,418,
#: attempted 0, deferred 0: where did they go?)
_COLUMNS = (("provider", "org_code", 10), ("planned", "planned", 9),
            ("earlier", "attempted_before_run", 8), ("attempted", "attempted", 9),
            ("ok", "succeeded", 9), ("failed", "failed", 7),
            ("deferred", "deferred", 8), ("dead-ltr", "dead_lettered", 8),
            ("calls", "calls", 8))


def format_summary(summary: RunSummary) -> str:
    """The end-of-run summary as an aligned table for a person."""
    head = "  ".join(f"{h:>{w}}" if i else f"{h:<{w}}" for i, (h, _, w) in enumerate(_COLUMNS))
    head += f"  {'calls/s':>8}  late p50/p99 ms  missed  breaker"
    out = [f"run {summary.run_id}  {summary.date}  status {summary.status}  "
           f"({summary.elapsed_seconds} s)"]
    if summary.window_override:
        out.append(f"window override {', '.join(summary.window_override)}")
    if summary.replanned:
        out.append(f"re-planned at start: {summary.replanned}")
    if summary.error:
        # a run that failed says why; a merged one that did not, what an operator must see
        # (a worker process that died: batch/cluster/processes.py)
        out.append(f"{'failed' if summary.status == 'failed' else 'attention'}: "
                   f"{summary.error}")
    out += [head, "-" * len(head)]
    for p in summary.providers:
        cells = [f"{p.org_code:<{_COLUMNS[0][2]}}"]
        cells += [f"{p.counters[k]:>{w},}" for _, k, w in _COLUMNS[1:]]
        late = p.slice_lateness_ms
        out.append("  ".join(cells) + f"  {p.calls_per_second:>8}  {late.p50:>6.2f}/"
                   f"{late.p99:<8.2f}  {p.counters['missed_slices']:>6}  {p.breaker}")
    t = summary.totals
    out.append("-" * len(head))
    out.append(f"{'total':<10}  " + "  ".join(f"{t[k]:>{w},}" for _, k, w in _COLUMNS[1:]))
    gone = [(p.org_code, n) for p in summary.providers
            if isinstance(n := p.extra.get("no_longer_due"), int) and n > 0]
    if gone:
        out.append("of today's quota no longer due (revoked, or refreshed by another run, "
                   "meanwhile; not deferred): " + ", ".join(f"{o} {n:,}" for o, n in gone))
    missing = [(p.org_code, p.counters["unplaceable_this_week"]) for p in summary.providers
               if p.counters["unplaceable_this_week"]]
    if missing:
        out.append("!!! consents this week's plan cannot place (they miss their week): "
                   + ", ".join(f"{o} {n:,}" for o, n in missing)
                   + "; widen the windows or raise calls_per_second !!!")
    return "\n".join(out)
