from __future__ import annotations

from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema
from batch.db.engine import init_db


async def test_init_is_idempotent_and_creates_every_table(engine: AsyncEngine) -> None:
    assert await init_db(engine) == schema.SCHEMA_VERSION  # second time: no error

    async with engine.connect() as conn:
        names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
    assert set(schema.metadata.tables) <= names


async def test_sql_file_and_sqlalchemy_tables_have_the_same_columns(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        def columns(c: object) -> dict[str, set[str]]:
            insp = inspect(c)
            return {t: {col["name"] for col in insp.get_columns(t)} for t in schema.metadata.tables}

        found = await conn.run_sync(columns)
    for name, table in schema.metadata.tables.items():
        assert found[name] == {c.name for c in table.columns}, name


async def test_due_index_exists(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        idx = await conn.run_sync(lambda c: {i["name"] for i in inspect(c).get_indexes("consents")})
    assert "consents_due_idx" in idx


async def test_no_index_covers_the_lease_columns_so_claims_stay_hot_updates(
    engine: AsyncEngine,
) -> None:
    async with engine.connect() as conn:
        indexes = await conn.run_sync(lambda c: inspect(c).get_indexes("consents"))
    leased = {"lease_owner", "lease_until", "unknown_attempts"}
    assert not [i["name"] for i in indexes if leased & set(i["column_names"])]


async def test_every_schema_version_is_recorded(engine: AsyncEngine) -> None:
    from sqlalchemy import select

    async with engine.connect() as conn:
        versions = (await conn.execute(select(schema.schema_migrations.c.version))
                    ).scalars().all()
    assert sorted(versions) == list(range(1, schema.SCHEMA_VERSION + 1))


async def test_sqlite_file_from_an_older_version_gets_new_columns(tmp_path: object) -> None:
    import sqlite3
    from pathlib import Path

    from batch.db.engine import make_engine

    path = Path(str(tmp_path)) / "old.db"
    with sqlite3.connect(path) as raw:  # a table as an older version made it: no 'options'
        raw.execute("CREATE TABLE institutions (org_code VARCHAR(10) PRIMARY KEY, "
                    "industry TEXT NOT NULL, base_url TEXT NOT NULL, windows TEXT NOT NULL, "
                    "calls_per_second FLOAT NOT NULL, max_concurrency INTEGER NOT NULL, "
                    "updated_at DATETIME NOT NULL)")
    eng = make_engine(f"sqlite+aiosqlite:///{path}")
    try:
        await init_db(eng)
        async with eng.connect() as conn:
            cols = await conn.run_sync(
                lambda c: {col["name"] for col in inspect(c).get_columns("institutions")})
    finally:
        await eng.dispose()
    assert cols == {c.name for c in schema.institutions.columns}
