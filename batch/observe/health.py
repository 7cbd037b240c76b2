"""What ``mydata-batch check`` evaluates: the last run's minutes and the database state
against the thresholds. Reading is SQL; :func:`evaluate` is pure (numbers in, breaches out).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema
from batch.db.engine import connect
from batch.errors import InputError
from batch.observe.state import StoreState, read_state
from batch.observe.thresholds import ThresholdSet


@dataclass(frozen=True, slots=True)
class ProviderRun:
    """One provider's totals over the run's minutes."""

    org_code: str
    calls: int
    retried: int
    max_attempts: int
    timeouts: int
    p99_latency_seconds: float | None
    breaker_open_minutes: float

    @property
    def retry_ratio(self) -> float:
        return self.retried / self.calls if self.calls else 0.0

    @property
    def max_attempt_ratio(self) -> float:
        return self.max_attempts / self.calls if self.calls else 0.0

    @property
    def timeout_rate(self) -> float:
        return self.timeouts / self.calls if self.calls else 0.0


@dataclass(frozen=True, slots=True)
class Health:
    run_id: str | None
    providers: tuple[ProviderRun, ...]
    state: StoreState


@dataclass(frozen=True, slots=True)
class Breach:
    check: str
    org_code: str | None
    value: float
    threshold: float
    run_id: str | None

    def line(self) -> str:
        where = f" provider={self.org_code}" if self.org_code else ""
        run = f" run={self.run_id}" if self.run_id else ""
        return (f"BREACH {self.check}{where} value={_fmt(self.value)} "
                f"threshold={_fmt(self.threshold)}{run}")


def _fmt(v: float) -> str:
    return f"{v:.4g}"


async def last_run_id(engine: AsyncEngine) -> str | None:
    r = schema.runs
    async with connect(engine) as conn:
        return (await conn.execute(select(r.c.run_id).order_by(
            r.c.started_at.desc(), r.c.run_id.desc()).limit(1))).scalar()


async def _run_exists(engine: AsyncEngine, run_id: str) -> bool:
    r = schema.runs
    async with connect(engine) as conn:
        return (await conn.execute(select(r.c.run_id).where(r.c.run_id == run_id))
                ).first() is not None


async def read_run(engine: AsyncEngine, run_id: str) -> tuple[ProviderRun, ...]:
    m = schema.run_minutes
    async with connect(engine) as conn:
        rows = (await conn.execute(
            select(m.c.org_code, func.sum(m.c.calls).label("calls"),
                   func.sum(m.c.retried).label("retried"),
                   func.sum(m.c.max_attempts).label("max_attempts"),
                   func.sum(m.c.timeout).label("timeouts"),
                   func.max(m.c.latency_p99_ms).label("p99"),
                   func.sum(m.c.breaker_open_seconds).label("open_s"))
            .where(m.c.run_id == run_id).group_by(m.c.org_code).order_by(m.c.org_code))).all()
    return tuple(ProviderRun(
        org_code=str(r.org_code).strip(), calls=int(r.calls or 0), retried=int(r.retried or 0),
        max_attempts=int(r.max_attempts or 0), timeouts=int(r.timeouts or 0),
        p99_latency_seconds=float(r.p99) / 1000 if r.p99 is not None else None,
        breaker_open_minutes=float(r.open_s or 0.0) / 60) for r in rows)


async def read_health(engine: AsyncEngine, *, now: datetime,
                      run_id: str | None = None) -> Health:
    """The given run (default: the latest started) and the database state at ``now``."""
    if run_id is not None and not await _run_exists(engine, run_id):
        raise InputError(f"no run {run_id!r} in this database (the runs are listed on the "
                         "dashboard; leave --run-id out for the latest)")
    rid = run_id or await last_run_id(engine)
    provs = await read_run(engine, rid) if rid else ()
    return Health(rid, provs, await read_state(engine, now=now))


def evaluate(health: Health, thresholds: ThresholdSet, *, now: datetime) -> list[Breach]:
    """Every threshold the run or the state exceeds, one :class:`Breach` each."""
    out: list[Breach] = []
    rid = health.run_id
    for p in health.providers:
        t = thresholds.for_provider(p.org_code)
        if p.breaker_open_minutes > t.breaker_open_minutes:
            out.append(Breach("breaker_open_minutes", p.org_code, p.breaker_open_minutes,
                              t.breaker_open_minutes, rid))
        if p.calls < max(1, t.min_calls):
            continue
        for name, value, limit in (
                ("retry_ratio", p.retry_ratio, t.retry_ratio),
                ("max_attempt_ratio", p.max_attempt_ratio, t.max_attempt_ratio),
                ("timeout_rate", p.timeout_rate, t.timeout_rate),
                ("p99_latency_seconds", p.p99_latency_seconds or 0.0, t.p99_latency_seconds)):
            if value > limit:
                out.append(Breach(name, p.org_code, value, limit, rid))
    s = health.state
    for org, age in sorted(s.dead_letter_oldest_age.items()):
        limit = thresholds.for_provider(org).dead_letter_age_hours
        if age / 3600 > limit:
            out.append(Breach("dead_letter_age_hours", org, age / 3600, limit, None))
    for org, n in sorted(s.overdue.items()):
        limit_n = thresholds.for_provider(org).consents_overdue
        if n > limit_n:
            out.append(Breach("consents_overdue", org, n, limit_n, None))
    limit_h = thresholds.defaults.no_success_hours
    since = ((now - s.last_success).total_seconds() / 3600 if s.last_success is not None
             else float("inf"))
    if since > limit_h:
        out.append(Breach("no_success_hours", None, since, limit_h, None))
    return out
