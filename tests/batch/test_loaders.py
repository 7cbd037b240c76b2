from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import KST
from batch.config import parse_institutions
from batch.crypto import TokenColumn, TokenKeyError
from batch.db import loaders
from batch.db.loaders import load_consents, load_institutions, load_usage, read_institutions
from batch.db.schema import consents, institutions, settings, usage_daily
from batch.errors import ConfigError, InputError
from planning.calendar import next_due_week
from tests.sealing import CIPHER, unseal

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=KST)  # a Wednesday; its week starts 2026-11-22
TOML = """\
operator_org_code = "OPERATOR01"
[[providers]]
org_code = "BANK000001"
industry = "bank"
base_url = "http://127.0.0.1:9001"
windows = ["0030:0530", "2200:2400"]
calls_per_second = 50
max_concurrency = 20
read_timeout = 12.5
contact = "ops@bank.example"

[[providers]]
org_code = "CARD000002"
industry = "card"
base_url = "http://127.0.0.1:9002"
windows = ["0000:0600"]
calls_per_second = 120
max_concurrency = 40
"""
HEADER = "user_id,org_code,access_token,consented_at,last_scheduled_at,refresh_token\n"
GOOD_CONSENTS = HEADER + (
    "u1,BANK000001,tokA1,2026-01-01T00:00:00+09:00,2026-11-18T03:00:00+09:00,refA1\n"
    "u1,CARD000002,tokC1,2026-02-01T10:00:00,,\n"
    "u2,BANK000001,tokA2,2026-11-23T15:00:00Z,2026-11-24T01:00:00+09:00,refA2\n"
)


async def _count(engine: AsyncEngine, table: object) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())  # type: ignore[arg-type]


async def _counts(engine: AsyncEngine) -> tuple[int, int, int, int]:
    return (await _count(engine, institutions), await _count(engine, settings),
            await _count(engine, consents), await _count(engine, usage_daily))


async def _with_institutions(engine: AsyncEngine) -> None:
    await load_institutions(engine, parse_institutions(TOML), now=NOW)


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


async def _rows(engine: AsyncEngine) -> dict[tuple[str, str], dict[str, object]]:
    async with engine.connect() as conn:
        res = (await conn.execute(select(consents))).mappings().all()
    return {(r["user_id"], r["org_code"].strip()): dict(r) for r in res}


# --- institutions --------------------------------------------------------------------------

async def test_institutions_read_back_equal_to_what_was_loaded(engine: AsyncEngine) -> None:
    insts = parse_institutions(TOML)
    assert await load_institutions(engine, insts, now=NOW) == 2

    back = await read_institutions(engine)

    assert back == insts
    assert back.by_code()["BANK000001"].read_timeout == 12.5
    assert dict(back.by_code()["BANK000001"].extra) == {"contact": "ops@bank.example"}


async def test_reloading_institutions_updates_limits_and_operator(engine: AsyncEngine) -> None:
    await _with_institutions(engine)
    changed = TOML.replace("OPERATOR01", "OPERATOR02").replace("calls_per_second = 50",
                                                               "calls_per_second = 75")
    await load_institutions(engine, parse_institutions(changed), now=NOW,
                            change_operator=True)

    back = await read_institutions(engine)
    assert back.operator_org_code == "OPERATOR02"
    assert back.by_code()["BANK000001"].calls_per_second == 75
    assert await _count(engine, institutions) == 2


async def test_reading_institutions_from_an_empty_database_says_what_to_do(
        engine: AsyncEngine) -> None:
    with pytest.raises(ConfigError, match="load institutions"):
        await read_institutions(engine)


# --- consents ------------------------------------------------------------------------------

