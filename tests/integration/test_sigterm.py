"""SIGTERM mid-run: stop claiming, finish in-flight calls, release unstarted claims, write
every outcome, exit 3; a restart then completes the day."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from batch.clock import KST
from batch.simulator import SimulatorProcess
from tests.integration.helpers import interrupted_run, leased_done_logged, subprocess_env

pytestmark = pytest.mark.integration

SPEED = 5.0


def test_sigterm_releases_unstarted_work_writes_outcomes_and_exits_3(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = interrupted_run(sqlite_url, tmp_path, monkeypatch, speed=SPEED)
    clock, cmd = run.clock, run.cmd
    env = subprocess_env()

    with SimulatorProcess(run.toml, window_override=["0100:0102"]):
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

        leased, done, logged = leased_done_logged(sqlite_url)
        assert leased == 0  # unstarted claims released, finished ones written
        assert done == p["succeeded"] == logged

        again = subprocess.run(cmd, env=env, capture_output=True, timeout=120)
        assert again.returncode == 0, (again.stdout.decode()[-3000:], again.stderr.decode()[-2000:])
        rest = json.loads(again.stdout)["providers"][0]
        assert rest["attempted_before_run"] == p["attempted"]
        assert p["attempted"] + rest["attempted"] == 400
