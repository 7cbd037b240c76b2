"""The simulator out of process: the CLI command and the SimulatorProcess wrapper."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from batch.cli import main
from batch.simulator import SimulatorProcess
from tests.simulator.conftest import institutions_toml, tran_id


def _get(url: str, token: str, api_type: str = "scheduled") -> str:
    req = urllib.request.Request(url, headers={
        "x-api-tran-id": tran_id(), "x-api-type": api_type, "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            body: bytes = resp.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    return body.decode()


def test_simulator_process_serves_counts_resets_and_prints_a_summary(tmp_path: Path) -> None:
    inst = tmp_path / "inst.toml"
    inst.write_text(institutions_toml())
    scen = tmp_path / "scen.toml"
    scen.write_text("[defaults]\nlatency_median_ms = 0\n")
    with SimulatorProcess(inst, scenario_path=scen, window_override=["0000:2359"],
                          seed=3) as sim:
        assert sim.pid is not None
        bank = sim.urls["BANK000001"]
        assert '"00000"' in _get(f"{bank}/v1/bank/accounts?limit=5", "tok")
        assert '"42901"' in _get(f"{bank}/v1/bank/accounts?limit=5", "tok")
        assert '"00000"' in _get(f"{sim.urls['CARD000001']}/v1/card/cards", "tok")
        s = sim.stats(detail=True)
        assert s["providers"]["BANK000001"]["calls"] == 2
        assert s["providers"]["BANK000001"]["violations"]["second_transfer"] == 1
        assert s["total"]["calls"] == 3
        assert len(s["consents"]["CARD000001"]) == 1
        sim.reset()
        assert sim.stats()["total"]["calls"] == 0
        assert '"00000"' in _get(f"{bank}/v1/bank/accounts?limit=5", "tok")
    out = sim.output
    assert f"BANK000001 bank {bank}" in out
    assert "total: calls=1 " in out


async def test_simulator_process_works_as_an_async_context(tmp_path: Path) -> None:
    inst = tmp_path / "inst.toml"
    inst.write_text(institutions_toml())
    async with SimulatorProcess(inst) as sim:
        s = await sim.stats_async()
        assert set(s["providers"]) == {"BANK000001", "CARD000001", "INVEST0001"}
        await sim.reset_async()


@pytest.mark.parametrize(("extra", "words"), [
    (["--scenario", "{tmp}/bad.toml"], "field 'defaults.latency_p99_ms'"),
    (["--window-override", "25:00"], "field '--window-override'"),
    (["--scenario", "{tmp}/none.toml"], "no such file"),
])
def test_simulate_cli_reports_bad_input_in_one_line_and_exits_2(
        tmp_path: Path, extra: list[str], words: str) -> None:
    inst = tmp_path / "inst.toml"
    inst.write_text(institutions_toml())
    (tmp_path / "bad.toml").write_text("[defaults]\nlatency_median_ms = 9\nlatency_p99_ms = 1\n")
    args = ["simulate", "--institutions", str(inst), *(a.format(tmp=tmp_path) for a in extra)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert words in lines[0]


def test_python_dash_m_batch_cli_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "batch.cli", "simulate", "--help"],
                         capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert "--window-override" in out.stdout


def test_simulator_process_that_cannot_start_says_why(tmp_path: Path) -> None:
    from batch.simulator.process import SimulatorStartError

    inst = tmp_path / "inst.toml"
    inst.write_text(institutions_toml())
    bad = tmp_path / "bad.toml"
    bad.write_text("[defaults]\nburst = 0\n")
    with pytest.raises(SimulatorStartError, match=r"exited with 2: .*defaults\.burst"):
        SimulatorProcess(inst, scenario_path=bad).start()
