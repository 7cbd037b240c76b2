"""The consent lifecycle: what one refresh's outcome does to the consent, as one transition.

Every rule of MYDATA.md about a consent's week lives here and only here; the stores apply
the transitions (``batch.db.work.WorkStore.apply``) and decide nothing.

    outcome of the refresh                   transition          week_result        counted
    ---------------------------------------  ------------------  -----------------  --------
    00000 (the list and every live detail)   Done                done               reset
    42901                                    AlreadyTransferred  already_transferred  reset
    42901 after an unknown outcome this week AlreadyTransferred  transferred_not_received
    40305 / 40404 on the list call           DeadAsset           dead_asset
    provider fault / throttled               RetryLater          retrying           attempt
    40101 after the one token refresh        RetryLater          token_invalid      attempt
    timeout / 50003 / cancelled in flight    Unknown             unknown            both
    our own refusal (breaker, limiter, ...)  NotAttempted        unchanged          nothing
    4xx (our bug)                            DeadLetter          failed             reset
    the week's attempts used up              DeadLetter          attempts_exhausted reset
    a second unknown outcome this week       DeadLetter          unknown_twice      reset
    a called claim lost in two crashes       DeadLetter          unknown_twice (``admit``)
    the one token refresh succeeded          TokenRefreshed      (saved before the retried call)

40305/40404 on a detail call kills only that item: its id rides on whatever transition the
rest of the refresh earns (``dead_items``) and is never called on schedule again.

Counters (attempts, unknown outcomes) and the resume point (:class:`Progress`) belong to
one week: a claim reads those of another week as zero/none, so each week starts fresh.
A retry never waits past the start of the week's last open window minute while it is
still ahead: a consent must not silently miss its week.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar

from batch.client import Progress, RefreshResult
from batch.dispatch.policy import RetryPolicy
from batch.fastinit import fast_init
from batch.resilience.outcomes import Action, Kind, Outcome

if TYPE_CHECKING:
    from batch.db.work import Claim

WEEK = timedelta(days=7)


class Step(StrEnum):
    """The transition's name in the outcome log (``call_outcomes.action``)."""

    DONE = "done"
    DONE_FOR_WEEK = "done_for_week"
    DEAD_ASSET = "dead_asset"
    RETRY_LATER = "retry_later"
    REFRESH_TOKEN = "refresh_token"  # retried later: the token was refused after a refresh
    UNKNOWN = "unknown"
    NOT_ATTEMPTED = "not_attempted"
    DEAD_LETTER = "dead_letter"


class WeekResult(StrEnum):
    """What the consent's week came to so far (``consents.week_result``)."""

    DONE = "done"
    ALREADY_TRANSFERRED = "already_transferred"
    TRANSFERRED_NOT_RECEIVED = "transferred_not_received"
    DEAD_ASSET = "dead_asset"
    RETRYING = "retrying"
    TOKEN_INVALID = "token_invalid"
    UNKNOWN = "unknown"
    FAILED = "failed"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    UNKNOWN_TWICE = "unknown_twice"


# -- the transitions ------------------------------------------------------------------------

@fast_init
@dataclass(frozen=True, slots=True)
class Refreshed:
    """What every transition carries of its refresh: the outcome log row, the dead items."""

    consent_id: int
    org_code: str
    at: datetime
    kind: str
    rsp_code: str | None = None
    tran_id: str | None = None
    calls: int = 0
    elapsed_ms: int = 0
    #: item ids found dead on their detail call in this refresh: never called again
    dead_items: tuple[str, ...] = ()


@fast_init
@dataclass(frozen=True, slots=True)
class _Finished:
    log: Refreshed

    @property
    def consent_id(self) -> int:
        return self.log.consent_id

    @property
    def org_code(self) -> str:
        return self.log.org_code

    @property
    def at(self) -> datetime:
        return self.log.at


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Done(_Finished):
    """Transferred this week: due again next week, counters and progress cleared."""

    step: ClassVar[Step] = Step.DONE
    next_week: date


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class AlreadyTransferred(_Finished):
    """42901: the provider counted this week's transfer already; nothing more this week."""

    step: ClassVar[Step] = Step.DONE_FOR_WEEK
    next_week: date
    week_result: WeekResult
    error: str


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class DeadAsset(_Finished):
    """40305/40404 on the list call: the consent's asset is gone; never called again."""

    step: ClassVar[Step] = Step.DEAD_ASSET
    error: str


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class _DueAgain(_Finished):
    """Due again at ``not_before`` this week; the counters are the week's new totals."""

    week: date
    attempts: int
    unknown_attempts: int
    not_before: datetime
    error: str
    progress: Progress | None = None


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class RetryLater(_DueAgain):
    """A provider fault, a throttle, or a token refused after its refresh: one attempt."""

    week_result: WeekResult = WeekResult.RETRYING

    @property
    def step(self) -> Step:
        return (Step.REFRESH_TOKEN if self.week_result is WeekResult.TOKEN_INVALID
                else Step.RETRY_LATER)


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Unknown(_DueAgain):
    """The provider may have processed it: one more try, later; counts an unknown."""

    step: ClassVar[Step] = Step.UNKNOWN
    week_result: ClassVar[WeekResult] = WeekResult.UNKNOWN


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class NotAttempted(_Finished):
    """Refused by one of our own layers: stays due, nothing counted, progress kept."""

    step: ClassVar[Step] = Step.NOT_ATTEMPTED
    progress: Progress | None = None


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter(_Finished):
    """Given up for this week: a dead-letter row for the operator; due again next week."""

    step: ClassVar[Step] = Step.DEAD_LETTER
    week: date
    next_week: date
    attempts: int
    why: WeekResult
    error: str


