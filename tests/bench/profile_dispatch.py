"""Where the CPU goes on the full path: a saturated ``run_day`` under cProfile.

Run: ``make profile`` (``PROFILER=py-spy`` samples it instead: tests/bench/spy_dispatch.py,
``PROFILE_BACKEND=sqlite|postgresql``, ``PROFILE_RATE`` planned
calls/s offered over the one-minute plan, ``PROFILE_TOP`` entries shown). The simulator runs
in its own process (latency 0, one item per consent), exactly as in
``test_dispatch_throughput.py``; the client, the chain, the claims and the writes run here,
under the profiler. ``PROFILE_PROVIDERS=300`` profiles the many-providers case instead
(``test_many_providers.py``: that many providers, each planned at 2 refreshes/s for one
minute, not saturated: where an unsaturated process's time goes). ``PROFILE_BASELINE=a3``
profiles (a3) instead, the same simulator and HTTP layer with no chain and no database
(``client_loop``, 50 workers, ``PROFILE_SECONDS`` long, 40 by default): the same places,
set side by side with a ``run_day`` profile, show what the full path adds. Prints the top
entries by own time and by cumulative time, and saves the
raw profile to ``PROFILE_OUT`` (default: a temporary directory; the path is printed;
browse it with ``python -m pstats``). What SQLite's driver thread spends on each statement:
``python -m tests.bench.sqlite_statements``.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import httpx

import batch
from batch.clock import KST, ScaledClock
from batch.config import load_institutions
from batch.dispatch.runner import RunOptions, run_day
from batch.simulator import SimulatorProcess
from tests.bench.spy_dispatch import report, sampling
from tests.bench.test_dispatch_throughput import (
    CALLS_PER_REFRESH,
    FIRST_MINUTE,
    PROVIDERS,
    _institutions_toml,
    _prepare,
    client_loop,
)
from tests.bench.test_many_providers import PORTS, REFRESHES_PER_SECOND
from tests.bench.test_many_providers import _institutions_toml as many_toml
from tests.conftest import PG_ADMIN_URL, _admin
from tests.integration.helpers import free_ports
from tests.sealing import CIPHER

#: the simulator's scenario for these runs: answers at once, one item per consent
#: (a3)'s workers, as the dispatch bench's best concurrency
A3_CONCURRENCY = 50
SCENARIO = "[defaults]\nlatency_median_ms = 0\nitems_min = 1\nitems_max = 1\n"


class DayFigures(NamedTuple):
    """What :func:`saturated_day` measured."""

    seconds: float  # the run's wall time
    calls: int
    cpu: float  # this process's CPU seconds (every thread)
    loop_cpu: float  # the event loop's thread alone


async def saturated_day(url: str, insts_path: Path, per_provider: int,
                        during: AbstractContextManager[object], *, speed: float = 1.0,
                        http_factory: Callable[[int], httpx.AsyncClient] | None = None,
                        ) -> DayFigures:
    """``run_day`` over a one-minute plan of ``per_provider`` refreshes a provider, inside
    ``during`` (a profiler, a sampler, a probe), entered once the database is ready; the
    clock runs at ``speed`` and ``http_factory`` replaces the HTTP client (run_day's)."""
    insts = load_institutions(insts_path)
    engine = await _prepare(url, insts, {FIRST_MINUTE: per_provider})
    clock = ScaledClock(speed, start=datetime(2026, 11, 30, 0, 59, 57, tzinfo=KST))
    t0, c0, m0 = time.monotonic(), time.process_time(), time.thread_time()
    try:
        with during:
            res = await run_day(engine, cipher=CIPHER, clock=clock, options=RunOptions(
                progress="none", lease=timedelta(minutes=10)), stream=io.StringIO(),
                install_signals=False, http_factory=http_factory)
    finally:
        cpu, loop_cpu = time.process_time() - c0, time.thread_time() - m0
        await engine.dispose()
    calls = sum(int(p["calls"]) for p in res.summary.to_json()["providers"])
    return DayFigures(time.monotonic() - t0, calls, cpu, loop_cpu)


@contextmanager
def bench_database(backend: str, tmp: Path) -> Iterator[str]:
    """A new database for one run, its URL: an SQLite file in ``tmp``, or a PostgreSQL
    database on the test server (``MYDATA_TEST_PG_URL``), dropped after (the file too: a
    saturated minute leaves some 100 MB)."""
    name = f"mydata_p_{uuid.uuid4().hex[:12]}"
    if backend == "sqlite":
        db = tmp / f"{name}.db"
        try:
            yield f"sqlite+aiosqlite:///{db}"
        finally:
            for f in (db, db.with_name(f"{db.name}-wal"), db.with_name(f"{db.name}-shm")):
                f.unlink(missing_ok=True)
        return
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextmanager
def simulated_day(backend: str, prefix: str) -> Iterator[tuple[Path, str]]:
    """The dispatch bench's providers served by the simulator (its own process, answering
    at once) and a new database of ``backend`` (:func:`bench_database`), for one
    :func:`saturated_day`: the institutions file and the database URL, in a temporary
    directory removed after."""
    with tempfile.TemporaryDirectory(prefix=prefix) as where:
        tmp = Path(where)
        path = tmp / "institutions.toml"
        path.write_text(_institutions_toml(free_ports(PROVIDERS)))
        scen = tmp / "scenario.toml"
        scen.write_text(SCENARIO)
        with bench_database(backend, tmp) as url, \
                SimulatorProcess(path, scenario_path=scen, window_override=["0000:2359"]):
            yield path, url


def simulated_run(backend: str, prefix: str,
                  during: AbstractContextManager[object]) -> DayFigures:
    """One :func:`saturated_day` at ``PROFILE_RATE`` calls/s offered (default 3,000) on a
    :func:`simulated_day` of ``backend``, inside ``during``: what the bench scripts that
    instrument a run (``pg_writes``, ``sqlite_statements``) measure."""
    rate = float(os.environ.get("PROFILE_RATE", "3000"))
    with simulated_day(backend, prefix) as (path, url):
        return asyncio.run(saturated_day(url, path, refreshes_per_provider(rate), during))


def refreshes_per_provider(rate: float) -> int:
    """The refreshes a provider of the dispatch bench's is planned in the one minute, for
    ``rate`` calls/s offered in all."""
    return int(rate * 60 / CALLS_PER_REFRESH / PROVIDERS)


_OURS = str(Path(batch.__file__).resolve().parent) + os.sep


def by_package(stats: pstats.Stats, top: int = 24) -> str:
    """Own time summed per installed package, per module of ours (``batch/...``), per
    builtin, and the standard library (asyncio apart): the lines the README quotes."""
    own: dict[str, float] = defaultdict(float)
    for (path, _, name), row in stats.stats.items():  # type: ignore[attr-defined]
        tottime = row[2]
        if "site-packages" + os.sep in path:
            key = path.split("site-packages" + os.sep, 1)[1].split(os.sep, 1)[0]
        elif path.startswith(_OURS):
            key = "batch/" + path[len(_OURS):]
        elif path == "~":
            key = name
        elif f"{os.sep}asyncio{os.sep}" in path:
            key = "asyncio"
        else:
            key = "stdlib (other)"
        own[key] += tottime
    total = sum(own.values()) or 1.0
    ours = sum(v for k, v in own.items() if k.startswith("batch/"))
    lines = [f"own time by package: {total:.1f} s in all; our code (batch/) "
             f"{ours:.1f} s = {ours / total:.1%}"]
    for key, secs in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {secs:7.2f} s {secs / total:6.1%}  {key}")
    return "\n".join(lines)


def main() -> None:
    backend = os.environ.get("PROFILE_BACKEND", "sqlite")
    rate = float(os.environ.get("PROFILE_RATE", "3000"))
    top = int(os.environ.get("PROFILE_TOP", "30"))
    many = int(os.environ.get("PROFILE_PROVIDERS", "0"))
    tmp = Path(tempfile.mkdtemp(prefix="mydata-profile-"))
    path = tmp / "institutions.toml"
    if many:
        path.write_text(many_toml(free_ports(PORTS), many))
        planned = REFRESHES_PER_SECOND * 60
        rate = many * planned * CALLS_PER_REFRESH / 60
    else:
        path.write_text(_institutions_toml(free_ports(PROVIDERS)))
        planned = refreshes_per_provider(rate)
    scen = tmp / "scenario.toml"
    scen.write_text(SCENARIO)
    spy = os.environ.get("PROFILER", "cprofile") == "py-spy"
    if os.environ.get("PROFILE_BASELINE") == "a3":
        _profile_a3(path, scen, tmp, spy, top)
        return
    out = Path(os.environ.get("PROFILE_OUT", str(
        tmp / (f"py-spy-{backend}.txt" if spy else f"profile-{backend}.prof"))))
    with bench_database(backend, tmp) as url, \
            SimulatorProcess(path, scenario_path=scen, window_override=["0000:2359"]):
        prof = None if spy else cProfile.Profile()
        seconds, calls, cpu, _ = asyncio.run(saturated_day(
            url, path, planned, sampling(out) if prof is None else prof))
    what = f"{many} providers' run_day" if many else "a saturated run_day"
    print(f"== {'py-spy' if spy else 'cProfile'} of {what} on {backend}: {calls:,} calls in "
          f"{seconds:.1f} s (offered {rate:g} calls/s; {os.getloadavg()[0]:.2f} load) "
          f"-> {out} ==")
    _print_profile(prof, out, cpu=cpu, calls=calls, top=top)


def _print_profile(prof: cProfile.Profile | None, out: Path, *, cpu: float, calls: int,
                   top: int) -> None:
    """py-spy's places (``prof`` None: its samples are in ``out``), or cProfile's top
    entries by own and by cumulative time (its raw profile saved to ``out``)."""
    if prof is None:
        print(report(out, cpu=cpu, calls=calls, top=top))
    else:
        stats = pstats.Stats(prof)
        stats.dump_stats(out)
        print(by_package(stats))
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
    sys.stdout.flush()


def _profile_a3(path: Path, scen: Path, tmp: Path, spy: bool, top: int) -> None:
    """(a3) under the profiler: ``client_loop`` at concurrency 50 against the simulator."""
    seconds = float(os.environ.get("PROFILE_SECONDS", "40"))
    out = Path(os.environ.get("PROFILE_OUT", str(
        tmp / ("py-spy-a3.txt" if spy else "profile-a3.prof"))))
    with SimulatorProcess(path, scenario_path=scen, window_override=["0000:2359"]):
        insts = load_institutions(path)
        asyncio.run(client_loop(insts, A3_CONCURRENCY, 3.0))  # connections made, warm
        prof = None if spy else cProfile.Profile()
        c0 = time.process_time()
        with sampling(out) if prof is None else prof:
            calls, _ = asyncio.run(client_loop(insts, A3_CONCURRENCY, seconds))
        cpu = time.process_time() - c0
    print(f"== {'py-spy' if spy else 'cProfile'} of (a3), {A3_CONCURRENCY} workers: {calls:,} "
          f"calls in {seconds:g} s ({os.getloadavg()[0]:.2f} load) -> {out} ==")
    _print_profile(prof, out, cpu=cpu, calls=calls, top=top)


if __name__ == "__main__":
    main()
