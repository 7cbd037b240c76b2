"""The run's Observability: minute rows cut per provider and upserted, the textfile, the
127.0.0.1 port with OpenMetrics exemplars. Time is a FakeClock; the database is real."""

from __future__ import annotations

import asyncio
from datetime import date, datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import KST, FakeClock
from batch.db import schema
from batch.dispatch.stats import MinuteRecord, ProviderStats
from batch.errors import ConfigError
from batch.observe.session import Observability, ObserveOptions
from batch.resilience import ChainSettings, LimiterSettings, RetrySettings
from batch.resilience.chain import ProviderChain
from tests.resilience.fakes import FAULT, OK, Provider, drive

ORG = "BANK000001"
DAY = date(2026, 11, 30)


class FakeDispatcher:
    def __init__(self) -> None:
        self.org_code = ORG
        self.stats = ProviderStats(ORG, day_quota=50)
        self.queued: list[int] = []

    @property
    def remaining(self) -> int:
        return 50 - self.stats.started

    @property
    def queue_depth(self) -> int:
        return len(self.queued)


async def test_minutes_are_cut_per_provider_upserted_and_exported(
        engine: AsyncEngine, tmp_path: Path) -> None:
    clock = FakeClock(datetime(2026, 11, 30, 1, 0, 5, tzinfo=KST))
    textfile = tmp_path / "m.prom"
    obs = Observability(engine, clock=clock, run_id="run-1", day=DAY,
                        options=ObserveOptions(metrics_port=0, metrics_textfile=textfile))
    chain = ProviderChain(ORG, ChainSettings(
        retry=RetrySettings(max_attempts=2, budget_floor=100),
        limiter=LimiterSettings(calls_per_second=1e6, burst=1000)),
        clock=clock, random=lambda: 0.0, listeners=obs.listeners)
    d = FakeDispatcher()
    d.queued.append(7)
    await obs.start({ORG: chain}, [d])
    try:
        assert obs._server is not None and obs._server.addresses == ["127.0.0.1"]
        for answers in ([OK], [FAULT, OK], [FAULT, FAULT]):
            await drive(clock, chain.call(Provider(clock, answers, latency=0.05)))
        d.stats.lateness += [0.001, 0.002, 0.2]
        d.stats.minutes.append(MinuteRecord(60, 40, 3))  # minute 01:00
        async with httpx.AsyncClient(timeout=10) as client:
            om = (await client.get(f"http://127.0.0.1:{obs.metrics_port}/metrics",
                                   headers={"Accept": "application/openmetrics-text"})).text
        assert 'trace_id="OPERATOR01T' in om
        clock.advance(60)  # 01:01:05: the next minute has begun
        await obs.export()
        await drive(clock, chain.call(Provider(clock, [OK])))
    finally:
        await obs.stop()
    assert obs._server is None
    async with engine.connect() as conn:
        rows = (await conn.execute(select(schema.run_minutes).order_by(
            schema.run_minutes.c.minute_at))).all()
    assert [r.minute_at.astimezone(KST).strftime("%H:%M") for r in rows] == ["01:00", "01:01"]
    first, second = rows
    assert (first.planned, first.started, first.calls, first.success, first.fault) == (
        40, 3, 3, 2, 1)
    assert (first.attempts, first.retried, first.max_attempts) == (5, 2, 2)  # both retried
    assert first.latency_p99_ms is not None and first.latency_p99_ms >= 100
    assert first.lateness_p99_ms == 200.0
    assert (second.calls, second.success, second.planned) == (1, 1, 0)
    text = textfile.read_text()
    got: dict[tuple[str, str | None], float] = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            key = (s.name, s.labels.get("provider"))
            got[key] = got.get(key, 0.0) + s.value  # summed over the other labels
    assert got[("mydata_calls_total", ORG)] == 4
    assert got[("mydata_dispatch_queue_depth", ORG)] == 1
    assert got[("mydata_dispatch_slice_lateness_seconds_count", ORG)] == 3
    assert got[("mydata_last_successful_run_timestamp_seconds", None)] == 0


