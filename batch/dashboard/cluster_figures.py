"""The cluster section's figures, pure: each worker's status and each provider's circuit."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from batch.dashboard.cluster_data import ClusterState, WorkerRow

#: a worker whose last heartbeat is older than this is shown as dead
DEAD_AFTER = timedelta(seconds=30)


@dataclass(frozen=True, slots=True)
class WorkerLine:
    node_id: int
    worker_id: str
    host: str
    status: str  # live | dead | stopped
    started_at: datetime
    last_seen_s: float


def worker_status(w: WorkerRow, *, now: datetime, dead_after: timedelta = DEAD_AFTER) -> str:
    if w.stopped_at is not None:
        return "stopped"
    return "live" if now - w.heartbeat_at <= dead_after else "dead"


def worker_lines(state: ClusterState, *, dead_after: timedelta = DEAD_AFTER
                 ) -> list[WorkerLine]:
    """Live workers first (oldest first: the first and last of them are the probe
    workers), then the dead and the stopped, newest first."""
    lines = [WorkerLine(w.node_id, w.worker_id, w.host,
                        worker_status(w, now=state.read_at, dead_after=dead_after),
                        w.started_at,
                        max(0.0, (state.read_at - w.heartbeat_at).total_seconds()))
             for w in state.workers]
    live = sorted((ln for ln in lines if ln.status == "live"),
                  key=lambda ln: (ln.started_at, ln.node_id))
    rest = sorted((ln for ln in lines if ln.status != "live"),
                  key=lambda ln: (ln.started_at, ln.node_id), reverse=True)
    return live + rest


def probe_worker_ids(lines: list[WorkerLine]) -> set[str]:
    live = [ln.worker_id for ln in lines if ln.status == "live"]
    return {live[0], live[-1]} if live else set()
