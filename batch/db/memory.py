"""An in-memory twin of the dispatcher's work store, for unit tests and benchmarks.

Same semantics as :class:`batch.db.work.SqlWorkStore`: keyset order over (due_week, id),
leases, stale claims marked unknown, writes only by the lease holder. Answers at once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from batch.db.work import START, Claim, Cursor, Record


@dataclass(slots=True)
class MemoryConsent:
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
    week_result: str | None = None
    pending_items: str | None = None
    last_error: str | None = None
    last_scheduled_at: datetime | None = None
    lease_owner: str | None = None
    lease_until: datetime | None = None


class MemoryWorkStore:
    """Consents in a dict; outcomes and dead letters in lists."""

    def __init__(self) -> None:
        self.consents: dict[int, MemoryConsent] = {}
        self.outcomes: list[Record] = []
        self.dead_letters: list[Record] = []
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
            stale = c.lease_owner is not None
            if stale:
                c.unknown_attempts += 1
            c.lease_owner, c.lease_until = worker, now + lease
            out.append(Claim(c.id, org_code, c.user_id, c.due_week, c.attempts,
                             c.unknown_attempts, stale, access_token=c.access_token,
                             refresh_token=c.refresh_token,
                             pending_items=tuple(json.loads(c.pending_items))
                             if c.pending_items else None))
        return out

    async def release(self, ids: Sequence[int], *, worker: str) -> int:
        n = 0
        for i in ids:
            c = self.consents[i]
            if c.lease_owner == worker:
                c.lease_owner = c.lease_until = None
                n += 1
        return n

    async def extend(self, ids: Sequence[int], *, worker: str, until: datetime) -> int:
        n = 0
        for i in ids:
            c = self.consents[i]
            if c.lease_owner == worker:
                c.lease_until = until
                n += 1
        return n

    async def write(self, records: Sequence[Record], *, run_id: str, worker: str,
                    day: date) -> None:
        if self.fail_writes > 0:
            self.fail_writes -= 1
            raise ConnectionError("database unreachable (simulated)")
        for r in records:
            c = self.consents[r.consent_id]
            if c.lease_owner == worker:
                if r.next_due_week is not None:
                    c.due_week = r.next_due_week
                    c.attempts = c.unknown_attempts = 0
                    c.pending_items = None
                    if r.action == "done":
                        c.last_scheduled_at = r.at
                elif r.action == "dead_asset":
                    c.status = "dead"
                else:
                    c.attempts += int(r.count_attempt)
                    c.unknown_attempts += int(r.count_unknown)
                    c.not_before = r.not_before or c.not_before
                    c.pending_items = r.pending_items
                c.week_result = r.week_result or c.week_result
                c.last_error = r.error or c.last_error
                c.lease_owner = c.lease_until = None
            if r.new_access_token is not None:
                c.access_token = r.new_access_token
            if r.dead_letter:
                self.dead_letters.append(r)
            self.outcomes.append(r)
