"""The end-of-run summary: typed, frozen, its JSON keeps every key, read back exactly."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from batch.dispatch.stats import ProviderStats
from batch.dispatch.summary import (
    COUNTERS,
    ProviderSummary,
    RunSummary,
    SummaryError,
    format_summary,
)

#: DESIGN.md fixes these keys of ``run --json``.
DESIGN_KEYS = ("org_code", "planned", "attempted", "succeeded", "failed", "deferred",
               "dead_lettered")


def provider_stats(org: str, **counts: int) -> ProviderSummary:
    """A provider's summary as ``ProviderStats.summary()`` makes it, counters overridden."""
    stats = ProviderStats(org, day_quota=counts.pop("planned", 0))
    stats.by_action.update({"done": counts.pop("succeeded", 0),
                            "retry_later": counts.pop("failed", 0)})
    doc = stats.summary()
    doc.update(counts)
    return ProviderSummary.from_stats(doc, chain={"breaker": "closed"})


def _summary(**kw: Any) -> RunSummary:
    base: dict[str, Any] = dict(
        run_id="abc", date="2026-11-30", week_start="2026-11-29", worker_id="host-1",
        status="incomplete", exit_code=1, elapsed_seconds=12.5,
        providers=(provider_stats("BANK000001", planned=7, succeeded=5, failed=1),
                   provider_stats("CARD000002", planned=3, succeeded=3)),
        window_override=("0100:0130",), replanned="no plan saved")
    base.update(kw)
    return RunSummary(**base)


def test_to_json_keeps_every_key_of_the_stats_and_the_design_keys() -> None:
    stats = ProviderStats("BANK000001", day_quota=4)
    stats.by_action.update({"done": 3})
    doc = json.loads(json.dumps(_summary(providers=(
        ProviderSummary.from_stats(stats.summary(), chain={"x": 1}),)).to_json()))
    (p,) = doc["providers"]
    assert set(stats.summary()) | {"chain", "unplaceable_this_week"} == set(p)
    assert all(k in p for k in DESIGN_KEYS)
    assert (p["planned"], p["succeeded"], p["chain"]) == (4, 3, {"x": 1})
    for key in ("run_id", "date", "week_start", "worker_id", "status", "exit_code",
                "elapsed_seconds", "window_override", "outcomes_persisted",
                "unwritten_outcomes", "providers", "totals", "replanned"):
        assert key in doc, key
    assert set(doc["totals"]) == set(COUNTERS)


def test_a_summary_reads_back_equal_from_its_json() -> None:
    s = _summary()
    assert RunSummary.from_json(s.dumps()) == s
    assert RunSummary.from_json(s.to_json()) == s


def test_totals_sum_the_providers() -> None:
    t = _summary().totals
    assert (t["planned"], t["succeeded"], t["failed"], t["attempted"]) == (10, 8, 1, 9)


def test_a_summary_is_frozen() -> None:
    s = _summary()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.status = "done"  # type: ignore[misc]


@pytest.mark.parametrize("doc", [
    "not json", "[]", '{"providers": []}',
    '{"run_id": "r", "providers": [{"org_code": "B"}]}',             # counters missing
    '{"run_id": "r", "providers": [{"org_code": "B", "planned": "7", "attempted": 0, '
    '"succeeded": 0, "failed": 0, "deferred": 0, "dead_lettered": 0}]}',
])
def test_another_shape_is_refused(doc: str) -> None:
    with pytest.raises(SummaryError):
        RunSummary.from_json(doc)


def test_a_provider_twice_is_refused() -> None:
    p = provider_stats("BANK000001")
    with pytest.raises(SummaryError, match="twice"):
        _summary(providers=(p, p))


def test_the_table_shows_each_provider_the_totals_and_why_it_replanned() -> None:
    text = format_summary(_summary())
    lines = text.splitlines()
    assert lines[0].startswith("run abc  2026-11-30  status incomplete")
    assert "re-planned at start: no plan saved" in text
    assert "window override 0100:0130" in text
    row = next(ln for ln in lines if ln.startswith("BANK000001"))
    assert lines[3].split()[:5] == ["provider", "planned", "earlier", "attempted", "ok"]
    assert row.split()[1:5] == ["7", "0", "6", "5"]
    total = lines[-1].split()
    assert total[:5] == ["total", "10", "0", "9", "8"]


def test_the_table_shows_what_the_days_earlier_runs_attempted() -> None:
    """A second run of the day: its plan is not shown as untouched (planned, nothing
    attempted, nothing deferred) but as done by the runs before it."""
    def after(org: str, planned: int, earlier: int) -> ProviderSummary:
        stats = ProviderStats(org, day_quota=planned, attempted_before=earlier)
        return ProviderSummary.from_stats(stats.summary(), chain={"breaker": "closed"})

    text = format_summary(_summary(providers=(after("BANK000001", 515, 515),
                                              after("CARD000002", 396, 390))))
    rows = {ln.split()[0]: ln.split() for ln in text.splitlines()[4:]}
    # planned, earlier, attempted, ok, failed, deferred
    assert rows["BANK000001"][1:7] == ["515", "515", "0", "0", "0", "0"]
    assert rows["CARD000002"][1:7] == ["396", "390", "0", "0", "0", "6"]
    assert rows["total"][1:7] == ["911", "905", "0", "0", "0", "6"]
