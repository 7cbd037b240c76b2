"""``mydata-batch dashboard`` writes one self-contained file."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from batch.cli import main
from tests.dashboard.conftest import ACCESS, BANK, Tables, Week


def test_cli_writes_the_page_and_prints_its_path(week: Week, db_url: str,
                                                 tmp_path: Path) -> None:
    out = tmp_path / "week.html"
    result = CliRunner().invoke(
        main, ["--db", db_url, "dashboard", "--week", "2026-12-02", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(out)
    page = out.read_text(encoding="utf-8")
    assert Tables(page).row(f"load-{BANK}", "Batch planned", "consents")[:3] == [
        "9,000", "8,000", "7,000"]
    assert ACCESS not in page
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, nothing left behind


def test_cli_on_an_empty_database_writes_the_helpful_page(sqlite_url: str,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "dashboard.html"
    result = CliRunner().invoke(main, ["--db", sqlite_url, "dashboard", "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8")
    assert "No plan saved for this week" in page and "mydata-batch plan --save" in page


def test_cli_rejects_a_week_that_is_not_a_date(sqlite_url: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--db", sqlite_url, "dashboard", "--week", "monday",
                                       "--out", str(tmp_path / "x.html")])
    assert result.exit_code == 2
    assert "monday" in result.output
    assert not (tmp_path / "x.html").exists()


def test_cli_help_names_the_options() -> None:
    result = CliRunner().invoke(main, ["dashboard", "--help"])
    assert result.exit_code == 0
    for option in ("--week", "--out", "--serve", "--host", "--port", "127.0.0.1"):
        assert option in result.output


def test_cli_reports_an_unwritable_out_file_in_one_line(sqlite_url: str,
                                                        tmp_path: Path) -> None:
    out = tmp_path / "missing-dir" / "dashboard.html"
    result = CliRunner().invoke(main, ["--db", sqlite_url, "dashboard", "--out", str(out)])
    assert result.exit_code == 2
    assert result.output.strip() == (f"mydata-batch: error: {out}: cannot write the page: "
                                     "No such file or directory")
