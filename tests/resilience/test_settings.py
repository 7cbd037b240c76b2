"""Chain settings: built from the institutions file, overrides, errors naming the field."""

from __future__ import annotations

import pytest

from batch.config import parse_institutions
from batch.errors import ConfigError
from batch.resilience import BreakerSettings, ChainSettings, RetrySettings, WindowType

TOML = """
operator_org_code = "OPERATOR01"
[[providers]]
org_code = "BANK000001"
industry = "bank"
base_url = "http://127.0.0.1:9001"
windows = ["0000:0600"]
calls_per_second = 50
max_concurrency = 20
read_timeout = 15
call_deadline = 40
{extra}
"""


def settings(extra: str = "") -> ChainSettings:
    inst = parse_institutions(TOML.format(extra=extra))
    return ChainSettings.from_provider(inst.providers[0])


def test_from_provider_takes_rate_concurrency_and_timeouts() -> None:
    s = settings()
    assert s.limiter.calls_per_second == 50
    assert s.bulkhead.max_concurrent == 20
    assert (s.timeouts.connect_timeout, s.timeouts.read_timeout,
            s.timeouts.call_deadline) == (3.0, 15.0, 40.0)
    assert s.timeouts.per_attempt == 18.0
    # slow = a few seconds, well before a call times out
    assert s.breaker.slow_call_duration == 5.0
    assert s.breaker.slow_call_rate_threshold == 0.6


def test_override_tables_tune_each_layer() -> None:
    s = settings('[providers.breaker]\nwindow_type = "time"\nwindow_size = 30\n'
                 "[providers.retry]\nmax_attempts = 5\n[providers.limiter]\nburst = 4\n")
    assert (s.breaker.window_type, s.breaker.window_size) == (WindowType.TIME, 30)
    assert s.retry.max_attempts == 5
    assert s.limiter.burst == 4 and s.limiter.calls_per_second == 50


@pytest.mark.parametrize(("extra", "field"), [
    ("[providers.breaker]\nfailure_rate_threshold = 1.5\n", "breaker.failure_rate_threshold"),
    ("[providers.breaker]\nwindow_type = \"sliding\"\n", "breaker.window_type"),
    ("[providers.breaker]\nwindow_szie = 3\n", "breaker.window_szie"),
    ("[providers.retry]\nmax_attempts = 0\n", "retry.max_attempts"),
    ("[providers.limiter]\nmax_wait = -1\n", "limiter.max_wait"),
    ("[providers.bulkhead]\nmax_wait = \"long\"\n", "bulkhead.max_wait"),
    ("breaker = 3\n", "breaker"),
])
def test_a_bad_override_names_its_field(extra: str, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        settings(extra)
    assert exc.value.field == field
    assert "(provider BANK000001)" in str(exc.value)


def test_constructors_validate() -> None:
    with pytest.raises(ConfigError, match="open_wait_max"):
        BreakerSettings(open_wait=60, open_wait_max=30)
    with pytest.raises(ConfigError, match="budget_floor"):
        RetrySettings(budget_floor=-1)


def test_open_wait_grows_and_is_capped() -> None:
    s = BreakerSettings(open_wait=10, open_wait_multiplier=3, open_wait_max=100)
    assert [s.open_wait_for(n) for n in (1, 2, 3, 4, 1000)] == [10, 30, 90, 100, 100]
