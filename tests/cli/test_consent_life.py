"""Issue 13 items 5 and 6, issue 9 edge 1: revoke, retire, the operator code, a careful seed
and a requeue that never makes a consent fetched this week due again."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta
from pathlib import Path

from sqlalchemy import insert, select, update

from batch.clock import KST
from batch.db import schema
from tests.cli.console import (
    NOW,
    TOML,
    cli,
    load_all,
    ok,
    query,
    refused,
    snapshot,
    write,
)
from tests.sealing import unseal

WEEK = date(2026, 11, 29)
c = schema.consents.c


def _ids(db: str) -> dict[str, int]:
    return {r.user_id: r.id for r in query(db, select(c.id, c.user_id))}


# --- revoke -----------------------------------------------------------------------------------

def test_revoke_by_file_and_by_id_erases_tokens_and_stops_the_consent(tmp_path: Path,
                                                                       db_url: str) -> None:
    load_all(db_url, tmp_path)
    ids = _ids(db_url)
    path = write(tmp_path, "withdrawn.csv", "org_code,user_id\nBANK000001,u1\n")
    res = ok(cli("--db", db_url, "revoke", str(path), "--id", str(ids["u2"])))
    assert res.stdout.strip() == "revoked 2 consent(s), their tokens erased"
    rows = {r.user_id: r for r in query(db_url, select(
        c.user_id, c.status, c.access_token, c.refresh_token))}
    assert {u: (r.status, r.access_token, r.refresh_token) for u, r in rows.items()
            if u != "u3"} == {"u1": ("revoked", "", None), "u2": ("revoked", "", None)}
    u3 = rows["u3"]  # untouched: still stored sealed
    assert (u3.status, unseal(u3.access_token, "BANK000001", "u3"),
            unseal(u3.refresh_token, "BANK000001", "u3", "refresh_token")) == (
        "active", "tok3", "r3")
    # re-loading the old consents file does not bring the tokens back
    ok(cli("--db", db_url, "load", "consents", str(tmp_path / "consents.csv")))
    rows = {r.user_id: r for r in query(db_url, select(
        c.user_id, c.status, c.access_token, c.refresh_token))}
    assert (rows["u1"].status, rows["u1"].access_token, rows["u1"].refresh_token) == (
        "revoked", "", None)
    # the plan no longer counts them
    plan = json.loads(ok(cli("--db", db_url, "plan", "--format", "json")).stdout)
    assert sum(r["batch_quota"] for r in plan) == 1


def test_revoke_naming_nothing_is_one_line_per_name_and_changes_nothing(
        tmp_path: Path, db_url: str) -> None:
    load_all(db_url, tmp_path)
    before = snapshot(db_url)
    path = write(tmp_path, "w.csv", "user_id,org_code\nu1,BANK000001\nghost,BANK000001\n")
    msg = refused(cli("--db", db_url, "revoke", str(path), "--id", "9999"), lines=3)
    assert msg.splitlines() == [
        "mydata-batch: error: consent id 9999: no such consent",
        f"mydata-batch: error: {path}:3: no consent of user 'ghost' at BANK000001",
        "mydata-batch: error: nothing revoked (2 name no consent)"]
    assert snapshot(db_url) == before


# --- retire a provider, change the operator code ---------------------------------------------

def test_a_file_without_a_provider_is_refused_unless_it_retires_it(tmp_path: Path,
                                                                   db_url: str) -> None:
    load_all(db_url, tmp_path)
    before = snapshot(db_url)
    only_bank = write(tmp_path, "bank.toml", TOML.split("\n[[providers]]\norg_code = \"CARD")[0])
    refused(cli("--db", db_url, "load", "institutions", str(only_bank)),
            "no longer lists provider(s) CARD000002", "--retire-missing")
    assert snapshot(db_url) == before

    res = ok(cli("--db", db_url, "load", "institutions", "--retire-missing", str(only_bank)))
    assert "retired 1 provider(s): CARD000002" in res.stdout
    plan = json.loads(ok(cli("--db", db_url, "plan", "--format", "json")).stdout)
    assert {r["org_code"] for r in plan} == {"BANK000001"}
    # `run` reads the same providers: the retired one is not there to run
    refused(cli("--db", db_url, "run", "--only", "CARD000002"),
            "unknown org_code(s) for --only: CARD000002")
    # listed again, it is back
    ok(cli("--db", db_url, "load", "institutions", str(write(tmp_path, "inst.toml", TOML))))
    plan = json.loads(ok(cli("--db", db_url, "plan", "--format", "json")).stdout)
    assert {r["org_code"] for r in plan} == {"BANK000001", "CARD000002"}


def test_a_changed_operator_org_code_needs_its_flag(tmp_path: Path, db_url: str) -> None:
    load_all(db_url, tmp_path)
    before = snapshot(db_url)
    path = write(tmp_path, "op.toml", TOML.replace("OPERATOR01", "OPERATOR02"))
    refused(cli("--db", db_url, "load", "institutions", str(path)),
            "from OPERATOR01 to OPERATOR02", "every transaction id",
            "--change-operator-org-code")
    assert snapshot(db_url) == before
    ok(cli("--db", db_url, "load", "institutions", "--change-operator-org-code", str(path)))
    assert ("operator_org_code", "OPERATOR02") in snapshot(db_url)["settings"]


# --- seed and requeue: safe by default ---------------------------------------------------------

def test_seed_refuses_a_database_that_holds_consents(tmp_path: Path, db_url: str) -> None:
    load_all(db_url, tmp_path)
    before = snapshot(db_url)
    args = ["--db", db_url, "seed", "--consents", "20", "--providers", "1", "--out",
            str(tmp_path / "seed")]
    refused(cli(*args), "already holds 3 consents", "--force")
    assert snapshot(db_url) == before
    ok(cli(*args, "--force"))
    assert len(snapshot(db_url)["consents"]) == 23


def _dead_letter(db: str, consent_id: int, **consent: object) -> int:
    query(db, update(schema.consents).where(c.id == consent_id).values(**consent))
    query(db, insert(schema.dead_letters).values(
        consent_id=consent_id, org_code="BANK000001", week_start=WEEK, attempts=5,
        last_error="E", entered_at=NOW - timedelta(hours=5)))
    return int(query(db, select(schema.dead_letters.c.id).where(
        schema.dead_letters.c.consent_id == consent_id))[0][0])


def test_requeue_refuses_what_was_fetched_this_week_and_live_leases(
        tmp_path: Path, db_url: str) -> None:
    load_all(db_url, tmp_path)
    ids = _ids(db_url)
    fetched = _dead_letter(db_url, ids["u1"], due_week=WEEK + timedelta(7),
                           last_scheduled_at=datetime(2026, 11, 30, 3, 0, tzinfo=KST))
    leased = _dead_letter(db_url, ids["u3"], due_week=WEEK, attempts=5,
                          lease_owner="w1", lease_until=NOW + timedelta(minutes=9))
    stuck = _dead_letter(db_url, ids["u2"], due_week=WEEK, attempts=5,
                         not_before=NOW + timedelta(days=9))
    before = snapshot(db_url)

    res = ok(cli("--db", db_url, "requeue", "--all"))
    assert res.stdout.strip() == "requeued 1 consent(s), refused 2"
    assert res.stderr.strip().splitlines() == [
        f"refused: dead letter {fetched} (consent {ids['u1']}): fetched this week "
        "(2026-11-30 03:00 KST); not due again before next week",
        f"refused: dead letter {leased} (consent {ids['u3']}): leased by worker w1 until "
        "12:09:00 KST (a run is working on it); try again after the run"]
    after = {r.id: r for r in query(db_url, select(schema.consents))}
    old = {r[0]: r for r in before["consents"]}
    assert tuple(after[ids["u1"]]) == old[ids["u1"]]  # untouched
    assert tuple(after[ids["u3"]]) == old[ids["u3"]]  # the lease is the worker's still
    assert (after[ids["u2"]].attempts, after[ids["u2"]].due_week) == (0, WEEK)
    open_ = {r.id for r in query(db_url, select(schema.dead_letters.c.id).where(
        schema.dead_letters.c.requeued_at.is_(None)))}
    assert open_ == {fetched, leased} and stuck not in open_


def test_requeue_naming_nothing_is_an_error_and_changes_nothing(tmp_path: Path,
                                                                db_url: str) -> None:
    load_all(db_url, tmp_path)
    before = snapshot(db_url)
    refused(cli("--db", db_url, "requeue", "--id", "41"), "no dead letter with id 41")
    refused(cli("--db", db_url, "requeue", "--org", "NOPE000001"),
            "no provider 'NOPE000001'")
    refused(cli("--db", db_url, "requeue", "--all", "--org", "BANK000001"), "--all")
    assert snapshot(db_url) == before
    assert ok(cli("--db", db_url, "requeue", "--org", "BANK000001")).stdout.strip() == (
        "no open dead letters of BANK000001; nothing requeued")


# --- a plan made before the files were loaded again -------------------------------------------

def test_a_plan_saved_before_consents_are_loaded_again_is_stale_and_the_run_remakes_it(
        tmp_path: Path, db_url: str) -> None:
    load_all(db_url, tmp_path)
    ok(cli("--db", db_url, "plan", "--save"))
    assert "stale" not in ok(cli("--db", db_url, "plan")).stderr
    ok(cli("--db", db_url, "load", "consents", str(tmp_path / "consents.csv")))
    res = ok(cli("--db", db_url, "plan"))
    stale = [ln for ln in res.stderr.splitlines() if "stale" in ln]
    assert len(stale) == 1 and "consents loaded again" in stale[0], res.stderr
    # 12:00 KST: CARD000002's window (00:00-06:00) is over, so the run plans and ends
    run = cli("--db", db_url, "run", "--only", "CARD000002", "--json", "--progress", "none")
    assert run.returncode in (0, 1) and "Traceback" not in run.stderr, run.stderr
    summary = json.loads(run.stdout)
    assert summary["replanned"] == "consents loaded again since the plan was made"
    assert "stale" not in ok(cli("--db", db_url, "plan")).stderr  # the run saved a new one
