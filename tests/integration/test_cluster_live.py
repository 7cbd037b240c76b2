"""Cluster mode end to end: 3 worker processes (`run --redis`) on one PostgreSQL and a
private Redis, the simulator over HTTP, all on one ScaledClock
(MYDATA_CLOCK: 5x; the strict limit's test and the Redis-stopping one in real time).

- a provider with a strict limit (20 calls/s) never sees more than its limit plus its
  burst in any 1-second window (the simulator's own sliding count), and the simulator's
  token bucket records no rate violation;
- the day's work completes with no consent transferred twice in the week;
- kill -9 of one worker mid-run loses nothing: its claims come back and are done;
- Redis stopped mid-run: the run completes on local limits (rate / live workers) without
  exceeding any provider's rate, and the summaries say so.
"""

from __future__ import annotations

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
from prometheus_client.parser import text_string_to_metric_families

from batch.clock import KST, ScaledClock
from batch.simulator import SimulatorProcess, consent_key
from tests.integration.cluster_helpers import final_rows, private_redis, worker_cmd
from tests.integration.helpers import (
    WEEK,
    free_port_run,
    free_ports,
    institutions_toml,
    make_institutions,
    populate_url,
    subprocess_env,
)

pytestmark = pytest.mark.integration

SPEED = 5.0
CPS = 20
BURST = 1  # the limiter's default burst (batch/resilience/settings.py)
WINDOW = "0100:0103"


def _setup(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, per_provider: int,
           speed: float = SPEED) -> tuple[Path, ScaledClock, dict[str, list[str]],
                                          dict[str, str]]:
    ports = free_ports(2)
    toml = tmp_path / "institutions.toml"
    toml.write_text(institutions_toml(ports, cps=CPS))
    insts = make_institutions(ports, cps=CPS)
    clock = ScaledClock(speed, start=datetime(2026, 11, 30, 0, 59, 45, tzinfo=KST))
    tokens = populate_url(db_url, insts, per_provider=per_provider, now=clock.now())
    monkeypatch.setenv("MYDATA_CLOCK", clock.spec())
    return toml, clock, tokens, subprocess_env()


def _until(clock: ScaledClock, hh: int, mm: int, ss: int) -> float:
    target = datetime(2026, 11, 30, hh, mm, ss, tzinfo=KST)
    return max(0.0, (target - clock.now()).total_seconds() / clock.speed)


def _check_week(db_url: str, tokens: dict[str, list[str]], stats: dict[str, Any]) -> None:
    rows, outs, _ = final_rows(db_url)
    assert len(rows) == sum(len(t) for t in tokens.values())
    # every consent is done for the week, none is left leased
    assert {r.due_week for r in rows} == {WEEK + timedelta(days=7)}
    assert {r.lease_owner for r in rows} == {None}
    done = Counter(o.consent_id for o in outs if o.action == "done")
    assert max(done.values()) == 1
    for org, toks in tokens.items():
        per_consent = stats["consents"][org]
        assert sorted(per_consent) == sorted(consent_key(t) for t in toks)
        assert set(per_consent.values()) == {1}, "a consent transferred twice in the week"


def _check_rate(stats: dict[str, Any]) -> None:
    for org, p in stats["providers"].items():
        # the rule: never more than the limit plus the burst in any 1-second window
        assert p["peak_1s"] <= CPS + BURST, (org, p["peak_1s"])
        assert p["violations"]["window"] == 0, (org, p["violations"])
        # the simulator's token bucket (burst 4) is stricter over 100 ms: a stall of this
        # shared machine may bunch a call or two, never more than 1 in 200
        assert p["violations"]["rate"] <= p["calls"] / 200, (org, p["violations"])


def _workers(db_url: str, redis_url: str, env: dict[str, str], window: str = WINDOW
             ) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(worker_cmd(db_url, redis_url, window, name=f"w{i}"), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for i in range(3)]


