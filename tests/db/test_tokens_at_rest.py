"""Tokens at rest, on SQLite and PostgreSQL: every write seals, every claim opens, a wrong
key is refused before anything is written, rotation re-seals, revocation erases."""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import KST
from batch.config import parse_institutions
from batch.crypto import TokenCipher, TokenKeyError, TokenSlot, generate_key, stored_key_id
from batch.db import schema, work
from batch.db.loaders import load_consents, load_institutions
from batch.db.revocation import revoke
from batch.db.tokens import check_tokens, reseal_all
from batch.db.work import SqlWorkStore
from batch.lifecycle import TokenRefreshed
from tests.sealing import CIPHER, KEY, seal_v1, unseal

ORG = "BANK000001"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=KST)
WEEK = date(2026, 11, 29)
TOML = f"""operator_org_code = "OPERATOR01"
[[providers]]
org_code = "{ORG}"
industry = "bank"
base_url = "http://127.0.0.1:9"
windows = ["0000:0600"]
calls_per_second = 10
max_concurrency = 5
"""
HEADER = "user_id,org_code,access_token,consented_at,last_scheduled_at,refresh_token\n"
ROWS = "".join(f"u{i},{ORG},plainAT{i:03d},2026-01-01T00:00:00+09:00,,plainRT{i:03d}\n"
               for i in range(1, 4))


async def _load(engine: AsyncEngine, tmp_path: Path, body: str = ROWS,
                cipher: TokenCipher = CIPHER, name: str = "c.csv") -> int:
    path = tmp_path / name
    path.write_text(HEADER + body, encoding="utf-8")
    return await load_consents(engine, path, now=NOW, cipher=cipher)


async def _stored(engine: AsyncEngine) -> list[tuple[Any, ...]]:
    c = schema.consents.c
    async with engine.connect() as conn:
        return [tuple(r) for r in (await conn.execute(
            select(c.id, c.access_token, c.refresh_token).order_by(c.id))).all()]


@pytest.fixture
async def loaded(engine: AsyncEngine, tmp_path: Path) -> AsyncEngine:
    await load_institutions(engine, parse_institutions(TOML), now=NOW)
    assert await _load(engine, tmp_path) == 3
    return engine


async def _claim_all(store: SqlWorkStore, worker: str = "w1") -> list[work.Claim]:
    """Claim everything and open each claim's tokens, as its refresh would."""
    claims = await store.claim(ORG, worker=worker, week=WEEK, now=NOW, limit=10)
    for c in claims:  # handed out as stored: sealed
        assert c.access_token.startswith(("v1.", "v2.")) or c.access_token == "legacyAT"
    return [replace(c, access_token=store.open_access(c), refresh_token=store.open_refresh(c))
            for c in claims]


async def test_loaded_tokens_are_stored_sealed_and_a_claim_hands_them_out_opened(
    loaded: AsyncEngine,
) -> None:
    for _id, access, refresh in await _stored(loaded):
        assert stored_key_id(access) == stored_key_id(refresh) == CIPHER.primary_id
        assert "plain" not in access + refresh
    claims = await _claim_all(SqlWorkStore(loaded, CIPHER))
    assert [(c.access_token, c.refresh_token) for c in claims] == [
        (f"plainAT{i:03d}", f"plainRT{i:03d}") for i in (1, 2, 3)]


async def test_a_refreshed_pair_is_stored_sealed_saved_alone_or_with_an_outcome_write(
    loaded: AsyncEngine,
) -> None:
    store = SqlWorkStore(loaded, CIPHER)
    await _claim_all(store)
    await store.save_token(TokenRefreshed(1, ORG, "u1", "simA-new-1", "simR-new-1"))
    await store.apply([TokenRefreshed(2, ORG, "u2", "simA-new-2", None)], run_id="r",
                      worker="w1", day=NOW.date())
    stored = {i: (a, r) for i, a, r in await _stored(loaded)}
    for i in (1, 2):
        assert "simA" not in stored[i][0] and "simR" not in (stored[i][1] or "")
        assert stored[i][0].startswith(f"v2.{CIPHER.primary_id}.")
    # sealed bound to the consent and column they were saved for
    assert unseal(stored[1][0], ORG, "u1") == "simA-new-1"
    assert unseal(stored[1][1], ORG, "u1", "refresh_token") == "simR-new-1"
    assert unseal(stored[2][0], ORG, "u2") == "simA-new-2"
    assert unseal(stored[2][1], ORG, "u2", "refresh_token") == "plainRT002"  # kept
    with pytest.raises(TokenKeyError, match="does not belong to this row"):
        unseal(stored[1][0], ORG, "u2")
    await store.release([1, 2, 3], worker="w1")
    again = {c.id: c for c in await _claim_all(store, "w2")}
    assert (again[1].access_token, again[1].refresh_token) == ("simA-new-1", "simR-new-1")


