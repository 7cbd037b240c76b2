"""Revoked consents are never called: revoke from the CLI, then run the day over real HTTP
against the simulator, on SQLite and PostgreSQL."""

from __future__ import annotations

import io
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from batch.clock import KST, ScaledClock
from batch.db import schema
from batch.db.engine import init_db, make_engine
from batch.dispatch.runner import RunOptions, run_day
from batch.simulator import Simulator, consent_key
from planning.windows import parse_window
from tests.cli.console import cli, ok, write
from tests.integration.helpers import free_ports, make_institutions, populate
from tests.sealing import CIPHER

pytestmark = pytest.mark.integration
PER_PROVIDER = 30
REVOKED = 10  # per provider: the first REVOKED users


async def test_revoked_consents_get_no_call_and_keep_no_token(tmp_path: Path,
                                                              db_url: str) -> None:
    start = datetime(2026, 11, 30, 0, 59, 57, tzinfo=KST)
    insts = make_institutions(free_ports(2), cps=50)
    bank, card = (p.org_code for p in insts.providers)
    # by file for one provider, by id for the other
    write(tmp_path, "w.csv", "user_id,org_code\n" + "".join(
        f"user{i},{bank}\n" for i in range(REVOKED)))
    engine = make_engine(db_url)
    try:
        await init_db(engine)
        tokens = await populate(engine, insts, per_provider=PER_PROVIDER, now=start)
        async with engine.connect() as conn:
            card_ids = (await conn.execute(
                select(schema.consents.c.id).where(
                    schema.consents.c.org_code == card,
                    schema.consents.c.user_id.in_([f"user{i}" for i in range(REVOKED)]))
            )).scalars().all()
        args = [a for i in card_ids for a in ("--id", str(i))]
        res = ok(cli("--db", db_url, "revoke", str(tmp_path / "w.csv"), *args))
        assert res.stdout.startswith(f"revoked {2 * REVOKED} consent(s)")

        clock = ScaledClock(10, start=start)
        window = parse_window("0100:0102", step=1)
        async with Simulator(insts, clock=clock, window_override=[window]) as sim:
            result = await run_day(engine, cipher=CIPHER, clock=clock, options=RunOptions(
                window_override=(window,), progress="none",
                lease=timedelta(minutes=5)), stream=io.StringIO(), install_signals=False)
            stats = sim.stats(detail=True)

        # the saved plan counted the revoked consents in today's quota: that part is no
        # longer due, not deferred, and the run is done
        assert result.exit_code == 0, result.summary
        for p in result.summary.providers:
            assert (p.counters["deferred"], p.extra["no_longer_due"]) == (0, REVOKED), p
        for org, toks in tokens.items():
            called = set(stats["consents"].get(org, {}))
            revoked = {consent_key(t) for t in toks[:REVOKED]}
            kept = {consent_key(t) for t in toks[REVOKED:]}
            assert called & revoked == set(), org
            assert called == kept, org  # the run did reach the others
        async with engine.connect() as conn:
            rows = (await conn.execute(select(
                schema.consents.c.user_id, schema.consents.c.status,
                schema.consents.c.access_token, schema.consents.c.refresh_token))).all()
        gone = [r for r in rows if int(r.user_id[4:]) < REVOKED]
        assert len(gone) == 2 * REVOKED
        assert {(r.status, r.access_token, r.refresh_token) for r in gone} == {
            ("revoked", "", None)}
        every_token = {t for toks in tokens.values() for t in toks[:REVOKED]}
        async with engine.connect() as conn:
            stored = set((await conn.execute(select(schema.consents.c.access_token)
                                             )).scalars().all())
            stored |= set((await conn.execute(select(schema.consents.c.refresh_token)
                                              )).scalars().all())
        assert not stored & (every_token | {f"r{t}" for t in every_token})
    finally:
        await engine.dispose()
