"""Where the CPU goes on the full path: a saturated ``run_day`` under cProfile.

Run: ``make profile`` (``PROFILE_BACKEND=sqlite|postgresql``, ``PROFILE_RATE`` planned
calls/s offered over the one-minute plan, ``PROFILE_TOP`` entries shown). The simulator runs
in its own process (latency 0, one item per consent), exactly as in
``test_dispatch_throughput.py``; the client, the chain, the claims and the writes run here,
under the profiler. Prints the top entries by own time and by cumulative time, and saves the
raw profile to ``PROFILE_OUT`` (default: a temporary directory; the path is printed;
browse it with ``python -m pstats``).
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
from datetime import datetime, timedelta
from pathlib import Path

from batch.clock import KST, ScaledClock
from batch.config import load_institutions
from batch.dispatch.runner import RunOptions, run_day
from batch.simulator import SimulatorProcess
from tests.bench.test_dispatch_throughput import (
    CALLS_PER_REFRESH,
    FIRST_MINUTE,
    PROVIDERS,
    _institutions_toml,
    _prepare,
)
from tests.conftest import PG_ADMIN_URL, _admin
from tests.integration.helpers import free_ports
from tests.sealing import CIPHER


async def _profiled_run(url: str, insts_path: Path, rate: float) -> tuple[pstats.Stats, float,
                                                                          int]:
    insts = load_institutions(insts_path)
    per_provider = int(rate * 60 / CALLS_PER_REFRESH / PROVIDERS)
    engine = await _prepare(url, insts, {FIRST_MINUTE: per_provider})
    clock = ScaledClock(1.0, start=datetime(2026, 11, 30, 0, 59, 57, tzinfo=KST))
    prof = cProfile.Profile()
    t0 = time.monotonic()
    prof.enable()
    try:
        res = await run_day(engine, cipher=CIPHER, clock=clock, options=RunOptions(
            progress="none", lease=timedelta(minutes=10)), stream=io.StringIO(),
            install_signals=False)
    finally:
        prof.disable()
        await engine.dispose()
    calls = sum(int(p["calls"]) for p in res.summary.to_json()["providers"])
    return pstats.Stats(prof), time.monotonic() - t0, calls


def main() -> None:
    backend = os.environ.get("PROFILE_BACKEND", "sqlite")
    rate = float(os.environ.get("PROFILE_RATE", "3000"))
    top = int(os.environ.get("PROFILE_TOP", "30"))
    tmp = Path(tempfile.mkdtemp(prefix="mydata-profile-"))
    path = tmp / "institutions.toml"
    path.write_text(_institutions_toml(free_ports(PROVIDERS)))
    scen = tmp / "scenario.toml"
    scen.write_text("[defaults]\nlatency_median_ms = 0\nitems_min = 1\nitems_max = 1\n")
    name = f"mydata_p_{uuid.uuid4().hex[:12]}"
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp / name}.db"
    else:
        asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
        url = f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    try:
        with SimulatorProcess(path, scenario_path=scen, window_override=["0000:2359"]):
            stats, seconds, calls = asyncio.run(_profiled_run(url, path, rate))
    finally:
        if backend != "sqlite":
            asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    out = Path(os.environ.get("PROFILE_OUT", str(tmp / f"profile-{backend}.prof")))
    stats.dump_stats(out)
    print(f"== cProfile of a saturated run_day on {backend}: {calls:,} calls in {seconds:.1f} s"
          f" (offered {rate:g} calls/s; {os.getloadavg()[0]:.2f} load) -> {out} ==")
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
