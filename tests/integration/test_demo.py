"""The demo end to end in a subprocess, on a 10x ScaledClock (same code path as `make demo`).

At 20x a 100 ms slice is 5 ms of real time, and CI's parallel workers, PostgreSQL and the
simulator share two cores: with two busy processes beside it the demo at 20x left 13-37 of
394 consents unstarted when its window closed (3 runs of 3), at 10x none (4 runs of 4, with
two and three busy processes).
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from batch.clock import KST, ScaledClock
from batch.crypto import KEY_FILE_ENV, KEYS_ENV, TokenSlot
from batch.demo import KEY_FILE, demo_cipher
from tests.integration.helpers import subprocess_env
from tests.integration.test_tokens_dump import full_dump
from tests.sealing import CIPHER, unseal

pytestmark = pytest.mark.integration


def test_demo_seeds_plans_runs_and_passes_its_checks(tmp_path: Path) -> None:
    clock = ScaledClock(10, start=datetime.now(KST).replace(hour=2, minute=0, second=0))
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

    # A full SQL dump of the demo's database holds no token in plain text: none of the
    # seed file's, none the run stored (refreshed ones included), opened with its key.
    dump = full_dump(f"sqlite:///{out / 'demo.db'}")
    rows = [ln.split(",") for ln in (out / "consents.csv").read_text().splitlines()[1:]]
    from_file = {t for r in rows for t in (r[2], r[-1]) if t}
    assert len(from_file) == 2 * 3000
    assert not [t for t in from_file if t in dump]
    assert "','AT" not in dump and "','RT" not in dump
    opened = _stored_tokens(out / "demo.db")
    assert opened and not [t for t in opened if t in dump]


def _stored_tokens(db: Path) -> set[str]:
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            "SELECT org_code, user_id, access_token, refresh_token FROM consents").fetchall()
    finally:
        conn.close()
    return {unseal(t, org, user, column) for org, user, *pair in rows
            for column, t in zip(("access_token", "refresh_token"), pair, strict=True) if t}


def test_the_demo_makes_its_own_key_unless_the_environment_gives_one(tmp_path: Path) -> None:
    cipher, where = demo_cipher(tmp_path, {})
    key_file = tmp_path / KEY_FILE
    assert where == str(key_file) and key_file.stat().st_mode & 0o777 == 0o600
    slot = TokenSlot("BANK000001", "u1", "refresh_token")
    assert cipher.decrypt(cipher.encrypt("t", slot), slot) == "t"
    again, _ = demo_cipher(tmp_path, {})  # each demo starts afresh, with a new key
    assert again.primary_id != cipher.primary_id
    key_file.unlink()
    given, where = demo_cipher(tmp_path, {KEYS_ENV: os.environ[KEYS_ENV]})
    assert (given.primary_id, where) == (CIPHER.primary_id, KEYS_ENV)
    assert not key_file.exists()
    (tmp_path / "k").write_text(os.environ[KEYS_ENV] + "\n")
    from_file, where = demo_cipher(tmp_path, {KEY_FILE_ENV: str(tmp_path / "k")})
    assert from_file.primary_id == CIPHER.primary_id and not key_file.exists()
