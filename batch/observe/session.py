"""The one object a run starts before its dispatchers and closes after them.

It owns the chain listeners (the recorder and the event log), the Prometheus registry, the
optional port and textfile, and the ``run_minutes`` rows. Once a minute (on the wall
clock's minute boundaries) it cuts each provider's minute, upserts the rows in one batch,
re-reads the database gauges and rewrites the textfile. Nothing it does is on the hot path
but the recorder's counting; a failure to write is logged, never raised into the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from pathlib import Path

from prometheus_client.registry import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.aio import cancel_and_wait, finish_first
from batch.clock import KST, Clock
from batch.errors import ConfigError, describe
from batch.observe.collector import Dispatcher, RunCollector
from batch.observe.exposition import MetricsServer, render, write_textfile
from batch.observe.logbook import EventLog
from batch.observe.minutes import MinuteRow, upsert_rows
from batch.observe.recorder import ChainRecorder
from batch.observe.state import StoreState, read_state
from batch.resilience.chain import ProviderChain
from batch.resilience.events import Listener

log = logging.getLogger("mydata.observe")

#: providers cut between two turns of the event loop (see :meth:`Observability.cut`)
CUT_CHUNK = 25


@dataclass(frozen=True, slots=True)
class ObserveOptions:
    """Where a run's metrics go besides the database: a port, a textfile, or neither."""

    metrics_port: int | None = None
    metrics_textfile: Path | None = None
    #: added to every sample: ``(("process", "1"),)`` for a worker of ``run --processes N``
    labels: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port {self.metrics_port} is not in 0..65535")

    def for_process(self, index: int) -> ObserveOptions:
        """What worker ``index`` of ``run --processes N`` uses instead, beside its siblings
        on one machine: the port ``metrics_port + index`` (0 stays 0: a free port each),
        the textfile ``NAME-p{index}.prom`` for ``NAME.prom`` in the same directory (the
        node exporter reads every ``*.prom`` there), and every sample labelled
        ``process="{index}"`` (two files holding the same series make the node exporter's
        whole scrape fail)."""
        port = self.metrics_port
        if port:
            port += index
            if port > 65535:
                raise ConfigError(f"--metrics-port: worker {index} of --processes would "
                                  f"listen on {port}, past 65535: give a lower port")
        path = self.metrics_textfile
        if path is not None:
            path = path.with_name(f"{path.stem}-p{index}{path.suffix}")
        return ObserveOptions(metrics_port=port, metrics_textfile=path,
                              labels=(*self.labels, ("process", str(index))))


