"""When consents and institutions were last loaded: a generation that grows with each load.

A plan remembers the generation it was made at; a load after it makes the plan stale, and
the next ``run`` re-makes it (``plan`` says so).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from batch.db import schema

#: What a load can change that a plan is made from.
KINDS = ("consents", "institutions")


async def mark_loaded(conn: AsyncConnection, what: str, now: datetime) -> int:
    """Record, inside the loader's transaction, that ``what`` was loaded at ``now``; returns
    the new generation (one more than any before)."""
    if what not in KINDS:
        raise ValueError(f"unknown load kind {what!r}")
    lm = schema.load_marks
    gen = int((await conn.execute(select(func.coalesce(func.max(lm.c.generation), 0))))
              .scalar_one()) + 1
    ins = (postgresql.insert(lm) if conn.dialect.name == "postgresql" else sqlite.insert(lm))
    await conn.execute(ins.values(what=what, loaded_at=now, generation=gen)
                       .on_conflict_do_update(index_elements=["what"],
                                              set_={"loaded_at": now, "generation": gen}))
    return gen


async def load_generation(conn: AsyncConnection) -> int:
    """The generation of the latest load of anything a plan is made from (0: none yet)."""
    lm = schema.load_marks
    return int((await conn.execute(select(func.coalesce(func.max(lm.c.generation), 0))))
               .scalar_one())


async def loaded_since(conn: AsyncConnection, generation: int) -> tuple[str, ...]:
    """The kinds loaded after ``generation``, in KINDS order."""
    lm = schema.load_marks
    rows = (await conn.execute(select(lm.c.what).where(lm.c.generation > generation))).all()
    found = {str(r[0]) for r in rows}
    return tuple(k for k in KINDS if k in found)


__all__ = ["KINDS", "load_generation", "loaded_since", "mark_loaded"]
