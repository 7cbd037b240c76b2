"""What happens to a consent after a refresh: the lifecycle rules of MYDATA.md as one function.

    success                    -> done for the week (next due: next week)
    42901                      -> nothing more this week; after an unknown outcome it is
                                  recorded as transferred but not received
    40305 / 40404              -> dead asset: never again on schedule
    provider fault / throttled -> due again later this week, attempt counted
    timeout / 50003            -> outcome unknown: re-tried at most once, later
    our own rejection          -> not attempted: stays due, nothing counted
    40101 after token refresh  -> token invalid: retried later (a new token may be loaded)
    4xx (our bug)              -> failed: straight to the dead-letter table, operator alerted
    attempts exhausted         -> the dead-letter table with the last error
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from batch.client import RefreshResult
from batch.db.work import Claim, Record
from batch.resilience.outcomes import Action, Kind


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When a failed consent may be tried again, and how many tries a week it gets."""

    max_attempts: int = 5
    base_delay: timedelta = timedelta(minutes=10)
    max_delay: timedelta = timedelta(hours=6)
    unknown_delay: timedelta = timedelta(minutes=30)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.base_delay <= timedelta(0) or self.max_delay < self.base_delay:
            raise ValueError("base_delay must be > 0 and max_delay >= base_delay")

    def delay(self, attempts_so_far: int) -> timedelta:
        factor: int = 2 ** max(0, attempts_so_far - 1)
        return min(self.max_delay, self.base_delay * factor)


def _error(result: RefreshResult) -> str:
    o = result.outcome
    parts = [o.kind.value]
    if o.rsp_code:
        parts.append(o.rsp_code)
    elif o.http_status:
        parts.append(f"HTTP {o.http_status}")
    if o.layer:
        parts.append(f"by {o.layer.value}")
    if o.detail:
        parts.append(o.detail)
    return " ".join(parts)[:500]


def decide(
    claim: Claim,
    result: RefreshResult,
    *,
    week: date,
    now: datetime,
    policy: RetryPolicy,
) -> Record:
    """The consent's next state after ``result``."""
    o = result.outcome
    action = o.action
    next_week = week + timedelta(days=7)
    base = {
        "consent_id": claim.id, "org_code": claim.org_code, "kind": o.kind.value,
        "rsp_code": o.rsp_code, "tran_id": o.tran_id, "calls": result.calls,
        "elapsed_ms": int(o.elapsed * 1000), "at": now, "week_start": week,
        "new_access_token": result.new_access_token,
        "new_refresh_token": result.new_refresh_token,
    }
    if action is Action.DONE:
        return Record(action=action.value, error=None, next_due_week=next_week,
                      week_result="done", **base)  # type: ignore[arg-type]
    if action is Action.DONE_FOR_WEEK:
        result_name = ("transferred_not_received" if claim.unknown_attempts > 0
                       else "already_transferred")
        return Record(action=action.value, error=_error(result), next_due_week=next_week,
                      week_result=result_name, **base)  # type: ignore[arg-type]
    if action is Action.DEAD_ASSET:
        return Record(action=action.value, error=_error(result), week_result="dead_asset",
                      **base)  # type: ignore[arg-type]
    if action is Action.NOT_ATTEMPTED:
        return Record(action=action.value, error=None, count_attempt=False,
                      pending_items=_pending(result), **base)  # type: ignore[arg-type]
    attempts = claim.attempts + 1
    if action is Action.FAIL:
        return _dead_letter(base, action, result, attempts, next_week, "failed")
    if action is Action.UNKNOWN:
        if claim.unknown_attempts >= 1:
            return _dead_letter(base, action, result, attempts, next_week, "unknown_twice")
        return Record(action=action.value, error=_error(result), count_unknown=True,
                      not_before=now + policy.unknown_delay, week_result="unknown",
                      attempts_total=attempts, pending_items=_pending(result),
                      **base)  # type: ignore[arg-type]
    # RETRY_LATER (fault, throttled) and REFRESH_TOKEN (token invalid)
    if attempts >= policy.max_attempts:
        return _dead_letter(base, action, result, attempts, next_week, "attempts_exhausted")
    week_result = "token_invalid" if action is Action.REFRESH_TOKEN else "retrying"
    return Record(action=action.value, error=_error(result),
                  not_before=now + policy.delay(attempts), week_result=week_result,
                  attempts_total=attempts, pending_items=_pending(result),
                  **base)  # type: ignore[arg-type]


def give_up_unknown(claim: Claim, *, week: date, now: datetime) -> Record:
    """A claim whose one retry after an unknown outcome was itself lost: dead-letter it."""
    return Record(
        consent_id=claim.id, org_code=claim.org_code, action="dead_letter", kind=Kind.TIMEOUT.value,
        rsp_code=None, tran_id=None, calls=0, elapsed_ms=0,
        error="outcome unknown twice (lost in a crash); not called again this week", at=now,
        next_due_week=week + timedelta(days=7), week_result="unknown_twice", dead_letter=True,
        attempts_total=claim.attempts, week_start=week,
    )


def _pending(result: RefreshResult) -> str | None:
    return json.dumps(list(result.pending_items)) if result.pending_items is not None else None


def _dead_letter(base: dict[str, object], action: Action, result: RefreshResult,
                 attempts: int, next_week: date, why: str) -> Record:
    return Record(action="dead_letter", error=f"{why}: {_error(result)}",
                  next_due_week=next_week, week_result=why, dead_letter=True,
                  attempts_total=attempts, **base)  # type: ignore[arg-type]
