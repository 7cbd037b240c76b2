"""The dashboard's cluster section: workers (live, dead, stopped; the probe workers marked)
and each provider's cluster circuit with why and since when, read from both backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.cluster.circuit_events import CircuitEvent, record_events
from batch.dashboard.cluster_data import ClusterState, WorkerRow, load_cluster
from batch.dashboard.cluster_figures import probe_worker_ids, worker_lines
from batch.dashboard.cluster_render import cluster_section
from batch.db import schema

NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)


def w(node: int, name: str, started: int, beat_ago: float, stopped: bool = False
      ) -> WorkerRow:
    return WorkerRow(node, name, "h", NOW - timedelta(seconds=started),
                     NOW - timedelta(seconds=beat_ago), NOW if stopped else None)


def test_live_workers_first_oldest_first_and_the_probe_workers_are_their_ends() -> None:
    state = ClusterState(NOW, (w(1, "a", 300, 2), w(2, "b", 200, 90), w(3, "c", 100, 1),
                               w(4, "d", 50, 3), w(5, "e", 400, 1, stopped=True)), {}, ())
    lines = worker_lines(state)
    assert [(ln.worker_id, ln.status) for ln in lines] == [
        ("a", "live"), ("c", "live"), ("d", "live"), ("b", "dead"), ("e", "stopped")]
    assert probe_worker_ids(lines) == {"a", "d"}


def test_section_shows_circuits_why_and_since_escaped() -> None:
    ev = CircuitEvent(at=NOW, org_code="BANK000001", state="open",
                      reason="failure rate 90% <of> 40 calls", source="coordinator",
                      actor="w1")
    html = cluster_section(ClusterState(NOW, (w(1, "w1", 10, 1),), {"BANK000001": ev}, (ev,)))
    assert "BANK000001" in html and "open" in html
    assert "failure rate 90% &lt;of&gt; 40 calls" in html
    assert "<of>" not in html
    assert "11-30 10:00:00" in html  # KST
    assert "w1 (probe worker)" in html
    empty = cluster_section(ClusterState(NOW, (), {}, ()))
    assert "No worker has registered yet" in empty


async def test_reads_nodes_and_the_last_event_per_provider(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(schema.nodes), [
            {"worker_id": "w1", "host": "h1", "pid": 1, "started_at": NOW,
             "heartbeat_at": NOW},
            {"worker_id": "w2", "host": "h2", "pid": 2, "started_at": NOW,
             "heartbeat_at": NOW - timedelta(minutes=5)}])
    await record_events(engine, [
        CircuitEvent(NOW, "BANK000001", "open", "failure rate", "coordinator", "w1", 1),
        CircuitEvent(NOW + timedelta(seconds=40), "BANK000001", "closed", "healthy",
                     "coordinator", "w1", 1),
        CircuitEvent(NOW, "CARD000001", "forced_open", "maintenance", "operator", "kim")])
    state = await load_cluster(engine, now=NOW + timedelta(seconds=5))
    assert {x.worker_id for x in state.workers} == {"w1", "w2"}
    assert {o: e.state for o, e in state.circuits.items()} == {
        "BANK000001": "closed", "CARD000001": "forced_open"}
    assert state.events[0].state == "closed"
    html = cluster_section(state)
    assert "maintenance" in html and "dead" in html