def test_a_worker_of_processes_gets_its_own_port_textfile_and_process_label(
        tmp_path: Path) -> None:
    base = ObserveOptions(metrics_port=9464, metrics_textfile=tmp_path / "mydata.prom")
    assert base.for_process(2) == ObserveOptions(
        metrics_port=9466, metrics_textfile=tmp_path / "mydata-p2.prom",
        labels=(("process", "2"),))
    # port 0 picks a free port for each worker; no port, no textfile stay so
    assert ObserveOptions(metrics_port=0).for_process(1).metrics_port == 0
    assert ObserveOptions().for_process(3) == ObserveOptions(labels=(("process", "3"),))
    with pytest.raises(ConfigError, match="worker 1 of --processes would listen on 65536"):
        ObserveOptions(metrics_port=65535).for_process(1)


async def test_a_workers_textfile_labels_every_sample_with_its_process(
        engine: AsyncEngine, tmp_path: Path) -> None:
    """Two workers of ``run --processes`` on one machine: each file's series differ from
    its sibling's by ``process`` (the node exporter fails a scrape that finds one series
    in two files), and their HELP lines are the same (it refuses differing ones)."""
    clock = FakeClock(datetime(2026, 11, 30, 1, 0, 5, tzinfo=KST))
    texts = []
    for index in (0, 1):
        opts = ObserveOptions(metrics_textfile=tmp_path / "m.prom").for_process(index)
        obs = Observability(engine, clock=clock, run_id=f"run-{index}", day=DAY,
                            options=opts)
        chain = ProviderChain(ORG, ChainSettings(), clock=clock, listeners=obs.listeners)
        await obs.start({ORG: chain}, [FakeDispatcher()])
        try:
            await drive(clock, chain.call(Provider(clock, [OK])))
        finally:
            await obs.stop()
        texts.append((tmp_path / f"m-p{index}.prom").read_text())
    assert not (tmp_path / "m.prom").exists()
    series: list[set[tuple[str, tuple[tuple[str, str], ...]]]] = []
    helps: list[dict[str, str]] = []
    for index, text in enumerate(texts):
        families = list(text_string_to_metric_families(text))
        samples = [s for f in families for s in f.samples]
        assert samples and all(s.labels.get("process") == str(index) for s in samples)
        assert sum(s.value for s in samples if s.name == "mydata_calls_total") == 1
        series.append({(s.name, tuple(sorted(s.labels.items()))) for s in samples})
        helps.append({f.name: f.documentation for f in families})
    assert not series[0] & series[1]
    assert helps[0] == helps[1]


async def test_every_minute_boundary_writes_the_rows_and_the_textfile(
        engine: AsyncEngine, tmp_path: Path) -> None:
    clock = FakeClock(datetime(2026, 11, 30, 1, 0, 50, tzinfo=KST))
    textfile = tmp_path / "m.prom"
    obs = Observability(engine, clock=clock, run_id="run-1", day=DAY,
                        options=ObserveOptions(metrics_textfile=textfile))
    chain = ProviderChain(ORG, ChainSettings(), clock=clock, listeners=obs.listeners)
    await obs.start({ORG: chain}, [])
    try:
        await drive(clock, chain.call(Provider(clock, [OK])))
        assert not textfile.exists()
        obs.exported.clear()
        await clock.run_for(11)  # 01:01:01: the 01:01 boundary has passed
        await asyncio.wait_for(obs.exported.wait(), 30)  # real I/O, not time
        assert textfile.exists()
        async with engine.connect() as conn:
            rows = (await conn.execute(select(schema.run_minutes))).all()
        assert [(r.minute_at.astimezone(KST).strftime("%H:%M"), r.calls) for r in rows] == [
            ("01:00", 1)]
    finally:
        await obs.stop()


async def test_a_cut_gives_the_loop_turns_and_a_cut_cancelled_part_way_loses_nothing(
        engine: AsyncEngine) -> None:
    """300 providers' cut was one 20 ms step; it now yields every CUT_CHUNK providers. A
    run stopping cancels the minute's export wherever it is: the last export takes up the
    same minute, and each provider's calls are in that minute's row, once."""
    from batch.observe.session import CUT_CHUNK

    clock = FakeClock(datetime(2026, 11, 30, 1, 0, 5, tzinfo=KST))
    obs = Observability(engine, clock=clock, run_id="run-1", day=DAY)
    orgs = [f"BANK{i:06d}" for i in range(3 * CUT_CHUNK)]
    chains = {org: ProviderChain(org, ChainSettings(), clock=clock, listeners=obs.listeners)
              for org in orgs}
    await obs.start(chains, [])
    stopped = False
    try:
        for chain in chains.values():
            await drive(clock, chain.call(Provider(clock, [OK])))
        clock.advance(55)  # 01:01:00: the minute's export starts cutting 01:00
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # it has given the loop a turn: part way through the cut
        rows = obs._rows
        assert 0 < len(rows) < len(orgs), len(rows)
        await obs.stop()  # cancels it there, then the last export
        stopped = True
    finally:
        if not stopped:
            await obs.stop()
    async with engine.connect() as conn:
        rows = (await conn.execute(select(schema.run_minutes))).all()
    assert sorted((r.org_code.strip(), r.minute_at.astimezone(KST).strftime("%H:%M"), r.calls)
                  for r in rows) == [(org, "01:00", 1) for org in orgs]


