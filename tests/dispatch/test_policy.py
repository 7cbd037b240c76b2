from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

from batch.client import RefreshResult
from batch.db.work import Claim
from batch.dispatch.policy import RetryPolicy, decide
from batch.resilience.outcomes import Kind, Layer, Outcome, rejected, timed_out

WEEK = date(2026, 11, 29)
NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
POLICY = RetryPolicy(max_attempts=3)


def claim(attempts: int = 0, unknown: int = 0) -> Claim:
    return Claim(7, "BANK000001", "u", WEEK, attempts, unknown, False, access_token="t")


def out(kind: Kind, code: str | None = None, **kw: object) -> RefreshResult:
    return RefreshResult(Outcome(kind, code, **kw), calls=1)  # type: ignore[arg-type]


def test_success_is_done_until_next_week() -> None:
    r = decide(claim(), out(Kind.SUCCESS, "00000"), week=WEEK, now=NOW, policy=POLICY)
    assert r.action == "done" and r.next_due_week == WEEK + timedelta(days=7)


def test_42901_after_an_unknown_outcome_is_transferred_but_not_received() -> None:
    r = decide(claim(unknown=1), out(Kind.CONSENT, "42901"), week=WEEK, now=NOW, policy=POLICY)
    assert r.week_result == "transferred_not_received"
    assert r.next_due_week == WEEK + timedelta(days=7)
    r2 = decide(claim(), out(Kind.CONSENT, "42901"), week=WEEK, now=NOW, policy=POLICY)
    assert r2.week_result == "already_transferred"


def test_dead_asset_is_never_called_again() -> None:
    r = decide(claim(), out(Kind.CONSENT, "40404"), week=WEEK, now=NOW, policy=POLICY)
    assert r.action == "dead_asset"


def test_retryable_fault_is_due_later_with_growing_backoff_then_dead_lettered() -> None:
    r1 = decide(claim(0), out(Kind.FAULT, "50001", retryable=True), week=WEEK, now=NOW,
                policy=POLICY)
    r2 = decide(claim(1), out(Kind.FAULT, "50001", retryable=True), week=WEEK, now=NOW,
                policy=POLICY)
    assert r1.action == "retry_later" and r1.not_before == NOW + timedelta(minutes=10)
    assert r2.not_before == NOW + timedelta(minutes=20)
    r3 = decide(claim(2), out(Kind.FAULT, "50001", retryable=True), week=WEEK, now=NOW,
                policy=POLICY)
    assert r3.dead_letter and r3.attempts_total == 3 and "attempts_exhausted" in (r3.error or "")


def test_timeout_is_retried_once_then_dead_lettered() -> None:
    first = decide(claim(), RefreshResult(timed_out(), calls=1), week=WEEK, now=NOW,
                   policy=POLICY)
    assert first.action == "unknown" and first.count_unknown and not first.dead_letter
    second = decide(claim(1, unknown=1), RefreshResult(timed_out(), calls=1), week=WEEK,
                    now=NOW, policy=POLICY)
    assert second.dead_letter


def test_our_rejection_is_not_an_attempt() -> None:
    r = decide(claim(), RefreshResult(rejected(Layer.BREAKER), calls=0), week=WEEK, now=NOW,
               policy=POLICY)
    assert r.action == "not_attempted" and not r.count_attempt and r.next_due_week is None


def test_our_bug_goes_straight_to_the_dead_letter_table() -> None:
    r = decide(claim(), out(Kind.CLIENT, "40002"), week=WEEK, now=NOW, policy=POLICY)
    assert r.dead_letter and r.week_result == "failed"


def test_a_detail_failure_keeps_the_remaining_items_for_the_next_try() -> None:
    res = RefreshResult(Outcome(Kind.FAULT, "50002", retryable=True), calls=3,
                        pending_items=("A2", "A3"))
    r = decide(claim(), res, week=WEEK, now=NOW, policy=POLICY)
    assert json.loads(r.pending_items or "null") == ["A2", "A3"]
