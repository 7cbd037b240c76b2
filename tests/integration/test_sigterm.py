"""SIGTERM mid-run: stop claiming, finish in-flight calls, release unstarted claims, write
every outcome, exit 3; a restart then completes the day."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from batch.clock import KST, ScaledClock
from batch.db import schema
from batch.db.engine import make_engine
from batch.simulator import SimulatorProcess
from tests.integration.helpers import (
    WEEK,
    free_ports,
    institutions_toml,
    make_institutions,
    populate_url,
    subprocess_env,
)

pytestmark = pytest.mark.integration

SPEED = 5.0


def test_sigterm_releases_unstarted_work_writes_outcomes_and_exits_3(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    ports = free_ports(1)
    toml = tmp_path / "institutions.toml"
    toml.write_text(institutions_toml(ports, cps=50, industries=("bank",)))
    insts = make_institutions(ports, cps=50, industries=("bank",))
    clock = ScaledClock(SPEED, start=datetime(2026, 11, 30, 0, 59, 30, tzinfo=KST))

    populate_url(sqlite_url, insts, per_provider=400, now=clock.now())
    monkeypatch.setenv("MYDATA_CLOCK", clock.spec())
    env = subprocess_env()
    cmd = [sys.executable, "-m", "batch.cli", "--db", sqlite_url, "run", "--window-override",
           "0100:0102", "--json", "--progress", "none", "--log-level", "WARNING"]

    with SimulatorProcess(toml, window_override=["0100:0102"]):
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        target = datetime(2026, 11, 30, 1, 0, 40, tzinfo=KST)
        time.sleep(max(0.0, (target - clock.now()).total_seconds() / SPEED))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 3, err.decode()[-2000:]
        summary = json.loads(out)
        assert summary["status"] == "interrupted"
        (p,) = summary["providers"]
        assert 0 < p["attempted"] < 400

        async def state() -> tuple[int, int, int]:
            engine = make_engine(sqlite_url)
            try:
                async with engine.connect() as conn:
                    leased = (await conn.execute(select(func.count()).where(
                        schema.consents.c.lease_owner.is_not(None)))).scalar_one()
                    done = (await conn.execute(select(func.count()).where(
                        schema.consents.c.due_week == WEEK + timedelta(days=7)))).scalar_one()
                    logged = (await conn.execute(select(func.count()).select_from(
                        schema.call_outcomes))).scalar_one()
                return int(leased), int(done), int(logged)
            finally:
                await engine.dispose()

        leased, done, logged = asyncio.run(state())
        assert leased == 0  # unstarted claims released, finished ones written
        assert done == p["succeeded"] == logged

        again = subprocess.run(cmd, env=env, capture_output=True, timeout=120)
        assert again.returncode == 0, (again.stdout.decode()[-3000:], again.stderr.decode()[-2000:])
        rest = json.loads(again.stdout)["providers"][0]
        assert rest["attempted_before_run"] == p["attempted"]
        assert p["attempted"] + rest["attempted"] == 400