async def test_a_load_with_a_key_that_does_not_open_the_stored_tokens_writes_nothing(
    loaded: AsyncEngine, tmp_path: Path,
) -> None:
    before = await _stored(loaded)
    other = TokenCipher.from_texts([generate_key()])
    with pytest.raises(TokenKeyError, match=rf"sealed with key\(s\) {CIPHER.primary_id}") as e:
        await _load(loaded, tmp_path, f"u9,{ORG},new,2026-01-01T00:00:00,,\n", cipher=other,
                    name="more.csv")
    assert "\n" not in str(e.value)
    assert await _stored(loaded) == before


async def test_a_load_into_a_database_holding_plain_text_tokens_says_to_rotate_them(
    loaded: AsyncEngine, tmp_path: Path,
) -> None:
    async with loaded.begin() as conn:  # as a version before encryption at rest left it
        await conn.execute(update(schema.consents).where(schema.consents.c.id == 2)
                           .values(access_token="legacy-plain"))
    with pytest.raises(TokenKeyError, match="keys rotate"):
        await _load(loaded, tmp_path, name="again.csv")
    with pytest.raises(TokenKeyError, match="not encrypted"):
        await check_tokens(loaded, CIPHER)


async def test_a_corrupt_stored_token_is_caught_before_the_run_calls_anyone(
    loaded: AsyncEngine,
) -> None:
    (first, access, _r), *_ = await _stored(loaded)
    flipped = access[:-3] + ("A" if access[-3] != "A" else "B") + access[-2:]
    async with loaded.begin() as conn:
        await conn.execute(update(schema.consents).where(schema.consents.c.id == first)
                           .values(access_token=flipped))
    with pytest.raises(TokenKeyError, match="does not open"):
        await check_tokens(loaded, CIPHER)


async def test_rotation_reseals_every_token_with_the_first_key_and_seals_legacy_ones(
    loaded: AsyncEngine,
) -> None:
    async with loaded.begin() as conn:  # a legacy row, stored in plain text
        await conn.execute(insert(schema.consents).values(
            user_id="legacy", org_code=ORG, access_token="legacyAT", refresh_token=None,
            consented_at=NOW - timedelta(days=9), due_week=WEEK,
            not_before=NOW - timedelta(days=9), updated_at=NOW))
    new = generate_key()
    only_new = TokenCipher.from_texts([new])
    with pytest.raises(TokenKeyError):  # the old key is needed to open what is stored
        await reseal_all(loaded, only_new)
    done = await reseal_all(loaded, TokenCipher.from_texts([new, KEY]))
    assert (done.seen, done.resealed, done.skipped) == (4, 4, 0)
    for _id, access, refresh in await _stored(loaded):
        assert stored_key_id(access) == only_new.primary_id
        assert refresh is None or stored_key_id(refresh) == only_new.primary_id
    await check_tokens(loaded, only_new)
    with pytest.raises(TokenKeyError, match="does not hold"):
        await check_tokens(loaded, CIPHER)  # the old key alone no longer opens them
    claims = await _claim_all(SqlWorkStore(loaded, only_new))
    assert sorted(c.access_token for c in claims) == [
        "legacyAT", "plainAT001", "plainAT002", "plainAT003"]
    again = await reseal_all(loaded, only_new)  # nothing left to do
    assert (again.seen, again.resealed) == (4, 0)


async def test_revoke_erases_the_tokens_without_a_key(loaded: AsyncEngine) -> None:
    res = await revoke(loaded, now=NOW, ids=[1, 2, 3])
    assert res.revoked == 3
    assert [(a, r) for _i, a, r in await _stored(loaded)] == [("", None)] * 3
    # Nothing sealed is left: any key passes the check.
    await check_tokens(loaded, TokenCipher.from_texts([generate_key()]))


async def _set_tokens(engine: AsyncEngine, cid: int, **values: Any) -> None:
    async with engine.begin() as conn:
        await conn.execute(update(schema.consents).where(schema.consents.c.id == cid)
                           .values(**values))


