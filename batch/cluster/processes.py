"""``run --processes N``: N worker processes on this machine under one parent.

The parent starts N ``run`` children (the same command line, each its own worker id and
``--json``), forwards SIGTERM/SIGINT to every child, waits, and merges their summaries into
one (:func:`merge_summaries`) with the exit code that matters most (:func:`worst_exit`).
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from types import FrameType
from typing import Any

from batch.dispatch.summary import Lateness, ProviderSummary, RunSummary, SummaryError

log = logging.getLogger("mydata.cluster")

#: from what matters most to least: bad input or a crash, work an operator must see,
#: interrupted, done
_EXIT_RANK = (2, 1, 3, 0)
#: counters every worker reports the same (the day's plan): not summed
_SAME = ("planned", "attempted_before_run")
#: counted cluster-wide by each worker (batch/cluster/view.py): the smallest is the latest
_CLUSTER_WIDE = ("deferred",)
_BREAKER_RANK = ("forced_open", "open", "half_open", "forced_closed", "closed")


class NoSummaries(SummaryError):
    """No worker process printed a summary, and none could be read back: ``codes`` are
    their exit codes (each one's own error line is above the parent's)."""

    def __init__(self, codes: Sequence[int]) -> None:
        super().__init__(f"no worker process printed a summary (exit codes {list(codes)})")
        self.codes = list(codes)


def worst_exit(codes: Sequence[int]) -> int:
    """The exit code of the merged run: a code outside run's own (a child killed) counts as
    work an operator must see (1); else the highest-ranked of 2, 1, 3, 0."""
    norm = [c if c in _EXIT_RANK else 1 for c in codes]
    if not norm:
        return 2
    return min(norm, key=_EXIT_RANK.index)


def _breaker_rank(state: str) -> int:
    """Where a worker's breaker column ranks, most severe first: the cluster's state
    (``cluster_open``) as the local one; a state not in the list (``metrics_only``,
    ``disabled``) after them all."""
    state = state.removeprefix("cluster_")
    return _BREAKER_RANK.index(state) if state in _BREAKER_RANK else len(_BREAKER_RANK)


def _merge_provider(parts: Sequence[ProviderSummary]) -> ProviderSummary:
    first = parts[0]
    counters = {k: (max(p.counters[k] for p in parts) if k in _SAME
                    else min(p.counters[k] for p in parts) if k in _CLUSTER_WIDE
                    else sum(p.counters[k] for p in parts)) for k in first.counters}

    def total(attr: str) -> dict[str, int]:
        c: Counter[str] = Counter()
        for p in parts:
            c.update(getattr(p, attr))
        return dict(c)

    breaker = min((p.breaker for p in parts), key=_breaker_rank)
    extra: dict[str, Any] = {}
    for p in parts:
        for k, v in p.extra.items():
            if k == "cluster":
                extra.setdefault("workers", []).append(v)
            elif k == "no_longer_due" and isinstance(v, int):
                # judged cluster-wide by each at its end: the last to stop saw the most
                extra[k] = max(v, extra.get(k, 0))
            else:
                extra.setdefault(k, v)
    return ProviderSummary(
        org_code=first.org_code, counters=counters, by_outcome=total("by_outcome"),
        by_action=total("by_action"), by_code=total("by_code"),
        calls_per_second=round(sum(p.calls_per_second for p in parts), 2),
        slice_lateness_ms=Lateness(
            max(p.slice_lateness_ms.p50 for p in parts),
            max(p.slice_lateness_ms.p99 for p in parts),
            max(p.slice_lateness_ms.max for p in parts)),
        breaker=breaker, chain=None, extra=extra)


def merge_summaries(parts: Sequence[RunSummary], *, worker_id: str,
                    codes: Sequence[int] | None = None) -> RunSummary:
    """One summary of many workers' runs of one day (the first's ids, dates and plan)."""
    if not parts:
        raise SummaryError("no summary to merge")
    orgs: dict[str, list[ProviderSummary]] = {}
    for s in parts:
        for p in s.providers:
            orgs.setdefault(p.org_code, []).append(p)
    code = worst_exit(list(codes) if codes is not None else [s.exit_code for s in parts])
    statuses = {s.status for s in parts}
    status = ("failed" if "failed" in statuses else "incomplete" if code == 1
              else "interrupted" if code == 3 else "done" if code == 0 else "failed")
    first = parts[0]
    return replace(
        first, run_id="+".join(s.run_id for s in parts), worker_id=worker_id, status=status,
        exit_code=code, elapsed_seconds=max(s.elapsed_seconds for s in parts),
        providers=tuple(_merge_provider(ps) for ps in orgs.values()),
        outcomes_persisted=all(s.outcomes_persisted for s in parts),
        unwritten_outcomes=sum(s.unwritten_outcomes for s in parts),
        replanned=next((s.replanned for s in parts if s.replanned), None),
        error="; ".join(s.error for s in parts if s.error) or None)


def _ended(code: int) -> str:
    """How a child ended, in words: ``was killed by SIGKILL``, ``exited 2``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited {code}"