@fast_init
@dataclass(frozen=True, slots=True)
class TokenRefreshed:
    """A refreshed token pair to store now (not logged; not lease-guarded: the provider
    may have rotated the refresh token, so the new pair is right whoever holds the lease).

    ``org_code`` and ``user_id`` are the consent's unique key: the store seals the pair
    bound to them (``batch.crypto.TokenSlot``) without reading the row again."""

    consent_id: int
    org_code: str
    user_id: str
    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False, default=None)

    @classmethod
    def of(cls, claim: Claim, access_token: str,
           refresh_token: str | None = None) -> TokenRefreshed:
        """The pair refreshed for ``claim``'s consent."""
        return cls(claim.id, claim.org_code, claim.user_id, access_token, refresh_token)


#: What a refresh does to its consent.
Transition = Done | AlreadyTransferred | DeadAsset | RetryLater | Unknown | NotAttempted \
    | DeadLetter
#: What a store applies: transitions, and token pairs that could not be saved at once.
Change = Transition | TokenRefreshed


# -- the rules ------------------------------------------------------------------------------

#: unknown outcomes in one week after which a consent is not called again that week
UNKNOWN_LIMIT = 2


def error_line(o: Outcome) -> str:
    """The outcome in one line for ``last_error`` and dead letters (never a token)."""
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


_DONE = Action.DONE


def decide(claim: Claim, result: RefreshResult, *, week: date, now: datetime,
           policy: RetryPolicy) -> Transition:
    """The consent's transition after ``result`` (the module docstring's table)."""
    o = result.outcome
    action = o.action
    base = Refreshed(claim.id, claim.org_code, now, o.kind._value_, o.rsp_code, o.tran_id,
                     result.calls, int(o.elapsed * 1000), result.dead_items)
    if action is _DONE:  # nearly every refresh (``Action.DONE`` is a 100 ns lookup)
        return Done(base, next_week=week + WEEK)
    progress = result.progress if result.progress is not None else claim.progress
    if action is Action.DONE_FOR_WEEK:
        name = (WeekResult.TRANSFERRED_NOT_RECEIVED if claim.unknown_attempts > 0
                else WeekResult.ALREADY_TRANSFERRED)
        return AlreadyTransferred(base, next_week=week + WEEK, week_result=name,
                                  error=error_line(o))
    if action is Action.DEAD_ASSET:
        return DeadAsset(base, error=error_line(o))
    if action is Action.NOT_ATTEMPTED:
        return NotAttempted(base, progress=progress)
    attempts = claim.attempts + 1
    if action is Action.FAIL:
        return _dead_letter(base, week, attempts, WeekResult.FAILED, error_line(o))
    if action is Action.UNKNOWN:
        unknowns = claim.unknown_attempts + 1
        if unknowns >= UNKNOWN_LIMIT:
            return _dead_letter(base, week, attempts, WeekResult.UNKNOWN_TWICE, error_line(o))
        return Unknown(base, week=week, attempts=attempts, unknown_attempts=unknowns,
                       not_before=policy.retry_at(now, policy.unknown_delay, week=week),
                       error=error_line(o), progress=progress)
    # RETRY_LATER (fault, throttled) and REFRESH_TOKEN (refused after the token refresh)
    if attempts >= policy.max_attempts:
        return _dead_letter(base, week, attempts, WeekResult.ATTEMPTS_EXHAUSTED, error_line(o))
    name = WeekResult.TOKEN_INVALID if action is Action.REFRESH_TOKEN else WeekResult.RETRYING
    return RetryLater(base, week=week, attempts=attempts,
                      unknown_attempts=claim.unknown_attempts,
                      not_before=policy.retry_at(now, policy.delay(attempts), week=week),
                      week_result=name, error=error_line(o), progress=progress)


def admit(claim: Claim, *, week: date, now: datetime) -> DeadLetter | None:
    """Before a claim is called: a consent whose calls were lost in crashes
    ``UNKNOWN_LIMIT`` times this week is dead-lettered instead (not called again)."""
    if claim.unknown_attempts < UNKNOWN_LIMIT:
        return None
    base = Refreshed(claim.id, claim.org_code, now, Kind.TIMEOUT.value)
    return _dead_letter(base, week, claim.attempts, WeekResult.UNKNOWN_TWICE,
                        "outcome unknown twice (lost in a crash); not called again this week")


def unsaved_tokens(claim: Claim, result: RefreshResult) -> TokenRefreshed | None:
    """A refreshed pair the client could not save at once, to store with the outcomes."""
    if result.new_access_token is None:
        return None
    return TokenRefreshed.of(claim, result.new_access_token, result.new_refresh_token)


def _dead_letter(base: Refreshed, week: date, attempts: int, why: WeekResult,
                 error: str) -> DeadLetter:
    return DeadLetter(base, week=week, next_week=week + WEEK, attempts=attempts,
                      why=why, error=f"{why.value}: {error}")
