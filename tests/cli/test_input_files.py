"""Issue 13 items 2, 7 and 9, issue 9 edge 15: the institutions, consents and usage files
are checked in full at load; a refused file is one line and leaves the database as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.console import TOML, cli, load_all, ok, refused, snapshot, write
from tests.sealing import unseal

BANK_END = TOML.index("[[providers]]\norg_code = \"CARD")


def _bank_extra(extra: str) -> str:
    """TOML with ``extra`` lines at the end of the first provider's table."""
    return TOML[:BANK_END] + extra + "\n" + TOML[BANK_END:]


def _line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


@pytest.mark.parametrize(("extra", "needle", "field", "why"), [
    # unknown keys at every level, with the closest known key
    ("read_timout = 5", "read_timout", "providers[0].read_timout",
     "unknown key; did you mean 'read_timeout'?"),
    ("[providers.breaker]\nfailure_rate_treshold = 0.5", "failure_rate_treshold",
     "providers[0].breaker.failure_rate_treshold",
     "unknown key; did you mean 'failure_rate_threshold'?"),
    ("[providers.retry]\nmax_atempts = 2", "max_atempts", "providers[0].retry.max_atempts",
     "unknown key; did you mean 'max_attempts'?"),
    ("[providers.breakr]\nwindow_size = 5", "[providers.breakr]", "providers[0].breakr",
     "unknown key; did you mean 'breaker'?"),
    ("calls_per_consnt = 2", "calls_per_consnt", "providers[0].calls_per_consnt",
     "unknown key; did you mean 'calls_per_consent'?"),
    # values the run or the planner would refuse at night (issue 9 edge 15)
    ("calls_per_consent = -3", "calls_per_consent", "providers[0].calls_per_consent",
     "positive number"),
    ("[providers.breaker]\nfailure_rate_threshold = 2.0", "failure_rate_threshold",
     "providers[0].breaker.failure_rate_threshold", "fraction in (0, 1]"),
    ("[providers.retry]\nmax_attempts = 0", "max_attempts", "providers[0].retry.max_attempts",
     "positive integer"),
])
def test_a_key_or_value_the_run_would_not_take_is_refused_at_load_with_its_line(
        tmp_path: Path, db_url: str, extra: str, needle: str, field: str, why: str) -> None:
    load_all(db_url, tmp_path)
    before = snapshot(db_url)
    text = _bank_extra(extra)
    path = write(tmp_path, "bad.toml", text)
    msg = refused(cli("--db", db_url, "load", "institutions", str(path)),
                  f"{path}:{_line_of(text, needle)}: field {field!r}: ")
    assert why in msg
    assert snapshot(db_url) == before


def test_a_misspelt_required_key_and_a_top_level_typo_are_named(tmp_path: Path,
                                                                 db_url: str) -> None:
    text = TOML.replace("max_concurrency = 20", "max_concurency = 20")
    path = write(tmp_path, "a.toml", text)
    refused(cli("--db", db_url, "load", "institutions", str(path)),
            f"{path}:{_line_of(text, 'max_concurency')}: field 'providers[0].max_concurency'"
            ": unknown key; did you mean 'max_concurrency'?")
    text = TOML.replace('operator_org_code = "OPERATOR01"',
                        'operator_org_code = "OPERATOR01"\noperater = "x"')
    path = write(tmp_path, "b.toml", text)
    refused(cli("--db", db_url, "load", "institutions", str(path)),
            f"{path}:2: field 'operater': unknown key; did you mean 'operator_org_code'?")


def test_a_whole_day_window_loads_and_is_planned(tmp_path: Path, db_url: str) -> None:
    load_all(db_url, tmp_path)
    path = write(tmp_path, "w.toml", TOML.replace('["0000:0600"]', '["0000:2400"]'))
    ok(cli("--db", db_url, "load", "institutions", str(path)))
    rows = json.loads(ok(cli("--db", db_url, "plan", "--format", "json")).stdout)
    card = [r for r in rows if r["org_code"] == "CARD000002" and r["planned"]]
    # 2,000 a minute; 23:59, where the day's run ends, 1,666 (no start in its last 10 s)
    assert {r["capacity"] for r in card[1:]} == {1439 * 2000 + 1666}


# --- item 9: the consents file is read by its header -----------------------------------------

