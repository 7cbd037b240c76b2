"""`mydata-batch circuit`: each provider's cluster state, why and since when; forced open,
closed and back to automatic, with the reason recorded; user errors are one line, exit 2."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner

from batch.cli import main
from batch.cluster.circuit_events import recent_events
from batch.db.engine import make_engine
from tests.integration.helpers import free_ports, institutions_toml


def _setup(tmp_path: Path) -> list[str]:
    toml = tmp_path / "i.toml"
    toml.write_text(institutions_toml(free_ports(2)))
    db = ["--db", str(tmp_path / "m.db")]
    assert CliRunner().invoke(main, [*db, "load", "institutions", str(toml)]).exit_code == 0
    return db


def test_lists_every_provider_then_forces_and_releases_with_reasons(
        tmp_path: Path, redis_url: str) -> None:
    db = [*_setup(tmp_path), "--redis", redis_url]
    cli = CliRunner()
    res = cli.invoke(main, [*db, "circuit", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [(p["org_code"], p["state"]) for p in doc["providers"]] == [
        ("BANK000000", "closed"), ("CARD000001", "closed")]
    assert doc["coordinator"] is None
    res = cli.invoke(main, [*db, "circuit", "open", "BANK000000", "--reason",
                            "provider maintenance", "--by", "kim"])
    assert res.exit_code == 0, res.output
    assert "BANK000000: forced open (provider maintenance)" in res.output
    res = cli.invoke(main, [*db, "circuit"])
    assert res.exit_code == 0
    line = next(ln for ln in res.output.splitlines() if ln.startswith("BANK000000"))
    assert "forced_open" in line and "forced by kim: provider maintenance" in line
    assert "since 20" in line
    res = cli.invoke(main, [*db, "circuit", "auto", "BANK000000", "--reason", "over"])
    assert res.exit_code == 0 and "back to automatic" in res.output
    doc = json.loads(cli.invoke(main, [*db, "circuit", "--json"]).output)
    assert doc["providers"][0]["state"] == "closed"

    async def events() -> list[tuple[str, str, str, str]]:
        engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'm.db'}")
        try:
            return [(e.state, e.reason, e.source, e.actor)
                    for e in await recent_events(engine, org_code="BANK000000")]
        finally:
            await engine.dispose()

    got = asyncio.run(events())
    assert got[0][:3] == ("auto", "over", "operator")
    assert got[1] == ("forced_open", "provider maintenance", "operator", "kim")


def test_user_errors_are_one_line_and_exit_2(tmp_path: Path, redis_url: str) -> None:
    db = _setup(tmp_path)
    cli = CliRunner()
    res = cli.invoke(main, [*db, "circuit"])
    assert res.exit_code == 2 and "give --redis URL" in res.output
    res = cli.invoke(main, [*db, "--redis", redis_url, "circuit", "open", "NOPE000000",
                            "--reason", "x"])
    assert res.exit_code == 2 and "unknown org_code 'NOPE000000'" in res.output
    res = cli.invoke(main, [*db, "--redis", redis_url, "circuit", "close", "BANK000000"])
    assert res.exit_code == 2 and "--reason" in res.output
    dead = f"redis://127.0.0.1:{free_ports(1)[0]}/0"
    res = cli.invoke(main, [*db, "--redis", dead, "circuit"])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("mydata-batch: error: Redis unreachable")
    assert len(res.output.strip().splitlines()) == 1
    assert "Traceback" not in res.output
