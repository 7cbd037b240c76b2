"""The cluster circuit end to end: 3 worker processes (`run --redis`) on one PostgreSQL and a
private Redis, the simulator over HTTP with a staged outage of one provider, all on one 4x
ScaledClock (MYDATA_CLOCK; a scaled clock's monotonic agrees across processes, so the
workers' log stamps, the simulator's timeline and this test share one time line).

The rules, each with its whole margin and no tighter:
- the outage opens the provider's circuit on every worker within 20 s (clock) of its start;
- while it is open, calls reach the provider at the probe rate (the simulator's counts),
  the whole cluster together;
- every worker resumes (sees it closed) within 20 s of the recovery;
- the day completes, and no consent is transferred twice;
- and all of that with the coordinator killed (kill -9) during the outage: another worker
  takes the lease over.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from batch.clock import KST, ScaledClock
from batch.cluster.circuit_events import recent_events
from batch.db.engine import make_engine
from batch.simulator import SimulatorProcess, consent_key
from tests.integration.cluster_helpers import final_rows, private_redis, worker_cmd
from tests.integration.helpers import (
    WEEK,
    free_ports,
    institutions_toml,
    make_institutions,
    populate_url,
    subprocess_env,
)

pytestmark = pytest.mark.integration

SPEED = 4.0
CPS = 20
WINDOW = "0100:0103"
#: about 50 s of work at 20 calls/s (3 or so calls a refresh) from 01:00:00: the outage
#: lands mid-way through it, and the window has room for the work it delays
PER_PROVIDER = 300
#: the outage, in seconds of the simulator's timeline (its start is about 00:59:45)
OUT_START, OUT_END = 30.0, 70.0
#: the rules (clock seconds)
OPEN_WITHIN = RESUME_WITHIN = 20.0
PROBE_RATE = 1.0  # CircuitSettings' default
#: short periods so that a 4x test day stays short; the defaults are minutes-scale
CIRCUIT = ("window_seconds=6;bucket_seconds=1;minimum_calls=10;healthy_period=6;"
           "push_interval=1;refresh_interval=1;lease_ttl=4")


def _setup(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
           ) -> tuple[Path, Path, str, ScaledClock, dict[str, list[str]], dict[str, str]]:
    ports = free_ports(2)
    toml = tmp_path / "institutions.toml"
    toml.write_text(institutions_toml(ports, cps=CPS))
    insts = make_institutions(ports, cps=CPS)
    bank = insts.providers[0].org_code
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(f'[[timeline]]\nprovider = "{bank}"\nstart = {OUT_START}\n'
                        f'end = {OUT_END}\nkind = "down"\nmode = "503"\n')
    clock = ScaledClock(SPEED, start=datetime(2026, 11, 30, 0, 59, 45, tzinfo=KST))
    tokens = populate_url(db_url, insts, per_provider=PER_PROVIDER, now=clock.now())
    monkeypatch.setenv("MYDATA_CLOCK", clock.spec())
    monkeypatch.setenv("MYDATA_CIRCUIT", CIRCUIT)
    return toml, scenario, bank, clock, tokens, subprocess_env()


def _workers(db_url: str, redis_url: str, env: dict[str, str]
             ) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(worker_cmd(db_url, redis_url, WINDOW, name=f"w{i}"), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for i in range(3)]


def _sleep_until(clock: ScaledClock, at: float) -> None:
    """Real sleep until the clock's monotonic reaches ``at``."""
    time.sleep(max(0.0, (at - clock.monotonic()) / SPEED))


def _calls(sim: SimulatorProcess, clock: ScaledClock, org: str) -> tuple[int, float, float]:
    """The provider's calls so far, bracketed by the clock before and after the read."""
    before = clock.monotonic()
    n = int(sim.stats()["providers"][org]["calls"])
    return n, before, clock.monotonic()


