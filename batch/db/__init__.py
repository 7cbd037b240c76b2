"""The database layer: SQLAlchemy Core over aiosqlite (embedded) or asyncpg (production)."""

from __future__ import annotations
