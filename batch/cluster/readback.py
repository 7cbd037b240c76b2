"""A worker of ``run --processes`` that died without printing its summary: its work read back.

The parent gives each worker its run id, so it can find that run's rows afterwards. A worker
killed after it stored its summary (``runs.summary``) left it whole; one killed before left
its outcomes (``call_outcomes``, written as it went), from which its providers' counters are
counted again. What it had in memory (outcomes not yet written, lateness, its chain's
state) died with it: the consents of unwritten outcomes come back when its leases do.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema
from batch.db.engine import connect
from batch.dispatch.stats import ProviderStats
from batch.dispatch.summary import ProviderSummary, RunSummary
from batch.lifecycle import Step
from planning.calendar import week_start


def provider_from_outcomes(org: str, rows: list[tuple[str, str, str | None, int, int]], *,
                           planned: int, note: dict[str, Any]) -> ProviderSummary:
    """One provider's summary from its outcome rows, grouped as (action, kind, rsp_code,
    count, calls), counted as a live run counts its own (``ProviderStats``). ``deferred`` is
    the plan less what this worker attempted: an upper bound, which the merge's least (the
    survivors' cluster-wide count) replaces."""
    stats = ProviderStats(org, day_quota=planned, state_of=lambda: "unknown")
    for action, kind, code, n, calls in rows:
        stats.by_action[action] += n
        stats.by_kind[kind] += n
        if code:
            stats.by_code[code] += n
        stats.calls += calls
    stats.dead_lettered = stats.by_action[Step.DEAD_LETTER.value]
    return ProviderSummary.from_stats({**stats.summary(), "cluster": note})


async def read_back(engine: AsyncEngine, run_id: str, *, worker: str, ended: str
                    ) -> RunSummary | None:
    """The summary of run ``run_id`` as the database holds it: the stored one if the worker
    got that far, else one counted from its outcomes (``incomplete``, exit 1, outcomes not
    all persisted). None: no such run (the worker died before opening it: it did nothing)."""
    r = schema.runs.c
    co = schema.call_outcomes.c
    pd = schema.plan_days.c
    async with connect(engine) as conn:  # one snapshot would not change what is counted
        run = (await conn.execute(select(r.day, r.summary).where(r.run_id == run_id))).first()
        if run is None:
            return None
        if run.summary:
            return RunSummary.from_json(run.summary)
        grouped = (await conn.execute(
            select(co.org_code, co.action, co.kind, co.rsp_code, func.count(),
                   func.coalesce(func.sum(co.calls), 0))
            .where(co.run_id == run_id)
            .group_by(co.org_code, co.action, co.kind, co.rsp_code))).all()
        plans = {str(o).strip(): int(q) for o, q in (await conn.execute(
            select(pd.org_code, pd.batch_quota).where(pd.day == run.day))).all()}
    rows: dict[str, list[tuple[str, str, str | None, int, int]]] = defaultdict(list)
    for org, action, kind, code, n, calls in grouped:
        rows[str(org).strip()].append((str(action), str(kind), code, int(n), int(calls)))
    note = {"worker": worker, "ended": ended, "read_back": True}
    return RunSummary(
        run_id=run_id, date=run.day.isoformat(), week_start=week_start(run.day).isoformat(),
        worker_id=worker, status="incomplete", exit_code=1, elapsed_seconds=0.0,
        providers=tuple(provider_from_outcomes(org, rows[org], planned=plans.get(org, 0),
                                               note=note) for org in sorted(rows)),
        outcomes_persisted=False,
        error=f"worker process {worker} {ended}: its work read back from the database "
              "(outcomes it had not written yet are lost; their consents come back due)")
