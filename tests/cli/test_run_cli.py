"""`run` at the command line: bad input is one line and exit 2; with no saved plan it plans."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from batch.cli import main
from batch.clock import KST, ScaledClock
from batch.simulator import Simulator
from tests.integration.helpers import free_ports, institutions_toml, make_institutions


@pytest.mark.parametrize("args, message", [
    (["run", "--window-override", "2500:0100"], "not a time of day"),
    (["run", "--window-override", "0100-0200"], "hhmm:hhmm"),
    (["--redis", "redis://127.0.0.1:1/0", "run"], "Redis at redis://127.0.0.1:1/0 is unreachable"),
    (["run", "--processes", "2"], "--processes needs cluster mode"),
    (["--redis", "redis://127.0.0.1:6379/0", "run", "--processes", "3", "--metrics-port",
      "65534"], "worker 2 of --processes would listen on 65536, past 65535"),
    (["run", "--heartbeat-seconds", "20", "--dead-after-seconds", "10"], "shorter than"),
    (["run"], "no institutions in the database"),
])
def test_bad_run_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str],
                                               message: str) -> None:
    (tmp_path / "m.db").touch()  # an existing (empty) file: `run` refuses a missing one
    res = CliRunner().invoke(main, ["--db", str(tmp_path / "m.db"), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output


def test_unknown_only_provider_is_refused(tmp_path: Path) -> None:
    toml = tmp_path / "i.toml"
    toml.write_text(institutions_toml(free_ports(1), industries=("bank",)))
    db = ["--db", str(tmp_path / "m.db")]
    assert CliRunner().invoke(main, [*db, "load", "institutions", str(toml)]).exit_code == 0
    res = CliRunner().invoke(main, [*db, "run", "--only", "NOPE000000"])
    assert res.exit_code == 2 and "unknown org_code(s) for --only: NOPE000000" in res.output


@pytest.mark.integration
def test_run_with_no_saved_plan_plans_the_week_first_and_prints_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = ScaledClock(20, start=datetime(2026, 11, 30, 0, 59, 50, tzinfo=KST))
    monkeypatch.setenv("MYDATA_CLOCK", clock.spec())
    ports = free_ports(1)
    toml = tmp_path / "i.toml"
    toml.write_text(institutions_toml(ports, industries=("bank",)))
    csv = tmp_path / "c.csv"
    csv.write_text("user_id,org_code,access_token,consented_at,last_scheduled_at\n" + "".join(
        f"u{i},BANK000000,tok{i:04d},2026-10-01T10:00:00+09:00,2026-11-24T02:00:00+09:00\n"
        for i in range(40)))
    db = ["--db", str(tmp_path / "m.db")]
    runner = CliRunner()
    assert runner.invoke(main, [*db, "load", "institutions", str(toml)]).exit_code == 0
    assert runner.invoke(main, [*db, "load", "consents", str(csv)]).exit_code == 0

    async def serve_and_run() -> None:
        async with Simulator(make_institutions(ports, industries=("bank",)), clock=clock):
            res = await asyncio.to_thread(runner.invoke, main, [
                *db, "run", "--window-override", "0100:0102", "--json", "--progress", "none"])
            assert res.exit_code == 0, res.output
            summary = json.loads(res.stdout.strip().splitlines()[-1])
            assert {"run_id", "date", "providers"} <= set(summary)
            (p,) = summary["providers"]
            for key in ("org_code", "planned", "attempted", "succeeded", "failed", "deferred",
                        "dead_lettered"):
                assert key in p
            assert p["planned"] > 0 and p["attempted"] == p["planned"]

    asyncio.run(serve_and_run())


@pytest.mark.integration
def test_run_processes_refuses_what_every_worker_would_before_starting_any(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # each worker printed its own line (two alike), then the parent a traceback (exit 1)
    (tmp_path / "m.db").touch()
    args = ["--db", str(tmp_path / "m.db"), "--redis", redis_url, "run", "--processes", "2"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1 and "has no mydata-batch schema" in res.output
    monkeypatch.setenv("MYDATA_TOKEN_KEYS", "")
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and res.output.startswith(
        "mydata-batch: error: no token encryption key"), res.output


@pytest.mark.parametrize("codes, code", [([2, 2], 2), ([-9, -9], 1), ([3, -9], 1)])
def test_when_no_worker_process_printed_a_summary_the_parent_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    codes: list[int], code: int,
) -> None:
    import batch.cluster.processes as processes
    from batch.cli.run import _run_processes

    def none_printed(*_a: object, **_k: object) -> None:
        raise processes.NoSummaries(codes)

    monkeypatch.setattr(processes, "run_children", none_printed)
    with pytest.raises(SystemExit) as exc:
        _run_processes(2, "box", False, "sqlite:///unused.db", "INFO")
    assert exc.value.code == code
    assert capsys.readouterr().err == (
        f"mydata-batch: error: no worker process printed a summary (exit codes {codes})\n")
