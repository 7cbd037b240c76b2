"""kill -9 in the middle of a run, then a restart: the day completes, nothing lost, and no
consent is transferred twice in the week (real subprocesses, real HTTP, both databases).

Both processes and the simulator share a 10x ScaledClock through MYDATA_CLOCK.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from batch.clock import KST, ScaledClock
from batch.db import schema
from batch.db.engine import make_engine
from batch.simulator import SimulatorProcess, consent_key
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
PER_PROVIDER = 300


def _run_cmd(db_url: str) -> list[str]:
    return [sys.executable, "-m", "batch.cli", "--db", db_url, "run",
            "--window-override", "0100:0103", "--json", "--lease-seconds", "60",
            "--progress", "none", "--log-level", "WARNING"]


def test_kill_9_mid_run_then_restart_completes_the_day_without_double_transfers(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    ports = free_ports(2)
    toml = tmp_path / "institutions.toml"
    toml.write_text(institutions_toml(ports, cps=50))
    insts = make_institutions(ports, cps=50)
    clock = ScaledClock(SPEED, start=datetime(2026, 11, 30, 0, 59, 0, tzinfo=KST))

    tokens = populate_url(db_url, insts, per_provider=PER_PROVIDER, now=clock.now())
    monkeypatch.setenv("MYDATA_CLOCK", clock.spec())
    env = subprocess_env()

    def real_seconds_until(hh: int, mm: int, ss: int) -> float:
        target = datetime(2026, 11, 30, hh, mm, ss, tzinfo=KST)
        return max(0.0, (target - clock.now()).total_seconds() / SPEED)

    with SimulatorProcess(toml, window_override=["0100:0103"]) as sim:
        first = subprocess.Popen(_run_cmd(db_url), env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        time.sleep(real_seconds_until(1, 1, 10))  # 70 s into the window
        assert first.poll() is None, first.communicate()
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        mid = sim.stats()
        done_before_kill = sum(p["transfers"] for p in mid["providers"].values())
        assert 0 < done_before_kill < 2 * PER_PROVIDER

        second = subprocess.run(_run_cmd(db_url), env=env, capture_output=True, timeout=120)
        assert second.returncode == 0, second.stderr.decode()[-2000:]
        summary = json.loads(second.stdout)
        stats = sim.stats(detail=True)

    assert summary["status"] == "done"
    # Nothing lost: every consent is done for the week.
    async def final() -> tuple[list[object], list[object]]:
        engine = make_engine(db_url)
        try:
            async with engine.connect() as conn:
                rows = (await conn.execute(select(
                    schema.consents.c.id, schema.consents.c.due_week,
                    schema.consents.c.week_result, schema.consents.c.lease_owner))).all()
                outs = (await conn.execute(select(
                    schema.call_outcomes.c.consent_id, schema.call_outcomes.c.action,
                    schema.call_outcomes.c.run_id, schema.call_outcomes.c.at,
                    schema.call_outcomes.c.tran_id))).all()
            return list(rows), list(outs)
        finally:
            await engine.dispose()

    rows, outs = asyncio.run(final())
    assert len(rows) == 2 * PER_PROVIDER
    assert {r.due_week for r in rows} == {WEEK + timedelta(days=7)}  # type: ignore[attr-defined]
    assert {r.lease_owner for r in rows} == {None}  # type: ignore[attr-defined]
    # Nothing done twice: at the provider, every consent's week holds exactly one transfer,
    done_twice = Counter(o.consent_id for o in outs if o.action == "done")  # type: ignore[attr-defined]
    assert max(done_twice.values()) == 1, [o for o in outs if done_twice[o[0]] > 1]
    for org, toks in tokens.items():
        per_consent = stats["consents"][org]
        assert sorted(per_consent) == sorted(consent_key(t) for t in toks)
        assert set(per_consent.values()) == {1}
    # and any repeat call the crash caused was refused by the provider (42901) and recorded
    # as transferred but not received, never as a second success.
    repeats = sum(p["violations"]["second_transfer"] for p in stats["providers"].values())
    not_received = sum(1 for r in rows if r.week_result == "transferred_not_received")  # type: ignore[attr-defined]
    assert repeats == not_received
    for p in stats["providers"].values():
        assert p["violations"]["rate"] == 0 and p["violations"]["window"] == 0
