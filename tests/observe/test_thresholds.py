"""Thresholds: defaults, per-provider overrides, unknown keys refused; evaluate is pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from batch.errors import ConfigError
from batch.observe.health import Health, ProviderRun, evaluate
from batch.observe.state import StoreState
from batch.observe.thresholds import Thresholds, ThresholdSet, parse_thresholds

NOW = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
BANK, CARD = "BANK000001", "CARD000001"


def run(org: str, *, calls: int = 100, retried: int = 0, maxed: int = 0, timeouts: int = 0,
        p99: float | None = 0.1, open_min: float = 0.0) -> ProviderRun:
    return ProviderRun(org, calls, retried, maxed, timeouts, p99, open_min)


def healthy_state() -> StoreState:
    return StoreState(read_at=NOW, last_success=NOW - timedelta(hours=1))


def checks(health: Health, ts: ThresholdSet | None = None) -> set[tuple[str, str | None]]:
    return {(b.check, b.org_code) for b in evaluate(health, ts or ThresholdSet(), now=NOW)}


def test_a_healthy_run_breaches_nothing() -> None:
    assert checks(Health("r1", (run(BANK), run(CARD)), healthy_state())) == set()


def test_each_threshold_fires_on_its_own_signal() -> None:
    h = Health("r1", (run(BANK, retried=30, maxed=5, timeouts=4, p99=7.5, open_min=6.0),
                      run(CARD)),
               StoreState(read_at=NOW, dead_letters={CARD: 2},
                          dead_letter_oldest_age={CARD: 25 * 3600.0}, overdue={BANK: 3},
                          last_success=NOW - timedelta(hours=27)))
    assert checks(h) == {
        ("retry_ratio", BANK), ("max_attempt_ratio", BANK), ("timeout_rate", BANK),
        ("p99_latency_seconds", BANK), ("breaker_open_minutes", BANK),
        ("dead_letter_age_hours", CARD), ("consents_overdue", BANK),
        ("no_success_hours", None)}


def test_never_a_successful_run_is_a_breach() -> None:
    assert checks(Health(None, (), StoreState(read_at=NOW))) == {("no_success_hours", None)}


def test_ratios_wait_for_min_calls() -> None:
    h = Health("r1", (run(BANK, calls=10, retried=9, p99=60.0),), healthy_state())
    assert checks(h) == set()


def test_a_provider_override_replaces_the_default_for_that_provider_only() -> None:
    ts = parse_thresholds("""
[defaults]
retry_ratio = 0.05
[providers.BANK000001]
retry_ratio = 0.5
p99_latency_seconds = 10
""")
    h = Health("r1", (run(BANK, retried=20, p99=8.0), run(CARD, retried=20)), healthy_state())
    assert checks(h, ts) == {("retry_ratio", CARD)}
    assert ts.for_provider(BANK).timeout_rate == Thresholds().timeout_rate


def test_breach_lines_name_the_check_provider_value_and_threshold() -> None:
    h = Health("r1", (run(BANK, retried=42),), healthy_state())
    [b] = evaluate(h, ThresholdSet(), now=NOW)
    assert b.line() == "BREACH retry_ratio provider=BANK000001 value=0.42 threshold=0.1 run=r1"


@pytest.mark.parametrize(("text", "message"), [
    ("[defaults]\nretry_ratoi = 0.1\n",
     ":2: field 'defaults.retry_ratoi': unknown key; did you mean 'retry_ratio'?"),
    ("[providers.BANK000001]\nno_success_hours = 3\n",
     ":2: field 'providers.BANK000001.no_success_hours': a threshold of the whole run"),
    ("[alerts]\n", "unknown table(s) alerts"),
    ("[defaults]\nretry_ratio = 2\n", "retry_ratio is a ratio"),
    ("[defaults]\np99_latency_seconds = 'fast'\n", "p99_latency_seconds must be a number"),
    ("[defaults\n", "not valid TOML"),
])
def test_bad_thresholds_are_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_thresholds(text, source="t.toml")