def _seen(err: bytes, org: str) -> list[tuple[str, float]]:
    """(state, clock seconds) of each change of ``org``'s circuit this worker saw."""
    out = []
    for line in err.decode(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("action") == "circuit_seen" and rec.get("org_code") == org:
            out.append((str(rec["state"]), float(rec["clock_s"])))
    return out


def _check_opened_and_resumed(err: bytes, org: str, t0: float, who: str) -> None:
    seen = _seen(err, org)
    opened = [t for s, t in seen if s == "open"]
    assert opened, (who, "never saw the circuit open", seen)
    # not before the outage (a healthy provider is not cut off) and within the rule
    assert t0 + OUT_START <= opened[0] <= t0 + OUT_START + OPEN_WITHIN, (
        who, opened[0] - t0 - OUT_START, seen)
    closed = [t for s, t in seen if s == "closed" and t > opened[0]]
    assert closed, (who, "never saw it close", seen)
    assert t0 + OUT_END <= closed[0] <= t0 + OUT_END + RESUME_WITHIN, (
        who, closed[0] - t0 - OUT_END, seen)
    # open once, closed once: no flapping while the outage lasted
    assert [s for s, t in seen if t0 + OUT_START <= t <= closed[0]] == ["open", "closed"], (
        who, seen)


def _check_probe_rate(first: tuple[int, float, float], last: tuple[int, float, float]
                      ) -> None:
    n0, before0, _ = first
    n1, _, after1 = last
    span = after1 - before0
    # one reservation per probe interval, cluster-wide: at most rate * span + 1 starts in
    # the span, plus one in flight at each end
    assert n1 - n0 <= PROBE_RATE * span + 3, (n1 - n0, span)
    assert n1 - n0 >= 1, "no probes: an open circuit could never close"


def _check_week(db_url: str, tokens: dict[str, list[str]], stats: dict[str, Any]) -> None:
    """Every consent done once for the week, but those that failed in the outage before the
    circuit opened (the retry policy puts them 10 minutes later, past this test's window)
    and those a killed worker left started (30 minutes later)."""
    rows, outs, _ = final_rows(db_url)
    assert len(rows) == sum(len(t) for t in tokens.values())
    assert {r.lease_owner for r in rows} == {None}
    done = Counter(o.consent_id for o in outs if o.action == "done")
    assert max(done.values()) == 1
    # what is not done waits for its retry: failed in the outage (retrying), or started by
    # a worker killed mid-call (unknown: the provider may have answered, so not sooner)
    left = [r for r in rows if r.due_week != WEEK + timedelta(days=7)]
    assert {r.week_result for r in left} <= {"retrying", "unknown"}, Counter(
        r.week_result for r in left)
    assert not {r.id for r in left} & set(done)
    retried = {o.consent_id for o in outs if o.action in ("retry_later", "unknown")}
    assert {r.id for r in left} <= retried, (len(left), len(retried))
    for org, toks in tokens.items():
        per_consent = stats["consents"][org]
        assert set(per_consent) <= {consent_key(t) for t in toks}
        assert set(per_consent.values()) == {1}, "a consent transferred twice in the week"
    assert sum(len(c) for c in stats["consents"].values()) >= len(done)


def _dump(outs: list[tuple[bytes, bytes]], t0: float) -> None:
    """MYDATA_TEST_DUMP=<dir>: the workers' summaries and logs, and t0, kept for a look."""
    d = os.environ.get("MYDATA_TEST_DUMP")
    if d:
        Path(d, "t0").write_text(repr(t0))
        for i, (out, err) in enumerate(outs):
            Path(d, f"w{i}.out").write_bytes(out)
            Path(d, f"w{i}.err").write_bytes(err)


def _circuit_report(out: bytes, *, done_only: bool = True) -> dict[str, Any]:
    s = json.loads(out)
    assert s["status"] in (("done",) if done_only else ("done", "incomplete")), s
    report: dict[str, Any] = s["providers"][0]["cluster"]["circuit"]
    return report


def _recorded(db_url: str, org: str) -> list[tuple[str, str]]:
    """(state, source) of the provider's circuit_events, oldest first."""
    async def go() -> list[tuple[str, str]]:
        engine = make_engine(db_url)
        try:
            return [(e.state, e.source) for e in
                    reversed(await recent_events(engine, org_code=org))]
        finally:
            await engine.dispose()

    return asyncio.run(go())


def _leader(redis_url: str) -> str | None:
    raw = redis.Redis.from_url(redis_url).get("mydata:circuit:leader")
    return raw.decode().split(":", 1)[1] if raw else None


def test_an_outage_opens_the_circuit_on_every_worker_probes_only_then_all_resume(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    toml, scenario, bank, clock, tokens, env = _setup(pg_url, tmp_path, monkeypatch)
    with private_redis() as (redis_url, _), SimulatorProcess(
            toml, scenario_path=scenario, window_override=[WINDOW]) as sim:
        t0 = float(sim.stats()["timeline_t0"])
        procs = _workers(pg_url, redis_url, env)
        _sleep_until(clock, t0 + OUT_START + OPEN_WITHIN)  # open everywhere by now
        first = _calls(sim, clock, bank)
        _sleep_until(clock, t0 + OUT_END - 1)
        last = _calls(sim, clock, bank)
        outs = [p.communicate(timeout=120) for p in procs]
        stats = sim.stats(detail=True)
    _dump(outs, t0)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out.decode()[-3000:], err.decode()[-3000:])
        assert _circuit_report(out)["counts_dropped"] == 0
        _check_opened_and_resumed(err, bank, t0, f"w{procs.index(p)}")
    _check_probe_rate(first, last)
    assert stats["providers"][bank]["by_code"].get("50005", 0) > 0  # the outage was seen
    # the coordinator recorded the open and the close (and nothing else) in circuit_events
    assert _recorded(pg_url, bank) == [("open", "coordinator"), ("closed", "coordinator")]
    _check_week(pg_url, tokens, stats)


def test_the_coordinator_killed_during_the_outage_another_takes_over(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    toml, scenario, bank, clock, tokens, env = _setup(pg_url, tmp_path, monkeypatch)
    with private_redis() as (redis_url, _), SimulatorProcess(
            toml, scenario_path=scenario, window_override=[WINDOW]) as sim:
        t0 = float(sim.stats()["timeline_t0"])
        procs = _workers(pg_url, redis_url, env)
        _sleep_until(clock, t0 + OUT_START + OPEN_WITHIN)
        leader = _leader(redis_url)
        assert leader in ("w0", "w1", "w2"), leader
        victim = int(leader[1])
        assert procs[victim].poll() is None
        os.kill(procs[victim].pid, signal.SIGKILL)
        first = _calls(sim, clock, bank)
        _sleep_until(clock, t0 + OUT_END - 1)
        last = _calls(sim, clock, bank)
        successor = _leader(redis_url)  # the lease (4 s) expired long ago: a new leader
        outs = [p.communicate(timeout=120) for p in procs]
        stats = sim.stats(detail=True)
    _dump(outs, t0)
    assert procs[victim].returncode == -signal.SIGKILL
    assert successor is not None and successor != leader, (leader, successor)
    for i, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        if i == victim:
            continue
        # A survivor that ends while the other is still redoing the victim's reaped claims
        # judges those deferred (batch/cluster/view.py counts what is attempted or leased
        # at its end) and says incomplete (1); the day itself is judged below, in the rows.
        assert p.returncode in (0, 1), (out.decode()[-3000:], err.decode()[-3000:])
        _circuit_report(out, done_only=False)
        _check_opened_and_resumed(err, bank, t0, f"w{i}")
    _check_probe_rate(first, last)
    _check_week(pg_url, tokens, stats)