def test_three_workers_hold_a_strict_limit_together(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    per_provider = 1500  # more than the window holds at 20 calls/s: the limit binds
    # real time, not 5x: the simulator counts in scaled time, so a scaled clock multiplies
    # the machine's scheduling jitter by its speed. At 20 calls/s one more call in a
    # 1-second window takes a 50 ms stall of a worker or of the simulator itself (it
    # stamps a call when its loop gets to it); at 2x a 25 ms stall was enough, and a
    # loaded CI machine had one (peak 22 for 21)
    _, _, _, env = toml_clock_tokens_env = _setup(pg_url, tmp_path, monkeypatch,
                                                  per_provider, speed=1.0)
    toml = toml_clock_tokens_env[0]
    with private_redis() as (redis_url, _), SimulatorProcess(
            toml, window_override=["0100:0101"]) as sim:
        procs = _workers(pg_url, redis_url, env, "0100:0101")
        outs = [p.communicate(timeout=180) for p in procs]
        stats = sim.stats(detail=True)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode in (0, 1), err.decode()[-2000:]
        assert json.loads(out)["providers"][0]["cluster"]["redis_fallbacks"] == 0
    _check_rate(stats)
    for org, p in stats["providers"].items():
        # binding: the cluster ran close to the limit, not at a third of it
        assert p["peak_1s"] >= CPS - 3, (org, p["peak_1s"])
        assert 0 < p["transfers"] < per_provider
        assert set(stats["consents"][org].values()) == {1}
    rows, outs_db, _ = final_rows(pg_url)
    assert {r.lease_owner for r in rows} == {None}
    done = Counter(o.consent_id for o in outs_db if o.action == "done")
    assert max(done.values()) == 1


@pytest.mark.parametrize("kill_at", [
    (1, 1, 0),  # a minute into the window: its claims come back to a later minute
    # its death is seen in the window's last minute, after the others counted it: they
    # top it up with what comes back (a loaded machine delays the sight just as much)
    (1, 1, 50),
], ids=["mid-window", "last-minute"])
def test_kill_9_of_one_worker_loses_nothing(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kill_at: tuple[int, int, int],
) -> None:
    per_provider = 300
    toml, clock, tokens, env = _setup(pg_url, tmp_path, monkeypatch, per_provider)
    with private_redis() as (redis_url, _), SimulatorProcess(
            toml, window_override=[WINDOW]) as sim:
        procs = _workers(pg_url, redis_url, env)
        # w1 must have joined and taken work before it dies (a loaded machine can start a
        # process slower than the scaled clock runs): else there is nothing to lose
        deadline = time.monotonic() + 60
        while not any(r.lease_owner == "w1" for r in final_rows(pg_url)[0]):
            assert procs[1].poll() is None, procs[1].communicate()
            assert time.monotonic() < deadline, "w1 never claimed anything"
            time.sleep(0.2)
        time.sleep(_until(clock, *kill_at))
        assert procs[1].poll() is None, procs[1].communicate()
        mid = sim.stats()
        os.kill(procs[1].pid, signal.SIGKILL)
        outs = [p.communicate(timeout=180) for p in procs]
        stats = sim.stats(detail=True)
    assert procs[1].returncode == -signal.SIGKILL
    assert 0 < sum(p["transfers"] for p in mid["providers"].values()) < 2 * per_provider
    for i in (0, 2):
        try:
            s = json.loads(outs[i][0])
        except ValueError:
            pytest.fail(f"w{i} printed no summary (exit {procs[i].returncode}): "
                        f"{outs[i][1].decode()[-3000:]}")
        why = [{k: p[k] for k in ("org_code", "planned", "attempted", "deferred",
                                  "dead_lettered", "unplaceable_this_week", "by_outcome",
                                  "by_action") if k in p} for p in s["providers"]]
        assert procs[i].returncode == 0, (why, outs[i][1].decode()[-3000:])
        assert s["status"] == "done", why
    # a survivor saw the death (its heartbeat stopped) and expired its leases
    _, _, nodes = final_rows(pg_url)
    by_worker = {n.worker_id: n for n in nodes}
    assert by_worker["w1"].stopped_at is None and by_worker["w1"].dead_seen_at is not None
    assert by_worker["w0"].stopped_at is not None and by_worker["w2"].stopped_at is not None
    _check_rate(stats)
    _check_week(pg_url, tokens, stats)


def test_three_workers_complete_the_day_and_survive_redis_stopping(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    per_provider = 200
    # real time, as the strict test: with Redis gone each worker paces its share on its own,
    # and the simulator's per-second count multiplies a loaded machine's timer jitter by the
    # clock's speed (at 5x a fresh-clone run saw 23 at 20/s; at 2x, 22: one call 25 ms late
    # in a worker or the simulator). One window minute: 200 consents a provider, three calls
    # each, are 10 calls/s of the 20; Redis gone a third of the way in, 40 s of local limits
    toml, clock, tokens, env = _setup(pg_url, tmp_path, monkeypatch, per_provider, speed=1.0)
    with private_redis() as (redis_url, server), SimulatorProcess(
            toml, window_override=["0100:0101"]) as sim:
        procs = _workers(pg_url, redis_url, env, "0100:0101")
        time.sleep(_until(clock, 1, 0, 20))
        server.terminate()  # our private Redis, gone mid-run
        server.wait(10)
        outs = [p.communicate(timeout=180) for p in procs]
        stats = sim.stats(detail=True)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err.decode()[-2000:]
        s = json.loads(out)
        assert s["status"] == "done"
        assert s["providers"][0]["cluster"]["redis_fallbacks"] >= 1
        assert b"shared_limit_lost" in err or b"REDIS LOST" in err
    _check_rate(stats)
    _check_week(pg_url, tokens, stats)


def test_processes_starts_n_workers_under_one_parent_and_merges_their_summaries(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    per_provider = 120
    toml, _, tokens, env = _setup(pg_url, tmp_path, monkeypatch, per_provider)
    with private_redis() as (redis_url, _), SimulatorProcess(
            toml, window_override=[WINDOW]) as sim:
        # each worker its own port (P+i) and textfile (m-p{i}.prom): the same ones made the
        # second worker fail to listen, and the workers overwrite one another's file
        port = free_port_run(3)
        cmd = worker_cmd(pg_url, redis_url, WINDOW, name="box", extra=(
            "--metrics-port", str(port), "--metrics-textfile", str(tmp_path / "m.prom")))
        parent = subprocess.run([*cmd, "--processes", "3"], env=env, capture_output=True,
                                timeout=180)
        stats = sim.stats(detail=True)
    assert parent.returncode == 0, parent.stderr.decode()[-2000:]
    merged = json.loads(parent.stdout)
    assert not (tmp_path / "m.prom").exists()
    calls = 0.0
    for i in range(3):
        samples = [s for f in text_string_to_metric_families(
            (tmp_path / f"m-p{i}.prom").read_text()) for s in f.samples]
        assert samples and all(s.labels["process"] == str(i) for s in samples)
        calls += sum(s.value for s in samples if s.name == "mydata_calls_total")
    assert calls == sum(p["calls"] for p in merged["providers"]) > 0
    assert merged["status"] == "done" and merged["worker_id"] == "box"
    assert len(merged["run_id"].split("+")) == 3
    for p in merged["providers"]:
        assert p["planned"] == per_provider  # the shared plan, not three times it
        assert p["attempted"] == per_provider
        assert sorted(w["node_id"] for w in p["workers"]) == sorted(
            {w["node_id"] for w in p["workers"]})
        assert len(p["workers"]) == 3
    _, _, nodes = final_rows(pg_url)
    assert sorted(n.worker_id for n in nodes) == ["box-p0", "box-p1", "box-p2"]
    assert all(n.stopped_at is not None for n in nodes)
    _check_rate(stats)
    _check_week(pg_url, tokens, stats)