async def test_a_token_moved_to_another_consent_row_does_not_open_there(
    loaded: AsyncEngine,
) -> None:
    # Someone with write access to the table swaps u1's and u2's sealed access tokens.
    stored = {i: (a, r) for i, a, r in await _stored(loaded)}
    await _set_tokens(loaded, 1, access_token=stored[2][0])
    await _set_tokens(loaded, 2, access_token=stored[1][0])
    # The check every token command starts with (it opens consent 1's, the first row).
    with pytest.raises(TokenKeyError, match="does not belong to this row") as e:
        await check_tokens(loaded, CIPHER)
    assert "\n" not in str(e.value) and str(e.value).startswith("consent 1: ")
    assert "plainAT" not in str(e.value)
    # A claim never hands out another user's token: the two consents fail to open, alone;
    # the third opens (a refresh opens its claim's tokens as it starts).
    store = SqlWorkStore(loaded, CIPHER)
    claims = {c.id: c for c in await store.claim(ORG, worker="w1", week=WEEK, now=NOW,
                                                  limit=10)}
    for cid in (1, 2):
        with pytest.raises(TokenKeyError, match="does not belong to this row") as e:
            store.open_access(claims[cid])
        assert "\n" not in str(e.value) and "access_token" in str(e.value)
        assert str(e.value).startswith(f"consent {cid}: ") and "plainAT" not in str(e.value)
    assert (store.open_access(claims[3]), store.open_refresh(claims[3])) == (
        "plainAT003", "plainRT003")
    # Put back, both open again.
    await store.release([1, 2, 3], worker="w1")
    await _set_tokens(loaded, 1, access_token=stored[1][0])
    await _set_tokens(loaded, 2, access_token=stored[2][0])
    await check_tokens(loaded, CIPHER)
    assert len(await _claim_all(SqlWorkStore(loaded, CIPHER), "w2")) == 3


async def test_a_token_moved_from_access_token_to_refresh_token_does_not_open(
    loaded: AsyncEngine,
) -> None:
    (first, access, _refresh), *_ = await _stored(loaded)
    await _set_tokens(loaded, first, refresh_token=access)  # same row, the other column
    with pytest.raises(TokenKeyError, match=r"refresh_token .*does not belong to this row"):
        await check_tokens(loaded, CIPHER)
    store = SqlWorkStore(loaded, CIPHER)
    claims = {c.id: c for c in await store.claim(ORG, worker="w1", week=WEEK, now=NOW,
                                                  limit=10)}
    assert store.open_access(claims[first]).startswith("plainAT")  # its own still opens
    with pytest.raises(TokenKeyError, match="does not belong to this row") as e:
        store.open_refresh(claims[first])
    assert "\n" not in str(e.value) and str(e.value).startswith(f"consent {first}: ")


async def test_v1_tokens_still_open_and_rotation_binds_them_as_v2(
    loaded: AsyncEngine,
) -> None:
    # A database written before the binding: every token v1 (no associated data).
    for cid in (1, 2, 3):
        await _set_tokens(loaded, cid, access_token=seal_v1(f"oldAT{cid}"),
                          refresh_token=seal_v1(f"oldRT{cid}"))
    stored = await _stored(loaded)
    assert all(a.startswith(f"v1.{CIPHER.primary_id}.") for _i, a, _r in stored)
    assert not any(CIPHER.is_current(a) for _i, a, _r in stored)  # v1: rotate it
    found = await check_tokens(loaded, CIPHER)
    assert found.by_key == {CIPHER.primary_id: 6} and found.plain == 0
    store = SqlWorkStore(loaded, CIPHER)
    assert sorted((c.access_token, c.refresh_token) for c in await _claim_all(store)) == [
        (f"oldAT{i}", f"oldRT{i}") for i in (1, 2, 3)]
    await store.release([1, 2, 3], worker="w1")

    done = await reseal_all(loaded, CIPHER)  # the same key: v1 -> v2
    assert (done.seen, done.resealed, done.skipped) == (3, 3, 0)
    after = await _stored(loaded)
    for cid, access, refresh in after:
        assert access.startswith(f"v2.{CIPHER.primary_id}.") and CIPHER.is_current(access)
        assert unseal(access, ORG, f"u{cid}") == f"oldAT{cid}"
        assert unseal(refresh, ORG, f"u{cid}", "refresh_token") == f"oldRT{cid}"
    assert (await reseal_all(loaded, CIPHER)).resealed == 0  # nothing left to do
    assert sorted(c.access_token for c in await _claim_all(store, "w2")) == [
        "oldAT1", "oldAT2", "oldAT3"]
    # Now bound: moved to another row, it no longer opens there.
    await _set_tokens(loaded, 1, access_token=after[1][1])
    with pytest.raises(TokenKeyError, match="does not belong to this row"):
        await check_tokens(loaded, CIPHER)