async def test_rows_a_failed_write_did_not_store_are_written_by_the_next_export(
        engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    from batch.observe import session

    clock = FakeClock(datetime(2026, 11, 30, 1, 0, 5, tzinfo=KST))
    obs = Observability(engine, clock=clock, run_id="run-1", day=DAY)
    chain = ProviderChain(ORG, ChainSettings(), clock=clock, listeners=obs.listeners)
    await obs.start({ORG: chain}, [])
    real = session.upsert_rows

    async def down(*_: object) -> None:
        raise ConnectionRefusedError("the database is down")

    try:
        await drive(clock, chain.call(Provider(clock, [OK])))
        clock.advance(60)  # 01:01:05
        monkeypatch.setattr(session, "upsert_rows", down)
        await obs.export()  # minute 01:00 cut, its write failed
        monkeypatch.setattr(session, "upsert_rows", real)
        clock.advance(60)  # 01:02:05: nothing new happened in 01:01
    finally:
        await obs.stop()
    async with engine.connect() as conn:
        rows = (await conn.execute(select(schema.run_minutes))).all()
    assert [(r.minute_at.astimezone(KST).strftime("%H:%M"), r.calls) for r in rows] == [
        ("01:00", 1)]


async def test_an_export_cancelled_inside_its_write_commits_first_and_leaves_the_file_free(
        engine: AsyncEngine) -> None:
    """A run's end cancels the minute export; one cancelled inside its upsert (aiosqlite's
    executemany) used to have its connection thrown away with the statement still held by
    the cancelled frames, and SQLite kept that transaction and the file's write lock: the
    run's last rows and its summary then waited 30 s each and failed ("database is
    locked"). The cycle collector is off here, as a frozen heap leaves such frames alone."""
    import gc
    import sqlite3

    from sqlalchemy import event, insert

    from batch.db.engine import sqlite_path, transaction

    clock = FakeClock(datetime(2026, 11, 30, 1, 0, 5, tzinfo=KST))
    obs = Observability(engine, clock=clock, run_id="run-1", day=DAY)
    orgs = [f"BANK{i:06d}" for i in range(40)]
    chains = {org: ProviderChain(org, ChainSettings(), clock=clock, listeners=obs.listeners)
              for org in orgs}
    for chain in chains.values():
        obs.recorder.track(chain.org_code, max_attempts=chain.settings.retry.max_attempts)
        await drive(clock, chain.call(Provider(clock, [OK])))
    clock.advance(60)  # 01:01:05: minute 01:00 is whole
    loop = asyncio.get_running_loop()
    export = asyncio.create_task(obs.export())
    seen: list[bool] = []

    def cancel_once_sent(_conn: object, _cursor: object, statement: str, _params: object,
                         _context: object, executemany: bool) -> None:
        if "run_minutes" in statement and not seen:
            seen.append(executemany)
            loop.call_soon(export.cancel)  # lands while the driver runs the statement

    event.listen(engine.sync_engine, "before_cursor_execute", cancel_once_sent)
    collecting = gc.isenabled()
    gc.disable()
    try:
        with pytest.raises(asyncio.CancelledError):
            await export
        assert seen == [True]
        path = sqlite_path(str(engine.url))
        if path is not None:  # another connection writes at once, no waiting on a lock
            other = sqlite3.connect(path, timeout=1)
            try:
                other.execute("INSERT INTO schema_migrations (version) VALUES (999)")
                other.commit()
            finally:
                other.close()
        else:
            async with transaction(engine) as conn:
                await conn.execute(insert(schema.schema_migrations).values(version=999))
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", cancel_once_sent)
        if collecting:
            gc.enable()
    async with engine.connect() as conn:
        rows = (await conn.execute(select(schema.run_minutes))).all()
    assert sorted((r.org_code.strip(), r.calls) for r in rows) == [(org, 1) for org in orgs]
