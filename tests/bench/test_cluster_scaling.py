"""Cluster mode: 1, 2 and 4 workers (`run --redis`) against the simulator at 50 ms median
latency, on one PostgreSQL and a private Redis.

Run: ``pytest -q -s tests/bench/test_cluster_scaling.py`` (about 6 minutes). The cases:

- limits not binding (2000 calls/s per provider, 200 in flight), each worker sized for 10
  calls in flight per provider (``run --concurrency 10``), so it waits on I/O, not CPU:
  total calls/s of the cluster; the goal is 2 workers >= 1.8x one worker;
- the same with no per-worker cap ("saturated"): one worker fills a core of this 2-core
  machine, which the simulator, PostgreSQL and Redis share with it, so what more workers
  add is CPU only; printed for calls per worker CPU-second (the cost of coordination);
- limits binding (40 and 100 calls/s per provider, more work than the window holds): the
  peak per-provider rate the simulator saw in any 1-second window; the goal is within 2% of
  the limit (at 40/s one call is 2.5 %: the limit plus its burst of 1 is what holds there).

Each configuration runs the last ``BENCH_SECONDS`` (default 30) of a window, real time.
The machine's load average is printed beside the figures (it is shared).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from batch.clock import KST, ScaledClock
from batch.config import parse_institutions
from batch.simulator import SimulatorProcess
from tests.conftest import PG_ADMIN_URL, _admin
from tests.integration.cluster_helpers import private_redis, worker_cmd
from tests.integration.helpers import (
    free_ports,
    institutions_toml,
    populate_url,
    subprocess_env,
)

SECONDS = float(os.environ.get("BENCH_SECONDS", "30"))
WINDOW = "0100:0105"
END = datetime(2026, 11, 30, 1, 5, 0, tzinfo=KST)


def _one(pg_url: str, tmp_path: Path, workers: int, cps: int, per_provider: int,
         extra: tuple[str, ...] = ()) -> dict[str, float]:
    ports = free_ports(2)
    toml = tmp_path / f"inst-{workers}-{cps}.toml"
    # the provider's concurrency is the cluster's (each worker holds its share of it):
    # 200 in flight does not bind at 50 ms (4000 calls/s), so the limits are the rate's
    text = institutions_toml(ports, cps=cps).replace("max_concurrency = 20",
                                                     "max_concurrency = 200")
    toml.write_text(text)
    insts = parse_institutions(text)
    # start so that SECONDS (plus the 10 s finish margin) are left of the window
    start = END - timedelta(seconds=SECONDS + 10 + 5)
    clock = ScaledClock(1.0, start=start)
    populate_url(pg_url, insts, per_provider=per_provider, now=clock.now())
    env = subprocess_env(MYDATA_CLOCK=clock.spec())
    scen = tmp_path / "scenario.toml"
    scen.write_text("[defaults]\nlatency_median_ms = 50\nlatency_p99_ms = 150\n"
                    "items_min = 1\nitems_max = 1\n")
    os.environ["MYDATA_CLOCK"] = clock.spec()
    try:
        with private_redis() as (redis_url, _), SimulatorProcess(
                toml, scenario_path=scen, window_override=[WINDOW]) as sim:
            t0 = time.monotonic()
            cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            procs = [subprocess.Popen(worker_cmd(pg_url, redis_url, WINDOW, name=f"b{i}",
                                                 extra=extra),
                                      env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL) for i in range(workers)]
            outs = [p.communicate(timeout=SECONDS + 120)[0] for p in procs]
            wall = time.monotonic() - t0
            cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers, reaped
            stats = sim.stats()
    finally:
        os.environ.pop("MYDATA_CLOCK", None)
    sums = [json.loads(o) for o in outs if o.strip()]
    calls = sum(p["calls"] for p in stats["providers"].values())
    busy = max((s["elapsed_seconds"] for s in sums), default=wall)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {"calls": calls, "calls_per_s": calls / max(busy, 1e-9),
            "calls_per_cpu_s": calls / max(cpu, 1e-9), "cpu_s": cpu,
            "peak": max(p["peak_1s"] for p in stats["providers"].values()),
            "violations": sum(p["violations"]["rate"] for p in stats["providers"].values())}


#: calls in flight per provider one worker is sized for in the "free" case (run
#: --concurrency): 2 providers x 10 at 50 ms are at most 400 calls/s, a quarter of a core
WORKER_CONCURRENCY = int(os.environ.get("BENCH_WORKER_CONCURRENCY", "10"))


@pytest.mark.parametrize("case", ["free", "saturated", "binding", "binding-100"])
def test_cluster_scaling(tmp_path: Path, case: str) -> None:
    # at 40/s one call is 2.5 % of the limit: 100/s is where "within 2 %" can be read
    cps, per = {"free": (2000, 40000), "saturated": (2000, 40000), "binding": (40, 6000),
                "binding-100": (100, 12000)}[case]
    extra = ("--concurrency", str(WORKER_CONCURRENCY)) if case == "free" else ()
    rows = {}
    for n in (1, 2, 4):
        with _fresh_db() as db:
            rows[n] = _one(db, tmp_path, n, cps, per, extra)
    load = os.getloadavg()
    sized = f", each worker {WORKER_CONCURRENCY} in flight per provider" if extra else ""
    print(f"\n== cluster scaling, limits {case} ({cps} calls/s per provider, 2 providers"
          f"{sized}), 50 ms median latency, {os.cpu_count()} CPUs, load avg {load[0]:.2f} "
          f"{load[1]:.2f} {load[2]:.2f} ==")
    for n, r in rows.items():
        print(f"{n} worker(s): {r['calls']:>7} calls, {r['calls_per_s']:8.1f} calls/s total, "
              f"peak per provider {r['peak']:>5}/s (limit {cps}), "
              f"bucket violations {r['violations']}, workers' CPU {r['cpu_s']:6.1f} s "
              f"({r['calls_per_cpu_s']:6.1f} calls per CPU-second)")
    if case in ("free", "saturated"):
        goal = "goal >= 1.8x" if case == "free" else "CPU-bound: no goal"
        print(f"2 workers / 1 worker: {rows[2]['calls_per_s'] / rows[1]['calls_per_s']:.2f}x "
              f"({goal}), 4 / 1: {rows[4]['calls_per_s'] / rows[1]['calls_per_s']:.2f}x; "
              "calls per worker CPU-second, 2 workers / 1: "
              f"{rows[2]['calls_per_cpu_s'] / rows[1]['calls_per_cpu_s']:.2f}x "
              f"(1.0x: no cost of the cluster's coordination per call)")
    else:
        worst = max(r["peak"] for r in rows.values())
        print(f"worst 1-second peak: {worst}/s = {100 * (worst / cps - 1):+.1f}% of the limit "
              f"(goal within 2%; the limit plus its burst of 1 is {cps + 1})")
    assert all(r["calls"] > 0 for r in rows.values())


@contextmanager
def _fresh_db() -> Iterator[str]:
    """A fresh PostgreSQL database per configuration, dropped afterwards."""
    name = f"mydata_b_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