async def test_load_claim_refresh_claim_round_trip(loaded: AsyncEngine) -> None:
    store = SqlWorkStore(loaded, CIPHER)
    (one, *_rest) = sorted(await _claim_all(store), key=lambda c: c.id)
    assert (one.access_token, one.refresh_token) == ("plainAT001", "plainRT001")
    # the runner's path: the pair the provider handed out, saved for the claim's consent
    await store.save_token(TokenRefreshed.of(one, "simA-rt-1", "simR-rt-1"))
    await store.apply([TokenRefreshed.of(one, "simA-rt-2")], run_id="r", worker="w1",
                      day=NOW.date())
    await store.release([1, 2, 3], worker="w1")
    await check_tokens(loaded, CIPHER)
    again = {c.id: c for c in await _claim_all(store, "w2")}
    assert (again[1].access_token, again[1].refresh_token) == ("simA-rt-2", "simR-rt-1")
    assert (again[2].access_token, again[2].refresh_token) == ("plainAT002", "plainRT002")


async def test_once_a_rotation_bound_every_token_a_v1_token_is_refused_until_accepted(
    loaded: AsyncEngine,
) -> None:
    """`keys rotate` records that every token is bound; a v1 token that turns up after
    (put back from an older copy, or moved from another row: nothing tells) is refused by
    the check every command starts with, by a plain rotation, and at its refresh, until a
    rotation with `--accept-v1` seals it."""
    assert (await check_tokens(loaded, CIPHER)).bound_since is None  # loaded, not rotated
    done = await reseal_all(loaded, CIPHER, now=NOW)
    assert done.bound
    found = await check_tokens(loaded, CIPHER)
    assert (found.unbound, found.bound_since) == (0, NOW.isoformat(timespec="seconds"))

    await _set_tokens(loaded, 2, access_token=seal_v1("oldAT2"))
    for attempt in (check_tokens(loaded, CIPHER), reseal_all(loaded, CIPHER)):
        with pytest.raises(TokenKeyError) as e:
            await attempt
        message = str(e.value)
        assert "\n" not in message and message.startswith("1 stored token(s) are v1")
        assert "--accept-v1" in message and NOW.isoformat(timespec="seconds") in message
    slot = TokenSlot(ORG, "u2", "access_token")
    stored = (await _stored(loaded))[1][1]
    assert CIPHER.decrypt(stored, slot) == "oldAT2"  # the keys open it...
    with pytest.raises(TokenKeyError, match="is v1, not bound to its row"):
        CIPHER.bound().decrypt(stored, slot)  # ...but a run after the binding refuses it
    assert CIPHER.bound().decrypt(CIPHER.encrypt("t", slot), slot) == "t"  # v2 opens

    done = await reseal_all(loaded, CIPHER, accept_unbound=True, now=NOW + timedelta(days=1))
    assert (done.resealed, done.bound) == (1, True)
    found = await check_tokens(loaded, CIPHER)  # the first binding's time is kept
    assert (found.unbound, found.bound_since) == (0, NOW.isoformat(timespec="seconds"))
    assert unseal((await _stored(loaded))[1][1], ORG, "u2") == "oldAT2"


async def test_the_binding_is_recorded_only_once_no_v1_token_is_left(
    loaded: AsyncEngine,
) -> None:
    """A rotation that leaves a v1 token behind (a row put back while it ran) records
    nothing, so nothing is refused yet; the check still counts the v1 tokens."""
    from batch.db.tokens import _bind

    await _set_tokens(loaded, 1, access_token=seal_v1("oldAT1"))
    async with loaded.begin() as conn:
        assert not await _bind(conn, NOW)
    found = await check_tokens(loaded, CIPHER)
    assert (found.unbound, found.bound_since) == (1, None)
    await _set_tokens(loaded, 1, access_token=CIPHER.encrypt(
        "newAT1", TokenSlot(ORG, "u1", "access_token")))
    async with loaded.begin() as conn:
        assert await _bind(conn, NOW)
    found = await check_tokens(loaded, CIPHER)
    assert (found.unbound, found.bound_since) == (0, NOW.isoformat(timespec="seconds"))
