"""Stored tokens against the keys at hand: the check every token command starts with, and
re-sealing with the first key, as ``v2`` bound to each row (``keys rotate``).

The database holds access and refresh tokens only sealed (``batch.crypto``). A command
that reads or writes them first makes sure the keys it was given open what is stored, so
a wrong key is one line before anything is written or called, never a half-loaded file or
a night of failed claims: every stored token must carry the id of a key in the list (one
scan, grouped by key id, ``v1`` and ``v2`` alike), and one token per key id must really
open (one per key id and column), with its own row's consent and column as the
associated data (``v2``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    bindparam,
    case,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from batch.crypto import (
    KEY_FILE_ENV,
    KEYS_ENV,
    LEGACY_VERSION,
    SEALED_STARTS,
    VERSION,
    TokenCipher,
    TokenColumn,
    TokenKeyError,
    TokenSlot,
)
from batch.db.engine import connect, transaction
from batch.db.revocation import ERASED
from batch.db.schema import consents, settings

#: Consents re-sealed per transaction by :func:`reseal_all`.
RESEAL_CHUNK = 5000
_PLAIN = "plain"


#: the ``settings`` key ``keys rotate`` sets once every stored token is bound (``v2``):
#: its value is when; from then on a ``v1`` token is refused
BOUND_KEY = "tokens_bound_at"


@dataclass(frozen=True, slots=True)
class StoredKeys:
    """What the stored tokens are sealed with: tokens per key id, plain-text tokens
    (written by a version before encryption at rest), ``v1`` tokens (not bound to their
    row), and since when every token is bound (None: not yet)."""

    by_key: dict[str, int]
    plain: int
    unbound: int = 0
    bound_since: str | None = None

    @property
    def total(self) -> int:
        return sum(self.by_key.values()) + self.plain


def _key_of(column: str) -> Any:
    """The key id a stored token names, 'plain' if it is not sealed, NULL if none/erased.

    ``v1.<key id>.`` and ``v2.<key id>.`` are the same length, so the id is read by
    position whichever version sealed the token."""
    col = consents.c[column]
    return case((col.is_(None) | (col == ERASED), literal(None)),
                (func.substr(col, 1, len(VERSION) + 1).in_(SEALED_STARTS),
                 func.substr(col, len(VERSION) + 2, 8)),
                else_=literal(_PLAIN))


def _is_v1(column: str) -> Any:
    """1 if the stored token is ``v1`` (sealed before the binding), else 0."""
    col = consents.c[column]
    return case((func.substr(col, 1, len(LEGACY_VERSION) + 1) == f"{LEGACY_VERSION}.",
                 literal(1)), else_=literal(0))


#: One scan of ``consents``: how many rows per (access key id, refresh key id) pair, and
#: per whether each is ``v1``.
_SURVEY = (select(_key_of("access_token").label("a"), _key_of("refresh_token").label("r"),
                  _is_v1("access_token").label("va"), _is_v1("refresh_token").label("vr"),
                  func.count().label("n"), func.min(consents.c.id).label("first"))
           .group_by(literal_column("a"), literal_column("r"), literal_column("va"),
                     literal_column("vr")))


async def _survey(conn: AsyncConnection, cipher: TokenCipher) -> StoredKeys:
    by_key: dict[str, int] = {}
    plain = unbound = 0
    samples: dict[tuple[str, TokenColumn], int] = {}
    for a, r, va, vr, n, first in (await conn.execute(_SURVEY)).all():
        unbound += (int(va) + int(vr)) * int(n)
        pair: tuple[tuple[TokenColumn, Any], ...] = (("access_token", a), ("refresh_token", r))
        for column, k in pair:
            if k is None:
                continue
            if k == _PLAIN:
                plain += int(n)
                continue
            by_key[str(k)] = by_key.get(str(k), 0) + int(n)
            samples.setdefault((str(k), column), int(first))
    for (k, column), first in samples.items():
        if k in cipher.key_ids:
            # The id matches: make sure the key really opens, on the row's own slot (a
            # corrupt row, or a token moved from another row or column, would not).
            c = consents.c
            row = (await conn.execute(select(c[column], c.org_code, c.user_id).where(
                c.id == first))).one()
            try:
                cipher.decrypt(row[0], TokenSlot(row.org_code, row.user_id, column))
            except TokenKeyError as exc:
                raise TokenKeyError(f"consent {first}: {exc}") from None
    since = (await conn.execute(select(settings.c.value).where(
        settings.c.key == BOUND_KEY))).scalar()
    return StoredKeys(by_key, plain, unbound, since)


async def check_stored_tokens(conn: AsyncConnection, cipher: TokenCipher, *,
                              allow_plain: bool = False,
                              allow_unbound: bool = False) -> StoredKeys:
    """Raise TokenKeyError (one line) unless ``cipher`` opens every stored token; a
    plain-text token is refused too unless ``allow_plain`` (``keys rotate`` seals them),
    and, once ``keys rotate`` has bound every token, a ``v1`` one unless
    ``allow_unbound`` (``keys rotate --accept-v1``)."""
    found = await _survey(conn, cipher)
    unknown = sorted(k for k in found.by_key if k not in cipher.key_ids)
    if unknown:
        n = sum(found.by_key[k] for k in unknown)
        held = ", ".join(sorted(cipher.key_ids))
        raise TokenKeyError(
            f"{n} stored token(s) were sealed with key(s) {', '.join(unknown)}, which "
            f"{KEYS_ENV}/{KEY_FILE_ENV} does not hold (it holds {held}): a wrong key, or "
            "an old key dropped before `mydata-batch keys rotate`")
    if found.plain and not allow_plain:
        raise TokenKeyError(
            f"{found.plain} stored token(s) are not encrypted (written by a version before "
            "encryption at rest): seal them with `mydata-batch keys rotate`")
    if found.unbound and found.bound_since and not allow_unbound:
        raise TokenKeyError(
            f"{found.unbound} stored token(s) are {LEGACY_VERSION}, not bound to their row, "
            f"though `keys rotate` bound every token on {found.bound_since}: put back from "
            "an older copy, or moved from another row; if they are genuine, seal them with "
            "`mydata-batch keys rotate --accept-v1`")
    return found


async def check_tokens(engine: AsyncEngine, cipher: TokenCipher) -> StoredKeys:
    """:func:`check_stored_tokens` on a connection of its own (``run`` starts with it)."""
    async with connect(engine) as conn:
        return await check_stored_tokens(conn, cipher)


@dataclass(frozen=True, slots=True)
class Resealed:
    """What ``keys rotate`` did: consents looked at, re-sealed, and changed meanwhile by
    someone else (a running batch saving a refreshed token: left as that wrote them)."""

    seen: int
    resealed: int
    skipped: int
    #: every stored token is bound now (recorded; a ``v1`` token is refused from now on)
    bound: bool = False


async def _bind(conn: AsyncConnection, now: datetime | None) -> bool:
    """Record, in ``conn``'s transaction, that every stored token is bound, if it is (no
    ``v1`` one left: a row put back meanwhile would be one); the first such time is
    kept."""
    left = (await conn.execute(select(func.count()).where(
        or_(_is_v1("access_token") == 1, _is_v1("refresh_token") == 1)))).scalar_one()
    if left:
        return False
    if (await conn.execute(select(settings.c.value).where(
            settings.c.key == BOUND_KEY))).scalar() is None:
        at = (now or datetime.now(UTC)).isoformat(timespec="seconds")
        await conn.execute(insert(settings).values(key=BOUND_KEY, value=at))
    return True


async def reseal_all(engine: AsyncEngine, cipher: TokenCipher, *,
                     accept_unbound: bool = False, now: datetime | None = None) -> Resealed:
    """Re-seal every stored token as ``v2`` with the first key, bound to its row and column
    (``v1`` ones, those under an older key, and plain-text ones are sealed), a chunk
    of consents per transaction. Every row opens with the list before and after, so a stop
    part way is safe: run it again. A row changed since it was read (a refreshed token
    saved by a running batch) is left alone: each update is a compare-and-set.

    A rotation that leaves every stored token ``v2`` records so (``settings``
    ``tokens_bound_at``, at ``now``): from then on a ``v1`` token is refused, by every
    command's check and at a refresh (:meth:`TokenCipher.bound`), unless this is called
    again with ``accept_unbound`` to seal it."""
    async with connect(engine) as conn:
        await check_stored_tokens(conn, cipher, allow_plain=True,
                                  allow_unbound=accept_unbound)
    c = consents.c
    stmt = (update(consents)
            .where(c.id == bindparam("b_id"), c.access_token == bindparam("b_old_acc"),
                   func.coalesce(c.refresh_token, "") == bindparam("b_old_ref"))
            .values(access_token=bindparam("b_acc"), refresh_token=bindparam("b_ref")))
    seen = changed = skipped = 0
    after = 0
    while True:
        async with transaction(engine) as conn:
            rows = (await conn.execute(
                select(c.id, c.org_code, c.user_id, c.access_token, c.refresh_token)
                .where(c.id > after).order_by(c.id).limit(RESEAL_CHUNK))).all()
            if not rows:
                bound = not skipped and await _bind(conn, now)
                return Resealed(seen, changed, skipped, bound)
            todo = {}
            for r in rows:
                acc, ref = r.access_token, r.refresh_token
                try:
                    if acc:
                        acc = cipher.reseal(acc, TokenSlot(r.org_code, r.user_id,
                                                           "access_token"))
                    if ref:
                        ref = cipher.reseal(ref, TokenSlot(r.org_code, r.user_id,
                                                           "refresh_token"))
                except TokenKeyError as exc:
                    raise TokenKeyError(f"consent {r.id}: {exc}") from None
                if acc != r.access_token or ref != r.refresh_token:
                    todo[r.id] = {"b_id": r.id, "b_old_acc": r.access_token,
                                  "b_old_ref": r.refresh_token or "", "b_acc": acc,
                                  "b_ref": ref}
            if todo:
                await conn.execute(stmt, list(todo.values()))
                # Which took: a row changed meanwhile kept what its writer stored.
                stored = (await conn.execute(select(c.id, c.access_token, c.refresh_token)
                                             .where(c.id.in_(list(todo))))).all()
                took = sum(1 for i, acc, ref in stored
                           if (acc, ref) == (todo[i]["b_acc"], todo[i]["b_ref"]))
                changed += took
                skipped += len(todo) - took
            seen += len(rows)
            after = rows[-1].id