class Observability:
    """Metrics, minute rows and event logs of one run."""

    def __init__(self, engine: AsyncEngine, *, clock: Clock, run_id: str, day: date,
                 options: ObserveOptions | None = None) -> None:
        self._engine = engine
        self._clock = clock
        self.run_id = run_id
        self._day_start = datetime.combine(day, time(0), KST)
        self.options = options or ObserveOptions()
        self.recorder = ChainRecorder()
        self.events = EventLog(clock=clock, run_id=run_id)
        self._dispatchers: list[Dispatcher] = []
        self._state: StoreState | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RunCollector(
            self.recorder, dispatchers=lambda: self._dispatchers, state=lambda: self._state,
            started_at=clock.now().timestamp(), labels=self.options.labels))
        self._server: MetricsServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._rows: dict[tuple[str, datetime], MinuteRow] = {}
        self._dirty: set[tuple[str, datetime]] = set()
        self._minute_seen: dict[str, int] = {}
        self._late_seen: dict[str, int] = {}
        self._minute_at = self._floor(clock.now())
        #: set after each export (tests wait on it instead of sleeping)
        self.exported = asyncio.Event()

    @property
    def listeners(self) -> tuple[Listener, ...]:
        """What every chain of the run is built with."""
        return (self.recorder, self.events)

    @property
    def metrics_port(self) -> int | None:
        return self._server.port if self._server is not None else None

    async def start(self, chains: dict[str, ProviderChain],
                    dispatchers: Sequence[Dispatcher]) -> None:
        """Know the providers, open the port, and start the once-a-minute export."""
        for org, chain in chains.items():
            self.recorder.track(org, max_attempts=chain.settings.retry.max_attempts)
        self._dispatchers = list(dispatchers)
        for d in self._dispatchers:
            self._minute_seen[d.org_code] = len(d.stats.minutes)
            self._late_seen[d.org_code] = len(d.stats.lateness)
        await self._read_state()
        if self.options.metrics_port is not None:
            self._server = MetricsServer(self.registry, self.options.metrics_port)
            port = await self._server.start()
            log.info("metrics on http://127.0.0.1:%d/metrics", port, extra={
                "action": "metrics_serving", "run_id": self.run_id, "port": port})
        self._task = asyncio.create_task(self._every_minute(), name="observe-minutes")

    async def stop(self) -> None:
        """The run's dispatchers are done: the last cut and rows, the port closed."""
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
        if self._server is not None:
            await self._server.stop()
            self._server = None
        await self.export()

    async def close(self) -> None:
        """After the run's status is stored: re-read the gauges, write the last textfile."""
        await self.stop()

    # -- once a minute ------------------------------------------------------------------------

    def _floor(self, when: datetime) -> datetime:
        local = when.astimezone(KST)
        return local.replace(second=0, microsecond=0)

    async def _every_minute(self) -> None:
        while True:
            now = self._clock.now()
            nxt = self._floor(now) + timedelta(minutes=1)
            wait = (nxt - now).total_seconds()
            await self._clock.sleep_until(self._clock.monotonic() + max(0.0, wait))
            await self.export()

    async def export(self) -> None:
        """Cut the minute, upsert its rows, re-read the database gauges, write the file."""
        await self.cut()
        keys = sorted(self._dirty)
        self._dirty.clear()
        try:
            # A run stopping cancels this export wherever it is, but not inside its write:
            # that one commits or rolls back first (see finish_first).
            await finish_first(upsert_rows(
                self._engine, [r for k in keys if not (r := self._rows[k]).empty]))
        except BaseException as exc:
            # Not written (the database down), or the run stopping (its cancellation comes
            # once the write has ended, whichever way): the next export (the run's last one
            # at the latest) writes these rows again, as they are then.
            self._dirty.update(keys)
            if not isinstance(exc, Exception):
                raise
            log.warning("could not write run_minutes", extra={
                "action": "run_minutes_failed", "run_id": self.run_id, "error": describe(exc)})
        await self._read_state()
        await self._write_textfile()
        self.exported.set()

    async def cut(self) -> list[MinuteRow]:
        """Fold everything since the last cut into the rows; returns the rows touched.

        It gives the loop a turn every ``CUT_CHUNK`` providers: 300 providers' cut (their
        latency and lateness percentiles) was one 20 ms step. A provider cut a moment after
        the others keeps that moment's counts in this minute. Cancelled between two turns
        (the run stopping), the next cut takes up the same minute again: what each provider
        did since its own last cut is added to that minute's row."""
        at = self._minute_at
        now = self._clock.now()
        mono = self._clock.monotonic()
        touched: list[MinuteRow] = []
        orgs = set(self.recorder.providers) | {d.org_code for d in self._dispatchers}
        by_org = {d.org_code: d for d in self._dispatchers}
        for i, org in enumerate(sorted(orgs)):
            if i and i % CUT_CHUNK == 0:
                await asyncio.sleep(0)
            row = self._row(org, at)
            row.add_chain(self.recorder.cut_minute(org, mono))
            touched.append(row)
            d = by_org.get(org)
            if d is None:
                continue
            late = d.stats.lateness
            row.add_lateness(late[self._late_seen.get(org, 0):])
            self._late_seen[org] = len(late)
            records = d.stats.minutes
            for rec in records[self._minute_seen.get(org, 0):]:
                r = self._row(org, self._day_start + timedelta(minutes=rec.minute))
                r.planned, r.started = rec.planned, rec.started
                touched.append(r)
            self._minute_seen[org] = len(records)
        self._minute_at = self._floor(now)
        return touched

    def _row(self, org: str, at: datetime) -> MinuteRow:
        key = (org, at)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = MinuteRow(self.run_id, org, at)
        self._dirty.add(key)
        return row

    async def _read_state(self) -> None:
        try:
            self._state = await read_state(self._engine, now=self._clock.now())
        except Exception as exc:
            log.warning("could not read the database gauges", extra={
                "action": "state_read_failed", "run_id": self.run_id,
                "error": describe(exc)})

    async def _write_textfile(self) -> None:
        path = self.options.metrics_textfile
        if path is None:
            return
        try:
            write_textfile(self.registry, path, body=await render(self.registry))
        except Exception as exc:
            log.warning("could not write the metrics textfile", extra={
                "action": "textfile_failed", "run_id": self.run_id, "error": describe(exc)})

    @property
    def rows(self) -> list[MinuteRow]:
        return [self._rows[k] for k in sorted(self._rows)]