def test_consent_columns_in_any_order_load_the_same(tmp_path: Path, db_url: str) -> None:
    ok(cli("--db", db_url, "load", "institutions", str(write(tmp_path, "i.toml", TOML))))
    shuffled = ("refresh_token,last_scheduled_at,org_code,consented_at,access_token,user_id\n"
                "r1,,BANK000001,2026-01-01T00:00:00+09:00,tok1,u1\n")
    ok(cli("--db", db_url, "load", "consents", str(write(tmp_path, "c.csv", shuffled))))
    rows = snapshot(db_url)["consents"]
    assert [(r[1], r[2].strip(), unseal(r[3], r[2], r[1]),
             unseal(r[4], r[2], r[1], "refresh_token")) for r in rows] == [
        ("u1", "BANK000001", "tok1", "r1")]


def test_an_extra_consent_column_is_refused_unless_told(tmp_path: Path, db_url: str) -> None:
    load_all(db_url, tmp_path)
    before = snapshot(db_url)
    text = ("user_id,org_code,email,access_token,consented_at,last_scheduled_at\n"
            "u9,BANK000001,a@b.example,tok9,2026-01-01T00:00:00+09:00,\n")
    path = write(tmp_path, "extra.csv", text)
    refused(cli("--db", db_url, "load", "consents", str(path)),
            f"{path}:1: field 'email': unexpected header column 3", "--ignore-extra-columns")
    assert snapshot(db_url) == before
    ok(cli("--db", db_url, "load", "consents", "--ignore-extra-columns", str(path)))
    assert len(snapshot(db_url)["consents"]) == len(before["consents"]) + 1


# --- item 7: usage history is checked ---------------------------------------------------------

def test_a_usage_row_dated_in_the_future_is_refused(tmp_path: Path, db_url: str) -> None:
    load_all(db_url, tmp_path)
    before = snapshot(db_url)
    text = "org_code,date,user_calls\nBANK000001,2026-11-30,10\nBANK000001,2026-12-02,10\n"
    path = write(tmp_path, "u.csv", text)
    refused(cli("--db", db_url, "load", "usage", str(path)),
            f"{path}:3: field 'date': 2026-12-02 is in the future (today is 2026-12-01 KST)")
    assert snapshot(db_url) == before


def test_too_little_history_warns_what_the_forecast_falls_back_to(tmp_path: Path,
                                                                  db_url: str) -> None:
    ok(cli("--db", db_url, "load", "institutions", str(write(tmp_path, "i.toml", TOML))))
    res = ok(cli("--db", db_url, "load", "usage", str(write(
        tmp_path, "u.csv", "org_code,date,user_calls\nBANK000001,2026-11-20,10\n"
                           "BANK000001,2026-11-27,12\n"))))
    warnings = res.stderr.strip().splitlines()
    assert warnings == [
        "warning: BANK000001 has 2 day(s) of usage history over 8 day(s); the forecast needs "
        "21 days for a trend: it uses their level, no trend, and the weekday shape pooled "
        "over all providers",
        "warning: CARD000002 has no usage history in the last 182 days: its forecast is 0 "
        "user calls a day (no known user load)"]


def test_the_plan_labels_a_past_day_actual_only_where_usage_rows_exist(
        tmp_path: Path, db_url: str) -> None:
    load_all(db_url, tmp_path)
    ok(cli("--db", db_url, "load", "usage", str(write(
        tmp_path, "u.csv", "org_code,date,user_calls\nBANK000001,2026-11-29,700\n"))))
    out = ok(cli("--db", db_url, "plan")).stdout.splitlines()
    labels = {}
    org = ""
    for line in out:
        if line.startswith(("BANK", "CARD")):
            org = line.split()[0]
        elif line.strip().startswith(("2026-11-29", "2026-11-30")):
            labels[(org, line.split()[0])] = line.split("  ")[-1].strip()
    assert labels == {
        ("BANK000001", "2026-11-29"): "(actual)",
        ("BANK000001", "2026-11-30"): "(past; forecast)",
        ("CARD000002", "2026-11-29"): "(past; forecast)",
        ("CARD000002", "2026-11-30"): "(past; forecast)",
    }
    bank_sunday = next(ln for ln in out if ln.strip().startswith("2026-11-29"))
    assert bank_sunday.split()[2] == "700"  # the actual user calls