def child_worker_id(worker_id: str, index: int) -> str:
    """Child ``index``'s worker id under a parent of ``worker_id`` (its leases, its node
    row, its run's read-back all go by it)."""
    return f"{worker_id}-p{index}"


def child_argv(argv: Sequence[str], index: int, worker_id: str,
               run_id: str | None = None) -> list[str]:
    """The parent's arguments for child ``index``: without --processes (and its value),
    with --json, its own --worker-id and its --process-index (its metrics port, textfile
    and label: ``ObserveOptions.for_process``), and ``run_id`` as its --run-id if given
    (its work can be read back if it dies: batch/cluster/readback.py)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--processes":
            skip = True
            continue
        if a.startswith("--processes="):
            continue
        out.append(a)
    if "--json" not in out:
        out.append("--json")
    out += ["--worker-id", child_worker_id(worker_id, index), "--process-index", str(index)]
    return [*out, "--run-id", run_id] if run_id else out


def run_children(argv: Sequence[str], n: int, *, worker_id: str, db_url: str | None = None
                 ) -> tuple[RunSummary, int]:
    """Start ``n`` children, forward SIGTERM/SIGINT, merge what they print; a child that
    prints no summary has its work read back from ``db_url`` (if given) and merged too."""
    run_ids = [uuid.uuid4().hex[:16] for _ in range(n)]
    procs = [subprocess.Popen([sys.executable, "-m", "batch.cli",
                               *child_argv(argv, i, worker_id, run_ids[i])],
                              stdout=subprocess.PIPE) for i in range(n)]

    def forward(signum: int, _frame: FrameType | None) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        outs = [p.communicate()[0] for p in procs]
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    codes = [p.returncode for p in procs]
    parts: list[RunSummary] = []
    silent: list[int] = []
    for i, out in enumerate(outs):
        try:
            parts.append(RunSummary.from_json(json.loads(out.decode().strip().splitlines()[-1])))
        except (ValueError, IndexError, SummaryError):
            silent.append(i)
    if silent:
        parts += _read_back(db_url, [(child_worker_id(worker_id, i), run_ids[i], codes[i], i)
                                     for i in silent])
    if not parts:
        raise NoSummaries(codes)
    return merge_summaries(parts, worker_id=worker_id, codes=codes), worst_exit(codes)


def _read_back(db_url: str | None, silent: Sequence[tuple[str, str, int, int]]
               ) -> list[RunSummary]:
    """The work of the children that printed no summary, as the database holds it (one
    error line each, saying whether it could be read back)."""
    import asyncio

    from batch.cluster.readback import read_back
    from batch.db.engine import make_engine

    async def go() -> list[RunSummary | BaseException | None]:
        engine = make_engine(db_url)  # type: ignore[arg-type]
        try:
            return list(await asyncio.gather(*(
                read_back(engine, run_id, worker=child, ended=_ended(code))
                for child, run_id, code, _ in silent), return_exceptions=True))
        finally:
            await engine.dispose()

    try:
        got: list[RunSummary | BaseException | None] = (
            asyncio.run(go()) if db_url else [None] * len(silent))
    except Exception as exc:  # the database itself: nothing read back
        got = [exc] * len(silent)
    parts: list[RunSummary] = []
    for (child, run_id, code, i), back in zip(silent, got, strict=True):
        if isinstance(back, RunSummary):
            parts.append(back)
            how = (f"its work ({sum(p.counters['attempted'] for p in back.providers):,} "
                   f"attempted) read back from the database (run {run_id}) into the merged "
                   "summary")
        elif back is None:
            how = (f"no run {run_id} in the database: it did no work"
                   if db_url else "the merged one leaves its work out")
        else:
            how = f"its work could not be read back ({back}): the merged one leaves it out"
        log.error("worker process %s %s and printed no summary: %s (its claims are due again "
                  "once a live worker sees it dead, or at the lease's end)", child,
                  _ended(code), how, extra={
                      "action": "worker_process_failed", "index": i, "exit_code": code,
                      "worker": child, "run_id": run_id})
    return parts
