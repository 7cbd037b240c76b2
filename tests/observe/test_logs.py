"""Log lines: JSON with the run's context under cron, readable on a terminal, no token."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from batch.clock import FakeClock
from batch.logs import LOGGERS, setup_logging
from batch.observe.logbook import BUDGET_LOG_EVERY, EventLog
from batch.resilience.events import RateAdjusted, RetrySkipped, StateChanged

TOKEN = "tok-SECRET-abc123"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level,
                 logging.getLogger(n).propagate) for n in LOGGERS}
    yield
    for n, (handlers, level, propagate) in saved.items():
        lg = logging.getLogger(n)
        lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_json_lines_carry_run_worker_org_action_and_the_tran_id(restore_logging: None) -> None:
    out = io.StringIO()
    setup_logging(stream=out, run_id="run-1", worker_id="host-1")
    logging.getLogger("mydata.dispatch").warning(
        "claim failed with Bearer %s", TOKEN,
        extra={"action": "claim_failed", "org_code": "BANK000001",
               "tran_id": "OPERATOR01A00000000000001", "access_token": TOKEN})
    logging.getLogger("batch.resilience").error("listener failed")
    first, second = (json.loads(ln) for ln in out.getvalue().splitlines())
    assert first["run_id"] == "run-1" and first["worker_id"] == "host-1"
    assert first["org_code"] == "BANK000001" and first["action"] == "claim_failed"
    assert first["x-api-tran-id"] == "OPERATOR01A00000000000001"
    assert second["action"] is None and second["org_code"] is None  # always present
    assert TOKEN not in out.getvalue()


def test_a_terminal_gets_readable_lines(restore_logging: None) -> None:
    out = Tty()
    setup_logging(stream=out, run_id="run-1", worker_id="host-1")
    logging.getLogger("mydata.run").info("planning", extra={"action": "plan",
                                                           "org_code": "BANK000001"})
    line = out.getvalue().strip()
    assert not line.startswith("{")
    assert " info    plan BANK000001 planning" in line


def test_breaker_throttling_and_budget_are_logged_budget_once_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    events = EventLog(clock=clock, run_id="run-1")
    caplog.set_level(logging.INFO, logger="mydata.resilience")
    events(StateChanged("BANK000001", "closed", "open", 1.0, "failure rate 0.6",
                        "OPERATOR01A00000000000009"))
    events(RateAdjusted("BANK000001", 5.0, 10.0, "throttled", None,
                        "OPERATOR01A00000000000010"))
    for _ in range(50):
        events(RetrySkipped("BANK000001", None, 1, "retry budget exhausted"))
    clock.advance(BUDGET_LOG_EVERY)
    events(RetrySkipped("BANK000001", None, 1, "retry budget exhausted"))
    events(RetrySkipped("BANK000001", None, 3, "attempts exhausted"))  # not worth a line
    actions = [(r.__dict__["action"], r.__dict__.get("skipped")) for r in caplog.records]
    assert actions == [("breaker_transition", None), ("rate_throttled", None),
                       ("retry_budget_exhausted", 1), ("retry_budget_exhausted", 50)]
    assert caplog.records[0].__dict__["tran_id"] == "OPERATOR01A00000000000009"


@pytest.mark.parametrize("new, level", [
    ("open", logging.WARNING), ("half_open", logging.WARNING),
    ("forced_open", logging.WARNING), ("closed", logging.INFO),
    ("metrics_only", logging.INFO), ("disabled", logging.INFO),
])
def test_a_breaker_transition_warns_only_when_calls_are_refused_or_on_trial(
        caplog: pytest.LogCaptureFixture, new: str, level: int) -> None:
    """Cluster mode sets every provider's breaker to metrics_only at each worker's start
    (and its probe chains' to disabled): 24 warnings a start for 6 providers and 2 workers,
    none of them anything an operator must act on."""
    caplog.set_level(logging.INFO, logger="mydata.resilience")
    EventLog(clock=FakeClock(), run_id="run-1")(
        StateChanged("BANK000001", "closed", new, 1.0, "why", None))
    assert [(r.levelno, r.__dict__["to_state"]) for r in caplog.records] == [(level, new)]