async def test_consents_load_with_due_week_and_not_before(engine: AsyncEngine,
                                                          tmp_path: Path) -> None:
    await _with_institutions(engine)
    n = await load_consents(engine,
                            _write(tmp_path, "c.csv", GOOD_CONSENTS), now=NOW, cipher=CIPHER)
    assert n == 3

    rows = await _rows(engine)
    a1 = rows[("u1", "BANK000001")]
    assert _opened(a1["access_token"]) == "tokA1"
    assert _opened(a1["refresh_token"], column="refresh_token") == "refA1"
    # each token is bound to its own row and column: not another consent's, not the other
    with pytest.raises(TokenKeyError, match="does not belong to this row"):
        # u1's token at CARD000002, opened as u1's at BANK000001
        _opened(rows[("u1", "CARD000002")]["access_token"])
    with pytest.raises(TokenKeyError, match="does not belong to this row"):
        _opened(a1["access_token"], column="refresh_token")
    assert a1["due_week"] == date(2026, 11, 22)        # fetched last week: due this week
    assert a1["not_before"] == datetime(2026, 11, 22, tzinfo=KST)
    assert a1["status"] == "active"
    c1 = rows[("u1", "CARD000002")]                    # never fetched, naive means KST
    assert c1["consented_at"] == datetime(2026, 2, 1, 10, 0, tzinfo=KST)
    assert c1["last_scheduled_at"] is None and c1["refresh_token"] is None
    assert c1["due_week"] == date(2026, 2, 1)           # the week of its consent: backlog
    assert c1["not_before"] == datetime(2026, 2, 1, 10, 0, tzinfo=KST)
    a2 = rows[("u2", "BANK000001")]                    # consented and fetched this week
    assert a2["due_week"] == date(2026, 11, 29)
    assert a2["not_before"] == datetime(2026, 11, 29, tzinfo=KST)
    assert a2["consented_at"] == datetime(2026, 11, 23, 15, 0, tzinfo=UTC)


async def test_due_week_matches_next_due_week_for_every_row(engine: AsyncEngine,
                                                            tmp_path: Path) -> None:
    await _with_institutions(engine)
    lines = [HEADER]
    base = datetime(2026, 1, 1, tzinfo=KST)
    for i in range(200):
        c = base + timedelta(hours=31 * i)
        fetched = c + timedelta(hours=7 * (i % 40) + 1)
        last = "" if i % 3 == 0 else (fetched.astimezone(UTC) if i % 2 else fetched).isoformat()
        lines.append(f"u{i},BANK000001,t,{c.isoformat()},{last},\n")
    await load_consents(engine, _write(tmp_path, "c.csv", "".join(lines)), now=NOW, cipher=CIPHER)

    for r in (await _rows(engine)).values():
        assert r["due_week"] == next_due_week(r["last_scheduled_at"],  # type: ignore[arg-type]
                                              r["consented_at"])  # type: ignore[arg-type]


async def test_new_consents_are_written_in_the_order_they_are_claimed(
        engine: AsyncEngine, tmp_path: Path) -> None:
    """A file that mixes providers is inserted provider by provider, by due week, in the
    file's order: ids (and, on PostgreSQL, the rows' places in the table) follow the claim's
    keyset order, so a claim's rows share pages instead of taking one page each."""
    await _with_institutions(engine)
    lines, expected = [HEADER], []
    for i in range(60):
        org = ("BANK000001", "CARD000002")[i % 2 if i < 40 else 0]
        consented = "2026-02-01T10:00:00" if i % 3 == 0 else "2026-01-01T00:00:00"
        last = "" if i % 3 == 0 else "2026-11-18T03:00:00"  # backlog: due 2026-02-01
        lines.append(f"u{i},{org},t{i},{consented},{last},\n")
        expected.append((org, date(2026, 2, 1) if i % 3 == 0 else date(2026, 11, 22), i))
    await load_consents(engine, _write(tmp_path, "c.csv", "".join(lines)), now=NOW,
                        cipher=CIPHER)
    async with engine.connect() as conn:
        got = [(str(r.org_code).strip(), r.due_week if isinstance(r.due_week, date)
                else date.fromisoformat(r.due_week), int(r.user_id[1:]))
               for r in await conn.execute(select(consents).order_by(consents.c.id))]
        if engine.dialect.name == "postgresql":
            by_place = [int(r[0][1:]) for r in await conn.exec_driver_sql(
                "SELECT user_id FROM consents ORDER BY ctid")]
            assert by_place == [u for _, _, u in got]
    assert got == sorted(expected)
    # a later file's new consents follow, in the same order among themselves
    more = HEADER + "".join(f"v{i},{('CARD000002', 'BANK000001')[i % 2]},t,"
                            "2026-01-01T00:00:00,2026-11-18T03:00:00,\n" for i in range(6))
    await load_consents(engine, _write(tmp_path, "d.csv", more), now=NOW, cipher=CIPHER)
    async with engine.connect() as conn:
        tail = [(str(r.org_code).strip(), r.user_id) for r in await conn.execute(
            select(consents).order_by(consents.c.id).offset(60))]
    assert tail == [("BANK000001", "v1"), ("BANK000001", "v3"), ("BANK000001", "v5"),
                    ("CARD000002", "v0"), ("CARD000002", "v2"), ("CARD000002", "v4")]


