"""A worker of ``run --processes`` that died without printing its summary: its work read back.

The parent gives each worker its run id, so it can find that run's rows afterwards. A worker
killed after it stored its summary (``runs.summary``) left it whole; one killed before left
its outcomes (``call_outcomes``, written as it went), from which its providers' counters are
counted again. What it had in memory (outcomes not yet written, lateness, its chain's
state) died with it: the consents of unwritten outcomes come back when its leases do.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema
from batch.db.engine import connect
from batch.dispatch.summary import ProviderSummary, RunSummary
from batch.lifecycle import Step
from planning.calendar import week_start

#: outcomes that end a consent's week well (the summary's ``failed`` is the rest)
_BENIGN = (Step.DONE, Step.DONE_FOR_WEEK, Step.DEAD_ASSET)


def provider_from_outcomes(org: str, rows: list[tuple[str, str, str | None, int, int]], *,
                           planned: int, note: dict[str, Any]) -> ProviderSummary:
    """One provider's counters from its outcome rows, grouped as (action, kind, rsp_code,
    count, calls) (pure). ``deferred`` is the plan less what this worker attempted: an
    upper bound, which the merge's least (the survivors' cluster-wide count) replaces."""
    by_action: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    by_code: Counter[str] = Counter()
    calls = 0
    for action, kind, code, n, c in rows:
        by_action[action] += n
        by_kind[kind] += n
        if code:
            by_code[code] += n
        calls += c
    attempted = sum(by_action.values()) - by_action[Step.NOT_ATTEMPTED.value]
    benign = sum(by_action[s.value] for s in _BENIGN)
    return ProviderSummary.from_json({
        "org_code": org, "planned": planned, "attempted": attempted,
        "succeeded": by_action[Step.DONE.value],
        "already_transferred": by_action[Step.DONE_FOR_WEEK.value],
        "dead_assets": by_action[Step.DEAD_ASSET.value], "failed": attempted - benign,
        "deferred": max(0, planned - attempted),
        "not_attempted": by_action[Step.NOT_ATTEMPTED.value],
        "dead_lettered": by_action[Step.DEAD_LETTER.value], "calls": calls,
        "by_outcome": dict(sorted(by_kind.items())),
        "by_action": dict(sorted(by_action.items())),
        "by_code": dict(sorted(by_code.items())), "breaker": "unknown", "cluster": note})


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
