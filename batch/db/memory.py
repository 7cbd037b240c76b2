"""An in-memory twin of the dispatcher's work store, for unit tests and benchmarks.

Same contract as :class:`batch.db.work.SqlWorkStore` (tests/db/test_lifecycle_contract.py
holds both to identical rows): keyset order over (due_week, id), leases, the start mark,
per-week counters, writes only by the lease holder. It applies the very column changes and
rows that :mod:`batch.db.work` defines for each transition. Answers at once.

Tokens are held plain: nothing here is at rest, so there is nothing to seal (the SQL store
seals them; the contract compares what a claim hands out, opened).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from batch.client import Progress
from batch.db.work import (
    RELEASED,
    START,
    Batch,
    Claim,
    Cursor,
    by_kind,
    consent_changes,
    dead_asset_rows,
    dead_letter_row,
    outcome_row,
    token_changes,
)
from batch.lifecycle import Change, DeadLetter, TokenRefreshed


@dataclass(slots=True)
class MemoryConsent:
    """The columns of one ``consents`` row the dispatcher reads or writes."""

    id: int
    org_code: str
    user_id: str
    due_week: date
    not_before: datetime
    access_token: str = field(repr=False)
    refresh_token: str | None = field(default=None, repr=False)
    status: str = "active"
    attempts: int = 0
    unknown_attempts: int = 0
    counters_week: date | None = None
    week_result: str | None = None
    pending_items: str | None = None
    last_error: str | None = None
    last_scheduled_at: datetime | None = None
    lease_owner: str | None = None
    lease_until: datetime | None = None
    started_at: datetime | None = None
    updated_at: datetime | None = None


class MemoryWorkStore:
    """Consents in a dict; outcome, dead-letter and dead-asset rows as column dicts."""

    def __init__(self) -> None:
        self.consents: dict[int, MemoryConsent] = {}
        self.outcomes: list[dict[str, Any]] = []
        self.dead_letters: list[dict[str, Any]] = []
        self.dead_assets: dict[tuple[int, str], dict[str, Any]] = {}
        self.claim_calls = 0
        self.fail_writes = 0

    def add(self, org_code: str, n: int, *, week: date, not_before: datetime,
            first_id: int | None = None) -> list[int]:
        start = first_id if first_id is not None else max(self.consents, default=0) + 1
        ids = list(range(start, start + n))
        for i in ids:
            self.consents[i] = MemoryConsent(i, org_code, f"user{i}", week, not_before,
                                             access_token=f"token-{i}")
        return ids

    async def claim(self, org_code: str, *, worker: str, week: date, now: datetime,
                    limit: int, after: Cursor = START,
                    lease: timedelta = timedelta(minutes=10)) -> list[Claim]:
        self.claim_calls += 1
        rows = sorted(
            (c for c in self.consents.values()
             if c.org_code == org_code and c.status == "active" and c.due_week <= week
             and (c.due_week, c.id) > after and c.not_before <= now
             and (c.lease_until is None or c.lease_until < now)),
            key=lambda c: (c.due_week, c.id),
        )[:limit]
        out = []
        for c in rows:
            stale = c.lease_owner is not None and c.started_at is not None
            if c.counters_week != week:
                c.attempts = c.unknown_attempts = 0
                c.pending_items = None
            c.counters_week = week
            c.unknown_attempts += int(stale)
            c.lease_owner, c.lease_until, c.started_at = worker, now + lease, None
            out.append(Claim(c.id, org_code, c.user_id, c.due_week, c.attempts,
                             c.unknown_attempts, stale, access_token=c.access_token,
                             refresh_token=c.refresh_token,
                             progress=Progress.from_json(c.pending_items)
                             if c.pending_items else None,
                             dead_items=frozenset(item for cid, item in self.dead_assets
                                                  if cid == c.id)))
        return out

    def _held(self, ids: Sequence[int], worker: str) -> list[MemoryConsent]:
        return [self.consents[i] for i in ids if self.consents[i].lease_owner == worker]

    async def release(self, ids: Sequence[int], *, worker: str) -> int:
        held = self._held(ids, worker)
        for c in held:
            _set(c, RELEASED)
        return len(held)

    async def extend(self, ids: Sequence[int], *, worker: str, until: datetime) -> int:
        held = self._held(ids, worker)
        for c in held:
            c.lease_until = until
        return len(held)

    async def mark_started(self, ids: Sequence[int], *, worker: str, at: datetime
                           ) -> set[int]:
        held = self._held(ids, worker)
        for c in held:
            c.started_at = c.started_at or at
        return {c.id for c in held}

    async def apply(self, changes: Sequence[Change], *, run_id: str, worker: str,
                    day: date) -> None:
        if self.fail_writes > 0:
            self.fail_writes -= 1
            raise ConnectionError("database unreachable (simulated)")
        batch = Batch.of(changes)
        held = batch.held({c.id for c in self._held(batch.ids(), worker)})
        for t in held:
            for row in dead_asset_rows(t):
                self.dead_assets.setdefault((row["consent_id"], row["item_id"]), row)
        for ts in by_kind(held).values():
            for t in ts:
                _set(self.consents[t.consent_id], consent_changes(t))
        for tok in batch.tokens:
            await self.save_token(tok)
        self.dead_letters.extend(dead_letter_row(t) for t in held if isinstance(t, DeadLetter))
        self.outcomes.extend(outcome_row(t, run_id=run_id, day=day) for t in batch.transitions)

    async def save_token(self, t: TokenRefreshed) -> bool:
        c = self.consents[t.consent_id]
        if c.status == "revoked":  # its tokens stay erased (work.token_changes)
            return False
        _set(c, token_changes(t))
        return True

    def open_access(self, claim: Claim) -> str:
        return claim.access_token

    def open_refresh(self, claim: Claim) -> str | None:
        return claim.refresh_token


def _set(c: MemoryConsent, values: dict[str, Any]) -> None:
    for k, v in values.items():
        setattr(c, k, v)
