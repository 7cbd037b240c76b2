"""``run_minutes``: one row per provider per minute of a run, for ``check`` and the page.

A row joins what the chain did in that minute (the recorder's cut) with what the dispatcher
planned and started (its ``MinuteRecord``) and how late its slices were. Rows are kept for
the run and upserted, so a minute whose dispatcher record arrives after its cut is still
completed by the next write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema
from batch.db.engine import transaction
from batch.dispatch.pacing import percentile
from batch.observe.recorder import MinuteCounts


@dataclass(slots=True)
class MinuteRow:
    run_id: str
    org_code: str
    minute_at: datetime
    planned: int = 0
    started: int = 0
    calls: int = 0
    success: int = 0
    fault: int = 0
    timeout: int = 0
    throttled: int = 0
    consent: int = 0
    client: int = 0
    rejected: int = 0
    attempts: int = 0
    retried: int = 0
    max_attempts: int = 0
    latency_p99_ms: float | None = None
    lateness_p99_ms: float | None = None
    breaker_state: str = "closed"
    breaker_open_seconds: float = 0.0

    def add_chain(self, m: MinuteCounts) -> None:
        """Fold the chain's counts of this minute in (a minute may be cut twice at close)."""
        for kind, n in m.by_kind.items():
            setattr(self, kind, getattr(self, kind) + n)
        self.calls += m.calls
        self.attempts += m.attempts
        self.retried += m.retried
        self.max_attempts += m.max_attempts
        if m.latencies:
            p99 = round(percentile(sorted(m.latencies), 99) * 1000, 3)
            self.latency_p99_ms = max(self.latency_p99_ms or 0.0, p99)
        self.breaker_open_seconds += m.open_seconds
        if m.worst_state != "closed" or m.open_seconds:
            self.breaker_state = m.worst_state if m.worst_state != "closed" else "open"

    def add_lateness(self, samples: Sequence[float]) -> None:
        if samples:
            p99 = round(percentile(sorted(samples), 99) * 1000, 3)
            self.lateness_p99_ms = max(self.lateness_p99_ms or 0.0, p99)

    @property
    def empty(self) -> bool:
        return not (self.planned or self.started or self.calls or self.rejected
                    or self.breaker_open_seconds or self.breaker_state != "closed")

    def values(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in _FIELDS}


#: rows per statement: each statement is its own step of the event loop, so a few hundred
#: providers' minute never holds the loop at once (300 providers' 600 rows as one multi-row
#: VALUES, compiled afresh each minute: a 65 ms step, every provider's slices late by it)
UPSERT_CHUNK = 100
_KEYS = ("run_id", "org_code", "minute_at")
_FIELDS = tuple(f.name for f in fields(MinuteRow))
_UPSERTS: dict[str, Any] = {}


def _upsert_statement(dialect: str) -> Any:
    """The insert-or-replace of one row, built once per dialect (its compiled form is then
    cached by SQLAlchemy; the rows go as executemany parameters)."""
    stmt = _UPSERTS.get(dialect)
    if stmt is None:
        t = schema.run_minutes
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            ins: Any = pg_insert(t)
        else:
            from sqlalchemy.dialects.sqlite import insert as lite_insert

            ins = lite_insert(t)
        stmt = _UPSERTS[dialect] = ins.on_conflict_do_update(
            index_elements=list(_KEYS),
            set_={c.name: ins.excluded[c.name] for c in t.columns if c.name not in _KEYS})
    return stmt


async def upsert_rows(engine: AsyncEngine, rows: Sequence[MinuteRow]) -> None:
    """Insert-or-replace ``rows`` in one transaction, ``UPSERT_CHUNK`` rows a statement."""
    if not rows:
        return
    stmt = _upsert_statement(engine.dialect.name)
    async with transaction(engine) as conn:
        for i in range(0, len(rows), UPSERT_CHUNK):
            await conn.execute(stmt, [r.values() for r in rows[i:i + UPSERT_CHUNK]])
