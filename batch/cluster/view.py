"""A worker's summary seen cluster-wide: what is ``deferred`` when many workers share a day.

A worker alone counts as deferred what it did not start of the day's quota; in a cluster the
others started the rest. At its end a worker counts, per provider, the consents attempted
today by anyone (``call_outcomes``) and those still leased by other live workers (in their
hands, not deferred), and re-judges its status and exit code from that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import date, datetime
from typing import Any

from sqlalchemy import func, literal, select, union_all
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema
from batch.db.engine import connect
from batch.db.work import still_due
from batch.dispatch.summary import ProviderSummary, RunSummary
from batch.lifecycle import Step

EXIT_OK, EXIT_ATTENTION, EXIT_INTERRUPTED = 0, 1, 3


async def tally(engine: AsyncEngine, *, day: date, me: str
                ) -> tuple[dict[str, int], dict[str, int]]:
    """Per provider: consents attempted today by anyone, and those leased by workers other
    than ``me``, read from one snapshot. Read one after the other, another worker's outcome
    committed in between was counted in neither (still held at the first read, not yet
    attempted at the second... or the other way round) and showed as deferred."""
    c = schema.consents.c
    co = schema.call_outcomes.c
    attempted = (select(co.org_code, literal("a").label("what"),
                        func.count(func.distinct(co.consent_id)).label("n"))
                 .where(co.day == day, co.action != Step.NOT_ATTEMPTED.value)
                 .group_by(co.org_code))
    held = (select(c.org_code, literal("h").label("what"), func.count().label("n"))
            .where(c.lease_owner.is_not(None), c.lease_owner != me)
            .group_by(c.org_code))
    out: dict[str, dict[str, int]] = {"a": {}, "h": {}}
    async with connect(engine) as conn:  # one statement: one snapshot on every backend
        for org, what, n in (await conn.execute(union_all(attempted, held))).all():
            out[str(what)][str(org).strip()] = int(n)
    return out["a"], out["h"]


def _left(p: ProviderSummary, attempted: dict[str, int], held: dict[str, int]) -> int:
    """Of ``p``'s day plan, what nobody attempted and no other worker holds."""
    return max(0, p.counters["planned"] - attempted.get(p.org_code, 0)
               - held.get(p.org_code, 0))


def cluster_view(summary: RunSummary, *, attempted: dict[str, int], held: dict[str, int],
                 report: dict[str, Any], others_live: int = 0,
                 due: Mapping[str, int] | None = None) -> RunSummary:
    """``summary`` with each provider's ``deferred`` counted cluster-wide, its ``cluster``
    report, and the status and exit code judged again (pure). ``due``: per provider, its
    consents still due that no other worker holds (:func:`batch.db.work.still_due`, counted
    up to what the day leaves); what the day leaves beyond them is ``no_longer_due``.

    With ``others_live`` workers still running (this one is marked stopped already), what
    nobody holds and nobody attempted is theirs to claim (a dead worker's claims just come
    back, say): counted ``left_to_live_workers``, not deferred. The last worker to stop
    sees none live and judges the day; two stopping at once both judge it."""
    provs: list[ProviderSummary] = []
    for p in summary.providers:
        left = _left(p, attempted, held)
        extra = dict(p.extra)
        if due is not None:  # the rest revoked, or refreshed by another run, meanwhile
            still = min(left, due.get(p.org_code, 0))
            extra["no_longer_due"] = left - still
            left = still
        deferred = min(p.counters["deferred"], left)
        rep = report
        if others_live and deferred:
            rep = {**report, "left_to_live_workers": deferred, "others_live": others_live}
            deferred = 0
        provs.append(replace(p, counters={**p.counters, "deferred": deferred},
                             extra={**extra, "cluster": rep}))
    attention = any(p.attention for p in provs) or not summary.outcomes_persisted
    if summary.exit_code == EXIT_INTERRUPTED or summary.status in ("interrupted", "failed"):
        return replace(summary, providers=tuple(provs))
    return replace(summary, providers=tuple(provs),
                   exit_code=EXIT_ATTENTION if attention else EXIT_OK,
                   status="incomplete" if attention else "done")


async def seen_cluster_wide(engine: AsyncEngine, summary: RunSummary, *, day: date,
                            me: str, report: dict[str, Any], now: datetime) -> RunSummary:
    from batch.cluster.registry import live_workers

    attempted, held = await tally(engine, day=day, me=me)
    others = [w for w in await live_workers(engine, now=now) if w.worker_id != me]
    bounds = {p.org_code: _left(p, attempted, held) for p in summary.providers}
    due = await still_due(engine, week=date.fromisoformat(summary.week_start), bounds=bounds,
                          holder=me)
    return cluster_view(summary, attempted=attempted, held=held, report=report,
                        others_live=len(others), due=due)