async def test_reloading_consents_upserts_tokens_without_duplicating(engine: AsyncEngine,
                                                                     tmp_path: Path) -> None:
    await _with_institutions(engine)
    await load_consents(engine, _write(tmp_path, "c.csv", GOOD_CONSENTS), now=NOW, cipher=CIPHER)
    again = GOOD_CONSENTS.replace("tokA1", "tokA1-new").replace(
        "u1,CARD000002,tokC1,2026-02-01T10:00:00,,",
        "u1,CARD000002,tokC1,2026-02-01T10:00:00,2026-11-23T02:00:00+09:00,")
    later = NOW + timedelta(hours=1)
    assert await load_consents(engine,
                               _write(tmp_path, "c2.csv", again), now=later, cipher=CIPHER) == 3

    rows = await _rows(engine)
    assert len(rows) == 3
    assert _opened(rows[("u1", "BANK000001")]["access_token"]) == "tokA1-new"
    assert rows[("u1", "BANK000001")]["updated_at"] == later
    assert rows[("u1", "CARD000002")]["due_week"] == date(2026, 11, 29)  # fetched this week


async def test_reloading_an_older_file_never_moves_the_schedule_back(
        engine: AsyncEngine, tmp_path: Path) -> None:
    await _with_institutions(engine)
    newer = HEADER + "u1,BANK000001,t2,2026-01-01T00:00:00,2026-11-23T03:00:00,\n"
    older = HEADER + "u1,BANK000001,t1,2026-01-01T00:00:00,2026-11-16T03:00:00,r1\n"
    await load_consents(engine, _write(tmp_path, "new.csv", newer), now=NOW, cipher=CIPHER)
    await load_consents(engine, _write(tmp_path, "old.csv", older), now=NOW, cipher=CIPHER)

    row = (await _rows(engine))[("u1", "BANK000001")]
    assert row["due_week"] == date(2026, 11, 29)
    assert row["last_scheduled_at"] == datetime(2026, 11, 23, 3, 0, tzinfo=KST)
    assert _opened(row["access_token"]) == "t1"
    assert _opened(row["refresh_token"], column="refresh_token") == "r1"


def _opened(stored: object, user_id: str = "u1", org_code: str = "BANK000001",
            column: TokenColumn = "access_token") -> str:
    """A stored token, which must be sealed (v2, bound to its row and column) with the
    session's key, opened."""
    assert isinstance(stored, str) and stored.startswith(f"v2.{CIPHER.primary_id}."), stored
    return unseal(stored, org_code, user_id, column)


def _bad(body: str) -> str:
    return HEADER + "u0,BANK000001,SECRETTOKEN,2026-01-01T00:00:00,,\n" + body


