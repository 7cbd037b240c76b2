"""The demo end to end in a subprocess, on a 20x ScaledClock (same code path as `make demo`)."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from batch.clock import KST, ScaledClock
from tests.integration.helpers import subprocess_env

pytestmark = pytest.mark.integration


def test_demo_seeds_plans_runs_and_passes_its_checks(tmp_path: Path) -> None:
    clock = ScaledClock(20, start=datetime.now(KST).replace(hour=2, minute=0, second=0))
    env = subprocess_env(MYDATA_CLOCK=clock.spec())
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "batch.cli", "demo", "--out", str(out), "--consents", "3000"],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    assert "rate-limit rejections (42902)" in text and "FAILED" not in text
    assert "status done" in text
    html = (out / "dashboard.html").read_text()
    assert "<svg" in html
    assert '"level": "error"' not in proc.stderr, proc.stderr[-2000:]
    # No access or refresh token anywhere a person or a log reader would see.
    lines = (out / "consents.csv").read_text().splitlines()[1:200]
    secrets = {f for line in lines for f in (line.split(",")[2], line.split(",")[-1])}
    assert secrets and all(len(s) > 20 for s in secrets)
    for seen in (proc.stdout, proc.stderr, html):
        assert not any(s in seen for s in secrets)
    for name in ("institutions.toml", "consents.csv", "usage.csv", "demo.db"):
        assert (out / name).exists()
