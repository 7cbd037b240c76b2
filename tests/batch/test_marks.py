"""Loads are recorded in their own transaction, so a plan made before them is found stale."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import KST
from batch.db.loaders import load_consents, load_institutions
from batch.db.marks import load_generation, loaded_since, mark_loaded
from tests.integration.helpers import free_ports, make_institutions
from tests.sealing import CIPHER

NOW = datetime(2026, 11, 30, 1, 0, tzinfo=KST)


async def test_each_load_of_consents_or_institutions_raises_the_generation(
        engine: AsyncEngine, tmp_path: Path) -> None:
    async with engine.connect() as conn:
        assert await load_generation(conn) == 0
    await load_institutions(engine, make_institutions(free_ports(1), industries=("bank",)),
                            now=NOW)
    csv = tmp_path / "c.csv"
    csv.write_text("user_id,org_code,access_token,consented_at,last_scheduled_at\n"
                   "u1,BANK000000,tok,2026-10-01T10:00:00+09:00,\n")
    await load_consents(engine, csv, now=NOW, cipher=CIPHER)
    async with engine.connect() as conn:
        assert await load_generation(conn) == 2
        assert await loaded_since(conn, 1) == ("consents",)
        assert await loaded_since(conn, 0) == ("consents", "institutions")
    await load_consents(engine, csv, now=NOW, cipher=CIPHER)
    async with engine.connect() as conn:
        assert await load_generation(conn) == 3


async def test_a_refused_load_records_nothing(engine: AsyncEngine, tmp_path: Path) -> None:
    from batch.errors import MydataError

    await load_institutions(engine, make_institutions(free_ports(1), industries=("bank",)),
                            now=NOW)
    bad = tmp_path / "c.csv"
    bad.write_text("user_id,org_code,access_token,consented_at,last_scheduled_at\n"
                   "u1,NOPE000000,tok,2026-10-01T10:00:00+09:00,\n")
    with pytest.raises(MydataError):
        await load_consents(engine, bad, now=NOW, cipher=CIPHER)
    async with engine.connect() as conn:
        assert await loaded_since(conn, 1) == ()


async def test_an_unknown_kind_is_refused(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        with pytest.raises(ValueError, match="unknown load kind"):
            await mark_loaded(conn, "usage", NOW)
