"""The lifecycle table (batch/lifecycle.py): one outcome -> one transition, pure."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from batch.client import Progress, RefreshResult
from batch.db.work import Claim
from batch.dispatch.policy import RetryPolicy
from batch.lifecycle import (
    AlreadyTransferred,
    DeadAsset,
    DeadLetter,
    Done,
    NotAttempted,
    RetryLater,
    Step,
    TokenRefreshed,
    Unknown,
    WeekResult,
    admit,
    decide,
    unsaved_tokens,
)
from batch.resilience.outcomes import Kind, Layer, Outcome, rejected, timed_out

WEEK = date(2026, 11, 29)
NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
POLICY = RetryPolicy(max_attempts=3)


def claim(attempts: int = 0, unknown: int = 0, progress: Progress | None = None) -> Claim:
    return Claim(7, "BANK000001", "u", WEEK, attempts, unknown, False, access_token="t",
                 progress=progress)


def out(kind: Kind, code: str | None = None, *, retryable: bool = False) -> RefreshResult:
    return RefreshResult(Outcome(kind, code, retryable=retryable), calls=1)


def test_success_is_done_until_next_week() -> None:
    t = decide(claim(), out(Kind.SUCCESS, "00000"), week=WEEK, now=NOW, policy=POLICY)
    assert isinstance(t, Done) and t.next_week == WEEK + timedelta(days=7)
    assert t.step is Step.DONE and t.log.calls == 1


def test_42901_after_an_unknown_outcome_is_transferred_but_not_received() -> None:
    t = decide(claim(unknown=1), out(Kind.CONSENT, "42901"), week=WEEK, now=NOW, policy=POLICY)
    assert isinstance(t, AlreadyTransferred)
    assert t.week_result is WeekResult.TRANSFERRED_NOT_RECEIVED
    assert t.next_week == WEEK + timedelta(days=7)
    t2 = decide(claim(), out(Kind.CONSENT, "42901"), week=WEEK, now=NOW, policy=POLICY)
    assert isinstance(t2, AlreadyTransferred)
    assert t2.week_result is WeekResult.ALREADY_TRANSFERRED


def test_dead_asset_on_the_list_is_never_called_again() -> None:
    t = decide(claim(), out(Kind.CONSENT, "40404"), week=WEEK, now=NOW, policy=POLICY)
    assert isinstance(t, DeadAsset) and t.step is Step.DEAD_ASSET


def test_dead_items_found_on_details_ride_on_the_transition() -> None:
    res = RefreshResult(Outcome(Kind.SUCCESS, "00000"), calls=3, dead_items=("A1",))
    t = decide(claim(), res, week=WEEK, now=NOW, policy=POLICY)
    assert isinstance(t, Done) and t.log.dead_items == ("A1",)


def test_retryable_fault_is_due_later_with_growing_backoff_then_dead_lettered() -> None:
    fault = out(Kind.FAULT, "50001", retryable=True)
    t1 = decide(claim(0), fault, week=WEEK, now=NOW, policy=POLICY)
    t2 = decide(claim(1), fault, week=WEEK, now=NOW, policy=POLICY)
    assert isinstance(t1, RetryLater) and t1.not_before == NOW + timedelta(minutes=10)
    assert t1.attempts == 1 and t1.week == WEEK
    assert isinstance(t2, RetryLater) and t2.not_before == NOW + timedelta(minutes=20)
    t3 = decide(claim(2), fault, week=WEEK, now=NOW, policy=POLICY)
    assert isinstance(t3, DeadLetter) and t3.attempts == 3
    assert t3.why is WeekResult.ATTEMPTS_EXHAUSTED and "attempts_exhausted" in t3.error


def test_40101_after_the_token_refresh_is_retried_later_as_token_invalid() -> None:
    t = decide(claim(), out(Kind.CONSENT, "40101"), week=WEEK, now=NOW, policy=POLICY)
    assert isinstance(t, RetryLater) and t.week_result is WeekResult.TOKEN_INVALID
    assert t.step is Step.REFRESH_TOKEN


def test_timeout_is_retried_once_then_dead_lettered() -> None:
    first = decide(claim(), RefreshResult(timed_out(), calls=1), week=WEEK, now=NOW,
                   policy=POLICY)
    assert isinstance(first, Unknown) and first.unknown_attempts == 1 and first.attempts == 1
    second = decide(claim(1, unknown=1), RefreshResult(timed_out(), calls=1), week=WEEK,
                    now=NOW, policy=POLICY)
    assert isinstance(second, DeadLetter) and second.why is WeekResult.UNKNOWN_TWICE


def test_our_rejection_is_not_an_attempt_and_keeps_the_progress() -> None:
    kept = Progress(("A1",), "500")
    t = decide(claim(progress=kept), RefreshResult(rejected(Layer.BREAKER), calls=0),
               week=WEEK, now=NOW, policy=POLICY)
    assert isinstance(t, NotAttempted) and t.progress == kept


def test_our_bug_goes_straight_to_the_dead_letter_table() -> None:
    t = decide(claim(), out(Kind.CLIENT, "40002"), week=WEEK, now=NOW, policy=POLICY)
    assert isinstance(t, DeadLetter) and t.why is WeekResult.FAILED


def test_a_failure_part_way_keeps_the_progress_for_the_next_try() -> None:
    res = RefreshResult(Outcome(Kind.FAULT, "50002", retryable=True), calls=3,
                        progress=Progress(("A2", "A3")))
    t = decide(claim(), res, week=WEEK, now=NOW, policy=POLICY)
    assert isinstance(t, RetryLater) and t.progress == Progress(("A2", "A3"))


def test_a_claim_lost_in_two_crashes_is_not_admitted() -> None:
    assert admit(claim(unknown=1), week=WEEK, now=NOW) is None
    t = admit(claim(attempts=1, unknown=2), week=WEEK, now=NOW)
    assert isinstance(t, DeadLetter) and t.why is WeekResult.UNKNOWN_TWICE
    assert t.log.calls == 0 and t.attempts == 1


def test_a_token_pair_the_client_could_not_save_is_handed_to_the_store() -> None:
    assert unsaved_tokens(claim(), out(Kind.SUCCESS, "00000")) is None
    res = RefreshResult(Outcome(Kind.SUCCESS, "00000"), calls=2, new_access_token="tokA",
                        new_refresh_token="tokR")
    t = unsaved_tokens(claim(), res)
    # the consent's unique key goes with it: the store seals the pair bound to that row
    assert t == TokenRefreshed(7, "BANK000001", "u", "tokA", "tokR") and "tok" not in repr(t)