BAD_CONSENTS = [
    # (name, file content, line, field, words in the message)
    ("wrong header", "user,org_code,access_token,consented_at,last_scheduled_at\n",
     1, "user_id", "header"),
    ("header missing a column", "user_id,org_code,access_token,consented_at\n",
     1, "last_scheduled_at", "missing"),
    ("unknown org_code", _bad("u1,NOPE000001,SECRETTOKEN,2026-01-01T00:00:00,,\n"),
     3, "org_code", "'NOPE000001' is not a known provider"),
    ("not a date", _bad("u1,BANK000001,SECRETTOKEN,yesterday,,\n"), 3, "consented_at",
     "'yesterday' is not an ISO 8601 timestamp"),
    ("bad month", _bad("u1,BANK000001,SECRETTOKEN,2026-01-01,2026-13-01T00:00:00,\n"), 3,
     "last_scheduled_at", "'2026-13-01T00:00:00'"),
    ("empty user", _bad(",BANK000001,SECRETTOKEN,2026-01-01T00:00:00,,\n"), 3, "user_id", "empty"),
    ("empty token", _bad("u1,BANK000001,,2026-01-01T00:00:00,,\n"), 3, "access_token",
     "empty"),
    ("too few fields", _bad("u1,BANK000001,SECRETTOKEN\n"), 3, "consented_at", "missing"),
    ("extra field", _bad("u1,BANK000001,SECRETTOKEN,2026-01-01T00:00:00,,r,x\n"), 3, "column 7",
     "extra"),
    ("fetched before consent", _bad("u1,BANK000001,SECRETTOKEN,2026-05-01T00:00:00,"
                                    "2026-04-01T00:00:00,\n"), 3, "last_scheduled_at",
     "before consented_at"),
    ("fetched in the future", _bad("u1,BANK000001,SECRETTOKEN,2026-05-01T00:00:00,"
                                   "2026-12-01T00:00:00,\n"), 3, "last_scheduled_at",
     "future"),
    ("consented in the future", _bad("u1,BANK000001,SECRETTOKEN,2027-05-01T00:00:00,,\n"), 3,
     "consented_at", "future"),
    ("duplicate", _bad("u1,BANK000001,SECRETTOKEN,2026-01-01T00:00:00,,\n"
                       "u2,BANK000001,SECRETTOKEN,2026-01-01T00:00:00,,\n"
                       "u1,BANK000001,SECRETTOKEN,2026-02-01T00:00:00,,\n"), 5, "user_id",
     "first on line 3"),
]


@pytest.mark.parametrize(("content", "line", "field", "words"),
                         [c[1:] for c in BAD_CONSENTS], ids=[c[0] for c in BAD_CONSENTS])
async def test_bad_consents_name_file_line_field_and_write_nothing(
        engine: AsyncEngine, tmp_path: Path, content: str, line: int, field: str,
        words: str) -> None:
    await _with_institutions(engine)
    await load_consents(engine, _write(tmp_path, "ok.csv", GOOD_CONSENTS), now=NOW, cipher=CIPHER)
    before = await _rows(engine)
    path = _write(tmp_path, "bad.csv", content)

    with pytest.raises(InputError) as err:
        await load_consents(engine, path, now=NOW, cipher=CIPHER)

    msg = str(err.value)
    assert msg.startswith(f"{path}:{line}: field '{field}': ")
    assert words in msg
    assert "\n" not in msg
    assert "SECRETTOKEN" not in msg  # tokens are never echoed
    assert await _rows(engine) == before


@pytest.mark.parametrize(("name", "content", "words"), [
    ("missing.csv", None, "no such file"),
    ("empty.csv", "", "is empty"),
    ("latin1.csv", HEADER.encode() + "u1,BANK000001,t\xe9,2026-01-01,,\n".encode("latin-1"),
     "not UTF-8"),
])
async def test_unreadable_consent_files_give_one_clear_line(
        engine: AsyncEngine, tmp_path: Path, name: str, content: str | bytes | None,
        words: str) -> None:
    await _with_institutions(engine)
    path = tmp_path / name if content is None else _write(tmp_path, name, content)

    with pytest.raises(InputError) as err:
        await load_consents(engine, path, now=NOW, cipher=CIPHER)

    assert str(err.value).startswith(str(path))
    assert words in str(err.value) and "\n" not in str(err.value)
    if name == "latin1.csv":
        assert err.value.line == 2
    assert await _count(engine, consents) == 0


