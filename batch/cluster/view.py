"""A worker's summary seen cluster-wide: what is ``deferred`` when many workers share a day.

A worker alone counts as deferred what it did not start of the day's quota; in a cluster the
others started the rest. At its end a worker counts, per provider, the consents attempted
today by anyone (``call_outcomes``) and those still leased by other live workers (in their
hands, not deferred), and re-judges its status and exit code from that.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema, work
from batch.db.engine import connect
from batch.dispatch.summary import ProviderSummary, RunSummary

EXIT_OK, EXIT_ATTENTION, EXIT_INTERRUPTED = 0, 1, 3


async def others_holding(engine: AsyncEngine, *, me: str) -> dict[str, int]:
    """Consents leased by workers other than ``me``, per provider."""
    c = schema.consents.c
    async with connect(engine) as conn:
        rows = (await conn.execute(
            select(c.org_code, func.count()).where(c.lease_owner.is_not(None),
                                                   c.lease_owner != me)
            .group_by(c.org_code))).all()
    return {str(o).strip(): int(n) for o, n in rows}


def cluster_view(summary: RunSummary, *, attempted: dict[str, int], held: dict[str, int],
                 report: dict[str, Any]) -> RunSummary:
    """``summary`` with each provider's ``deferred`` counted cluster-wide, its ``cluster``
    report, and the status and exit code judged again (pure)."""
    provs: list[ProviderSummary] = []
    for p in summary.providers:
        left = max(0, p.counters["planned"] - attempted.get(p.org_code, 0)
                   - held.get(p.org_code, 0))
        deferred = min(p.counters["deferred"], left)
        provs.append(replace(p, counters={**p.counters, "deferred": deferred},
                             extra={**p.extra, "cluster": report}))
    attention = any(p.attention for p in provs) or not summary.outcomes_persisted
    if summary.exit_code == EXIT_INTERRUPTED or summary.status in ("interrupted", "failed"):
        return replace(summary, providers=tuple(provs))
    return replace(summary, providers=tuple(provs),
                   exit_code=EXIT_ATTENTION if attention else EXIT_OK,
                   status="incomplete" if attention else "done")


async def seen_cluster_wide(engine: AsyncEngine, summary: RunSummary, *, day: date,
                            me: str, report: dict[str, Any]) -> RunSummary:
    return cluster_view(summary, attempted=await work.attempted_today(engine, day=day),
                        held=await others_holding(engine, me=me), report=report)
