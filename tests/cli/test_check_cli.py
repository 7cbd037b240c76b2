"""``mydata-batch check``: exit 1 with one line per breach, 2 on bad thresholds."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from batch.cli import main
from tests.cli.console import cli, refused


def test_a_database_that_never_ran_breaches_no_success(sqlite_url: str) -> None:
    assert CliRunner().invoke(main, ["--db", sqlite_url, "db", "init"]).exit_code == 0
    out = CliRunner().invoke(main, ["--db", sqlite_url, "check"])
    assert out.exit_code == 1, out.output
    assert out.output.splitlines() == ["BREACH no_success_hours value=inf threshold=26"]


def test_an_unknown_threshold_key_is_one_line_and_exit_2(sqlite_url: str,
                                                         tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    f.write_text("[providers.BANK000001]\nretry_ration = 0.2\n")
    out = CliRunner().invoke(main, ["--db", sqlite_url, "check", "--thresholds", str(f)])
    assert out.exit_code == 2, out.output
    assert "t.toml:2: field 'providers.BANK000001.retry_ration': unknown key; did you mean " \
        "'retry_ratio'?" in out.output
    assert "Traceback" not in out.output


def test_check_is_registered() -> None:
    out = CliRunner().invoke(main, ["--help"])
    assert "check" in out.output


def test_run_offers_the_metrics_port_and_textfile() -> None:
    out = CliRunner().invoke(main, ["run", "--help"])
    assert "--metrics-port" in out.output and "--metrics-textfile" in out.output


def test_a_database_without_the_schema_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    db.touch()
    res = cli("--db", str(db), "check")
    import sqlite3

    with sqlite3.connect(db) as conn:  # no table created by a monitoring probe
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []
    refused(res, "has no mydata-batch schema", "mydata-batch db init")


def test_a_run_id_that_names_no_run_is_refused(sqlite_url: str) -> None:
    assert CliRunner().invoke(main, ["--db", sqlite_url, "db", "init"]).exit_code == 0
    refused(cli("--db", sqlite_url, "check", "--run-id", "nosuchrun"),
            "no run 'nosuchrun' in this database")
