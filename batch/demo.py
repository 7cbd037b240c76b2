"""``demo``: the whole flow on a throw-away SQLite file, end to end, in a few minutes.

Seed a small population, start the provider simulator on 127.0.0.1 (its own process),
plan the week, run today's work under a short window override, print the summary, write
the dashboard, stop the simulator, and check what the simulator saw: every consent due
today attempted, zero rate-limit rejections (42902), zero window violations.

Tokens are sealed in the database as in production: with the key the environment gives
(MYDATA_TOKEN_KEYS / MYDATA_TOKEN_KEY_FILE), else with a key of its own, made for each demo
in ``OUT/token.key``. The simulator reads the seed CSV, which holds them plain.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

from batch.clock import Clock
from batch.crypto import KEY_FILE_ENV, KEYS_ENV, TokenCipher, generate_key
from batch.db.engine import init_db, make_engine
from batch.dispatch.runner import RunOptions, run_day
from batch.dispatch.summary import RunSummary, format_summary
from batch.plan_report import to_table
from batch.planner import build_week_plan, save_plan
from batch.seed import SeedParams, load_seed, load_time, write_seed
from planning.windows import parse_window


@dataclass(frozen=True, slots=True)
class DemoSettings:
    out_dir: Path = Path("demo-out")
    providers: int = 5
    consents: int = 20_000
    seed: int = 42
    window_minutes: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.window_minutes <= 60:
            raise ValueError("window_minutes must be between 1 and 60")


def free_base_port(n: int, *, start: int = 19001, stop: int = 60000) -> int:
    """The first port p >= start with p..p+n-1 all free on 127.0.0.1."""
    p = start
    while p + n < stop:
        for i in range(n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p + i))
                except OSError:
                    p = p + i + 1
                    break
        else:
            return p
    raise RuntimeError("no free block of ports for the simulator")


def _fresh_db(out_dir: Path) -> Path:
    """``OUT/demo.db``, removed first (with its WAL files) so every demo starts empty."""
    out_dir.mkdir(parents=True, exist_ok=True)
    db = out_dir / "demo.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    return db


KEY_FILE = "token.key"


def demo_cipher(out_dir: Path, environ: Mapping[str, str] | None = None
                ) -> tuple[TokenCipher, str]:
    """The demo's token cipher and where its key came from: the environment's keys if it
    gives any, else a new key written to ``OUT/token.key`` (readable by its owner only)."""
    env = os.environ if environ is None else environ
    if env.get(KEYS_ENV, "").strip():
        return TokenCipher.from_env(env), KEYS_ENV
    if env.get(KEY_FILE_ENV, "").strip():
        return TokenCipher.from_env(env), f"{KEY_FILE_ENV} {env[KEY_FILE_ENV].strip()}"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / KEY_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(generate_key() + "\n")
    return TokenCipher.from_env({KEY_FILE_ENV: str(path)}), str(path)


def _say(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


async def run_demo(settings: DemoSettings, *, clock: Clock, out: TextIO,
                   cipher: TokenCipher) -> int:
    """Run the demo; returns the exit code (0 when every check passed)."""
    from batch.dashboard.page import write_dashboard
    from batch.simulator import SimulatorProcess

    out_dir = settings.out_dir
    db = _fresh_db(out_dir)
    engine = make_engine(f"sqlite+aiosqlite:///{db}")
    try:
        await init_db(engine)
        now = clock.now()
        today = now.date()
        base_port = free_base_port(settings.providers)
        _say(out, f"== seeding {settings.providers} providers, {settings.consents:,} consents "
                  f"into {db}")
        seeded = write_seed(SeedParams(today=today, providers=settings.providers,
                                       consents=settings.consents, seed=settings.seed,
                                       base_port=base_port), out_dir)
        await load_seed(engine, seeded.files, now=load_time(today, now), cipher=cipher)

        start = (clock.now() + timedelta(minutes=1)).replace(second=0, microsecond=0)
        if start.date() != today:
            start = start.replace(hour=23, minute=58 - settings.window_minutes)
        end = start + timedelta(minutes=settings.window_minutes)
        window_text = f"{start:%H%M}:{end:%H%M}"
        window = parse_window(window_text, step=1)

        _say(out, f"== planning the week (today planned for the run window {window_text})")
        plan = await build_week_plan(engine, week_of=today, today=today, now=clock.now(),
                                     today_windows=(window,))
        await save_plan(engine, plan)
        _say(out, to_table(plan, saved=True))
        _say(out, f"== starting the simulator; run window {window_text} KST")
        with SimulatorProcess(seeded.files.institutions, window_override=[window_text],
                              seed=settings.seed) as sim:
            result = await run_day(engine, clock=clock, options=RunOptions(
                window_override=(window,), progress="auto"), cipher=cipher, stream=out)
            stats = sim.stats()
        _say(out, "")
        _say(out, format_summary(result.summary))
        page = await write_dashboard(engine, out_dir / "dashboard.html", now=clock.now())
        _say(out, f"== dashboard written to {page}")
    finally:
        await engine.dispose()
    return _checks(result.summary, stats, out)


def _checks(summary: RunSummary, stats: dict[str, Any], out: TextIO) -> int:
    t = summary.totals
    rate = sum(p["violations"]["rate"] for p in stats["providers"].values())
    window = sum(p["violations"]["window"] for p in stats["providers"].values())
    by_code = stats["total"]["by_code"]
    rows = [
        ("consents planned today", t["planned"], None),
        ("attempted", t["attempted"], t["attempted"] + t["attempted_before_run"] >= t["planned"]),
        ("succeeded", t["succeeded"], None),
        ("calls seen by the simulator", stats["total"]["calls"], None),
        ("rate-limit rejections (42902)", by_code.get("42902", 0), by_code.get("42902", 0) == 0),
        ("rate violations at the simulator", rate, rate == 0),
        ("window violations at the simulator", window, window == 0),
    ]
    _say(out, "== checks")
    ok = True
    for label, value, passed in rows:
        mark = "" if passed is None else ("  ok" if passed else "  FAILED")
        ok = ok and passed is not False
        _say(out, f"   {label:<36} {value:>10,}{mark}")
    return 0 if ok and summary.exit_code == 0 else 1