async def test_error_in_a_late_chunk_rolls_back_earlier_chunks(
        engine: AsyncEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    await _with_institutions(engine)
    monkeypatch.setattr(loaders, "CHUNK_ROWS", 7)
    body = "".join(f"u{i},BANK000001,t,2026-01-01T00:00:00,,\n" for i in range(40))
    path = _write(tmp_path, "c.csv", HEADER + body + "u99,BANK000001,t,soon,,\n")

    with pytest.raises(InputError) as err:
        await load_consents(engine, path, now=NOW, cipher=CIPHER)

    assert err.value.line == 42
    assert await _count(engine, consents) == 0


async def test_duplicate_across_chunks_is_found(engine: AsyncEngine, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    await _with_institutions(engine)
    monkeypatch.setattr(loaders, "CHUNK_ROWS", 5)
    body = "".join(f"u{i % 12},BANK000001,t,2026-01-01T00:00:00,,\n" for i in range(20))

    with pytest.raises(InputError) as err:
        await load_consents(engine,
                            _write(tmp_path, "c.csv", HEADER + body), now=NOW, cipher=CIPHER)

    assert (err.value.line, err.value.field) == (14, "user_id")
    assert await _count(engine, consents) == 0


async def test_header_only_file_loads_nothing(engine: AsyncEngine, tmp_path: Path) -> None:
    await _with_institutions(engine)
    assert await load_consents(engine,
                               _write(tmp_path, "c.csv", HEADER), now=NOW, cipher=CIPHER) == 0


async def test_consents_without_institutions_name_the_unknown_org(engine: AsyncEngine,
                                                                  tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a known provider"):
        await load_consents(engine,
                            _write(tmp_path, "c.csv", GOOD_CONSENTS), now=NOW, cipher=CIPHER)


# --- usage ---------------------------------------------------------------------------------

USAGE = "org_code,date,user_calls\nBANK000001,2026-11-01,1200\nCARD000002,2026-11-01,0\n"


async def test_usage_loads_and_reloading_upserts(engine: AsyncEngine, tmp_path: Path) -> None:
    await _with_institutions(engine)
    assert await load_usage(engine, _write(tmp_path, "u.csv", USAGE), now=NOW) == 2
    await load_usage(engine, _write(tmp_path, "u2.csv", USAGE.replace("1200", "1300")), now=NOW)

    async with engine.connect() as conn:
        rows = (await conn.execute(select(usage_daily.c.org_code, usage_daily.c.day,
                                          usage_daily.c.user_calls)
                                   .order_by(usage_daily.c.org_code))).all()
    assert [(o.strip(), d, c) for o, d, c in rows] == [
        ("BANK000001", date(2026, 11, 1), 1300), ("CARD000002", date(2026, 11, 1), 0)]


@pytest.mark.parametrize(("row", "field", "words"), [
    ("BANK000001,2026-11-02,-5", "user_calls", "'-5' is not a non-negative whole number"),
    ("BANK000001,2026-11-02,12.5", "user_calls", "non-negative whole number"),
    ("BANK000001,02/11/2026,5", "date", "is not a date"),
    ("BANK000001,2026-02-30,5", "date", "is not a date"),
    ("NOPE000001,2026-11-02,5", "org_code", "not a known provider"),
    ("BANK000001,2026-11-01,5", "date", "duplicate"),
])
async def test_bad_usage_rows_name_file_line_field_and_write_nothing(
        engine: AsyncEngine, tmp_path: Path, row: str, field: str, words: str) -> None:
    await _with_institutions(engine)
    path = _write(tmp_path, "u.csv", USAGE + row + "\n")

    with pytest.raises(InputError) as err:
        await load_usage(engine, path, now=NOW)

    assert str(err.value).startswith(f"{path}:4: field '{field}': ")
    assert words in str(err.value)
    assert await _count(engine, usage_daily) == 0


async def test_wrong_usage_header_is_refused(engine: AsyncEngine, tmp_path: Path) -> None:
    await _with_institutions(engine)
    path = _write(tmp_path, "u.csv", "org,date,calls\nBANK000001,2026-11-01,1\n")
    with pytest.raises(InputError) as err:
        await load_usage(engine, path, now=NOW)
    assert str(err.value).startswith(f"{path}:1: field 'org_code': header column 'org_code' "
                                     "is missing")
    assert await _counts(engine) == (2, 1, 0, 0)


async def test_reloading_revives_a_dead_consent_only_for_a_newer_consent(
        engine: AsyncEngine, tmp_path: Path) -> None:
    await _with_institutions(engine)
    first = HEADER + "u1,BANK000001,t,2026-01-01T00:00:00,,\n"
    await load_consents(engine, _write(tmp_path, "a.csv", first), now=NOW, cipher=CIPHER)
    async with engine.begin() as conn:
        await conn.execute(consents.update().values(status="dead"))

    await load_consents(engine, _write(tmp_path, "b.csv", first), now=NOW, cipher=CIPHER)
    assert (await _rows(engine))[("u1", "BANK000001")]["status"] == "dead"

    newer = first.replace("2026-01-01T00:00:00", "2026-11-24T00:00:00")
    await load_consents(engine, _write(tmp_path, "c.csv", newer), now=NOW, cipher=CIPHER)
    assert (await _rows(engine))[("u1", "BANK000001")]["status"] == "active"
