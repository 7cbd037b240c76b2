"""Revoking consents: a user withdrew, so the consent is never called again and its tokens
are erased, in one transaction. Nothing changes when any id or row names no consent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from batch.db.csv_input import CsvInput
from batch.db.engine import transaction
from batch.db.schema import consents

REVOKE_COLUMNS = ("user_id", "org_code")
#: What an erased access token is (the column is NOT NULL on files of every version).
ERASED = ""
_CHUNK = 500


@dataclass(frozen=True, slots=True)
class RevokeResult:
    """Consents revoked now, those revoked before, and one line per id or row naming none
    (then nothing was changed)."""

    revoked: int
    already: int
    unknown: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RevokeRow:
    """One ``user_id,org_code`` row of a revocation file."""

    line: int
    user_id: str
    org_code: str


def read_revocations(path: str | Path, *, ignore_extra: bool = False) -> list[RevokeRow]:
    """The rows of a ``user_id,org_code`` CSV (header by name); InputError on a bad row."""
    out = []
    with CsvInput(path, REVOKE_COLUMNS, ignore_extra=ignore_extra) as src:
        for line, (user_id, org) in src.rows():
            if not user_id.strip():
                raise src.error(line, "user_id", "is empty")
            if not org.strip():
                raise src.error(line, "org_code", "is empty")
            out.append(RevokeRow(line, user_id.strip(), org.strip()))
    return out


async def _by_ids(conn: AsyncConnection, ids: Sequence[int]) -> dict[int, str]:
    found: dict[int, str] = {}
    for i in range(0, len(ids), _CHUNK):
        rows = await conn.execute(select(consents.c.id, consents.c.status).where(
            consents.c.id.in_(list(ids[i:i + _CHUNK]))))
        found.update({int(r.id): str(r.status) for r in rows})
    return found


async def _by_pairs(conn: AsyncConnection, rows: Sequence[RevokeRow]
                    ) -> dict[tuple[str, str], tuple[int, str]]:
    found: dict[tuple[str, str], tuple[int, str]] = {}
    c = consents.c
    for i in range(0, len(rows), _CHUNK):
        keys = [(r.user_id, r.org_code) for r in rows[i:i + _CHUNK]]
        res = await conn.execute(select(c.id, c.user_id, c.org_code, c.status).where(
            tuple_(c.user_id, c.org_code).in_(keys)))
        found.update({(str(r.user_id), str(r.org_code).strip()): (int(r.id), str(r.status))
                      for r in res})
    return found


async def revoke(engine: AsyncEngine, *, now: datetime, ids: Sequence[int] = (),
                 rows: Sequence[RevokeRow] = (), source: str = "<revocations>"
                 ) -> RevokeResult:
    """Revoke the consents named by ``ids`` and ``rows``: status 'revoked', tokens erased,
    lease and pending work dropped. All or nothing: an id or row naming no consent changes
    nothing and is reported, one line each."""
    async with transaction(engine) as conn:
        by_id = await _by_ids(conn, sorted(set(ids)))
        by_pair = await _by_pairs(conn, rows)
        unknown = [f"consent id {i}: no such consent" for i in sorted(set(ids) - set(by_id))]
        unknown += [f"{source}:{r.line}: no consent of user {r.user_id!r} at {r.org_code}"
                    for r in rows if (r.user_id, r.org_code) not in by_pair]
        if unknown:
            return RevokeResult(0, 0, tuple(unknown))
        status = dict(by_id) | {cid: st for cid, st in by_pair.values()}
        todo = sorted(cid for cid, st in status.items() if st != "revoked")
        for i in range(0, len(todo), _CHUNK):
            await conn.execute(update(consents).where(
                consents.c.id.in_(todo[i:i + _CHUNK])).values(
                status="revoked", access_token=ERASED, refresh_token=None, lease_owner=None,
                lease_until=None, pending_items=None, updated_at=now))
        # Tokens of consents revoked before are erased again (a row may predate the rule).
        again = [cid for cid, st in status.items() if st == "revoked"]
        for i in range(0, len(again), _CHUNK):
            await conn.execute(update(consents).where(
                consents.c.id.in_(again[i:i + _CHUNK])).values(
                access_token=ERASED, refresh_token=None))
    return RevokeResult(len(todo), len(status) - len(todo), ())
