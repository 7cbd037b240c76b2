from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import func, select

from batch.cli import main
from batch.db.engine import make_engine
from batch.db.schema import consents, institutions, usage_daily
from tests.cli.console import TOML

CONSENTS = ("user_id,org_code,access_token,consented_at,last_scheduled_at\n"
            "u1,BANK000001,tok1,2026-01-01T00:00:00+09:00,2026-02-01T00:00:00+09:00\n"
            "u2,CARD000002,tok2,2026-01-01T00:00:00+09:00,\n")
USAGE = "org_code,date,user_calls\nBANK000001,2026-11-01,1200\nCARD000002,2026-11-01,300\n"


def _cli(db_url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--db", db_url, *args])


def _counts(db_url: str) -> tuple[int, int, int]:
    async def go() -> tuple[int, int, int]:
        engine = make_engine(db_url)
        try:
            async with engine.connect() as conn:
                out = []
                for t in (institutions, consents, usage_daily):
                    out.append(int((await conn.execute(
                        select(func.count()).select_from(t))).scalar_one()))
                return out[0], out[1], out[2]
        finally:
            await engine.dispose()

    return asyncio.run(go())


def _files(tmp_path: Path, **override: str) -> dict[str, Path]:
    texts = {"inst": TOML, "cons": CONSENTS, "usage": USAGE} | override
    names = {"inst": "institutions.toml", "cons": "consents.csv", "usage": "usage.csv"}
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, text in texts.items():
        out[key] = tmp_path / names[key]
        out[key].write_text(text, encoding="utf-8")
    return out


def _load_all(db_url: str, files: dict[str, Path]) -> None:
    for kind, key in (("institutions", "inst"), ("consents", "cons"), ("usage", "usage")):
        res = _cli(db_url, "load", kind, str(files[key]))
        assert res.exit_code == 0, res.output + res.stderr


def test_good_files_load_on_a_fresh_database_and_print_counts(db_url: str,
                                                              tmp_path: Path) -> None:
    files = _files(tmp_path)
    res = _cli(db_url, "load", "institutions", str(files["inst"]))
    assert res.exit_code == 0, res.stderr
    assert res.stdout.startswith("loaded 2 institutions from ")
    res = _cli(db_url, "load", "consents", str(files["cons"]))
    assert res.exit_code == 0, res.stderr
    assert res.stdout.startswith("loaded 2 consents from ")
    res = _cli(db_url, "load", "usage", str(files["usage"]))
    assert res.exit_code == 0, res.stderr
    assert res.stdout.startswith("loaded 2 usage rows from ")
    assert _counts(db_url) == (2, 2, 2)


def test_loading_the_same_files_again_upserts(db_url: str, tmp_path: Path) -> None:
    files = _files(tmp_path)
    _load_all(db_url, files)
    _load_all(db_url, files)
    assert _counts(db_url) == (2, 2, 2)


BAD_CASES = [
    # (name, kind, which file, content or None for a missing file, line, field)
    ("missing file", "consents", "cons", None, None, None),
    ("wrong header row", "consents", "cons",
     "user_id,org,access_token,consented_at,last_scheduled_at\n", 1, "org_code"),
    ("bad window string", "institutions", "inst",
     TOML.replace('"0000:0600"', '"0000:0615"'), 15, "providers[1].windows"),
    ("window written without colon", "institutions", "inst",
     TOML.replace('"0000:0600"', '"0000-0600"'), 15, "providers[1].windows"),
    ("duplicate org_code", "institutions", "inst",
     TOML.replace("CARD000002", "BANK000001"), 12, "providers[1].org_code"),
    ("unknown org_code in consents", "consents", "cons",
     CONSENTS.replace("u2,CARD000002", "u2,CARD000009"), 3, "org_code"),
    ("a non-date", "consents", "cons",
     CONSENTS.replace("2026-02-01T00:00:00+09:00", "last tuesday"), 2, "last_scheduled_at"),
    ("a non-date in usage", "usage", "usage", USAGE.replace("2026-11-01,300", "Nov 1,300"),
     3, "date"),
    ("a negative number", "usage", "usage", USAGE.replace("1200", "-1200"), 2, "user_calls"),
]


@pytest.mark.parametrize(("kind", "key", "content", "line", "field"),
                         [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_input_is_one_line_exit_2_and_the_database_is_unchanged(
        db_url: str, tmp_path: Path, kind: str, key: str, content: str | None,
        line: int | None, field: str | None) -> None:
    _load_all(db_url, _files(tmp_path / "good"))
    before = _counts(db_url)
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    path = bad_dir / f"{key}.input"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    res = _cli(db_url, "load", kind, str(path))

    assert res.exit_code == 2
    err = res.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith(f"mydata-batch: error: {path}")
    if line is not None:
        assert err.startswith(f"mydata-batch: error: {path}:{line}: field '{field}': ")
    else:
        assert "no such file" in err
    assert "tok1" not in err and "tok2" not in err
    assert _counts(db_url) == before


def test_help_explains_each_format() -> None:
    for kind, words in (("institutions", "windows"), ("consents", "last_scheduled_at"),
                        ("usage", "org_code,date,user_calls")):
        res = CliRunner().invoke(main, ["load", kind, "--help"])
        assert res.exit_code == 0 and words in res.stdout


def test_a_large_load_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    import os
    import subprocess

    from tests.cli.console import BIN, CLOCK, write
    from tests.integration.helpers import subprocess_env

    db = f"sqlite:///{tmp_path / 'big.db'}"
    rows = "".join(f"u{i},BANK000001,tok{i},2026-01-01T00:00:00+09:00,\n"
                   for i in range(200_000))
    big = write(tmp_path, "big.csv",
                "user_id,org_code,access_token,consented_at,last_scheduled_at\n" + rows)
    env = subprocess_env(MYDATA_CLOCK=CLOCK)
    env.pop("MYDATA_DB_URL", None)
    subprocess.run([str(BIN), "--db", db, "load", "institutions",
                    str(write(tmp_path, "i.toml", TOML))], env=env, check=True,
                   capture_output=True)
    leader, follower = os.openpty()
    proc = subprocess.Popen([str(BIN), "--db", db, "load", "consents", str(big)], env=env,
                            stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=120) == 0
    os.close(leader)
    lines = [ln for ln in out.decode().replace("\r", "\n").splitlines() if ln.strip()]
    assert any(not ln.startswith("loaded ") for ln in lines), lines


def test_a_csv_reports_rows_and_the_share_of_the_file_read_and_ends_at_all(
        tmp_path: Path) -> None:
    from batch.db.csv_input import PROGRESS_EVERY, CsvInput

    f = tmp_path / "x.csv"
    f.write_text("a,b\n" + "".join(f"{i},{i}\n" for i in range(PROGRESS_EVERY * 5 + 7)))
    seen: list[tuple[int, float]] = []
    with CsvInput(f, ["a", "b"], progress=lambda n, frac: seen.append((n, frac))) as src:
        assert sum(1 for _ in src.rows()) == PROGRESS_EVERY * 5 + 7
    assert [n for n, _ in seen] == [PROGRESS_EVERY * k for k in range(1, 6)] + [
        PROGRESS_EVERY * 5 + 7]
    fractions = [frac for _, frac in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and fractions[0] < 1.0


def test_progress_off_a_terminal_says_nothing(tmp_path: Path) -> None:
    import io

    from batch.cli.load import TerminalProgress

    out = io.StringIO()  # cron: not a terminal
    p = TerminalProgress(tmp_path / "big.csv", stream=out)
    p(10_000, 0.5)
    p(20_000, 1.0)
    p.close()
    assert out.getvalue() == ""
