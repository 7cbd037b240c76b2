"""Issue 13 items 1, 4 and 10: every command's database and usage mistakes are one line,
exit 2, with the next step; --db/--redis work on either side of the command."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.cli.console import TOML, cli, load_all, ok, refused, snapshot, write
from tests.conftest import PG_ADMIN_URL
from tests.integration.helpers import free_ports

PG_BASE = PG_ADMIN_URL.rsplit("/", 1)[0]


def _commands(tmp: Path) -> list[list[str]]:
    inst = write(tmp, "inst.toml", TOML)
    return [["db", "init"], ["load", "institutions", str(inst)], ["run"], ["requeue", "--all"],
            ["seed", "--consents", "5", "--providers", "1", "--out", str(tmp / "seed")],
            ["plan"], ["dashboard", "--out", str(tmp / "d.html")], ["revoke", "--id", "1"]]


def test_a_postgres_database_that_does_not_exist_says_createdb_in_every_command(
        tmp_path: Path, pg_url: str) -> None:
    name = f"mydata_nope_{uuid.uuid4().hex[:8]}"
    for args in _commands(tmp_path):
        msg = refused(cli("--db", f"{PG_BASE}/{name}", *args), f'database "{name}" does not '
                      "exist", f"createdb -h 127.0.0.1 -p 5432 -U postgres {name}",
                      "mydata-batch db init")
        assert "Background on this error" not in msg


def test_a_role_that_does_not_exist_says_createuser(tmp_path: Path, pg_url: str) -> None:
    url = pg_url.replace("postgres@", "nobody_here@")
    for args in _commands(tmp_path):
        refused(cli("--db", url, *args), 'role "nobody_here" does not exist',
                "createuser -h 127.0.0.1 -p 5432 nobody_here")


def test_an_unreachable_server_says_so_with_pg_isready(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    for args in _commands(tmp_path):
        refused(cli("--db", f"postgresql://postgres@127.0.0.1:{port}/x", *args),
                f"cannot reach the server at 127.0.0.1:{port}", "pg_isready")


def test_a_postgres_database_without_the_schema_says_db_init(tmp_path: Path,
                                                             pg_url: str) -> None:
    for args in (["plan"], ["requeue", "--list"], ["revoke", "--id", "1"]):
        refused(cli("--db", pg_url, *args), "has no mydata-batch schema",
                "mydata-batch db init")
    ok(cli("--db", pg_url, "db", "init"))


def test_an_sqlite_file_that_does_not_exist_is_not_created_by_a_reading_command(
        tmp_path: Path) -> None:
    db = tmp_path / "mydta.db"  # the typo
    for args in _commands(tmp_path)[2:]:
        if args[0] == "seed":
            continue
        refused(cli("--db", f"sqlite:///{db}", *args), "does not exist",
                "mydata-batch db init")
        assert not db.exists(), args
    # a bare file name is an SQLite file too, and the default is ./mydata.db
    refused(cli("plan", cwd=tmp_path), "'mydata.db' does not exist")
    assert not (tmp_path / "mydata.db").exists()
    ok(cli("--db", str(db), "db", "init"))
    assert db.exists()


def test_an_sqlite_path_in_a_directory_that_does_not_exist_is_refused_everywhere(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/no-such-dir/mydata.db"
    for args in _commands(tmp_path):
        refused(cli("--db", url, *args), "no-such-dir", "does not exist")
    assert not (tmp_path / "no-such-dir").exists()


def test_an_sqlite_file_without_the_schema_says_db_init(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    db.touch()
    for args in (["plan"], ["requeue", "--list"], ["revoke", "--id", "1"]):
        refused(cli("--db", str(db), *args), "has no mydata-batch schema", "db init")


# --- item 4: --db and --redis where people type them -----------------------------------------

def test_db_works_before_or_after_the_command_and_from_the_environment(
        tmp_path: Path, db_url: str) -> None:
    ok(cli("db", "init", "--db", db_url))
    ok(cli("load", "institutions", "--db", db_url, str(write(tmp_path, "i.toml", TOML))))
    ok(cli("load", "--db", db_url, "consents", str(write(
        tmp_path, "c.csv", "user_id,org_code,access_token,consented_at,last_scheduled_at\n"
        "u1,BANK000001,tok1,2026-01-01T00:00:00+09:00,\n"))))
    after = json.loads(ok(cli("plan", "--format", "json", "--db", db_url)).stdout)
    env = json.loads(ok(cli("plan", "--format", "json", MYDATA_DB_URL=db_url)).stdout)
    before = json.loads(ok(cli("--db", db_url, "plan", "--format", "json")).stdout)
    assert after == env == before
    assert sum(r["batch_quota"] for r in after if r["org_code"] == "BANK000001") == 1
    # the value after the command wins over the one before it (and over the environment)
    refused(cli("--db", db_url, "plan", "--db", f"sqlite:///{tmp_path}/typo.db",
                MYDATA_DB_URL=db_url), "typo.db' does not exist")


def test_redis_after_the_command_reaches_run(tmp_path: Path, db_url: str) -> None:
    load_all(db_url, tmp_path)
    before = snapshot(db_url)
    # an unreachable Redis: cluster mode refuses to start, one line, nothing written
    refused(cli("--db", db_url, "run", "--redis", "redis://127.0.0.1:1/0"),
            "cluster mode: Redis at")
    assert snapshot(db_url) == before


# --- item 10: click's own checks speak the same one-line style --------------------------------

@pytest.mark.parametrize(("args", "needle"), [
    (["run", "--window-override", "2500:0100"], "not a time of day"),
    (["run", "--page-limit", "0"], "--page-limit"),
    (["load", "consents"], "Missing argument 'FILE'"),
    (["plan", "--bogus"], "No such option '--bogus'"),
    (["lod"], "No such command 'lod'"),
    (["requeue", "--list", "--all"], "--list"),
    (["requeue"], "--org ORG_CODE, --id N or --all"),
    (["revoke"], "FILE.csv"),
])
def test_click_usage_errors_are_one_line_without_the_usage_block(
        tmp_path: Path, args: list[str], needle: str) -> None:
    (tmp_path / "m.db").touch()
    msg = refused(cli("--db", str(tmp_path / "m.db"), *args), needle)
    assert "Usage:" not in msg


def test_db_help_says_only_what_exists() -> None:
    out = ok(cli("db", "--help")).stdout
    assert "init" in out and "inspect" not in out
    commands = out.split("Commands:", 1)[1].split()
    assert commands[0] == "init" and "Create" in commands


def test_a_refused_load_into_a_mistyped_sqlite_path_leaves_no_file(tmp_path: Path) -> None:
    db = tmp_path / "mydta.db"  # the typo
    consents = write(tmp_path, "c.csv", "user_id,org_code,access_token,consented_at,"
                     "last_scheduled_at\nu1,BANK000001,tok1,2026-01-01T00:00:00+09:00,\n")
    refused(cli("--db", f"sqlite:///{db}", "load", "consents", str(consents)))
    assert not db.exists()
