"""One call from a database to the finished page or file (for the CLI and the demo)."""

from __future__ import annotations

import os
from datetime import date, datetime
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from batch.dashboard.cluster_data import load_cluster
from batch.dashboard.cluster_render import cluster_section
from batch.dashboard.data import load_snapshot
from batch.dashboard.health_data import load_run_health
from batch.dashboard.health_render import run_health_section
from batch.dashboard.render import render_page
from batch.errors import InputError
from planning.calendar import KST


async def dashboard_html(engine: AsyncEngine, *, now: datetime, week: date | None = None) -> str:
    """The self-contained page for the week holding ``week`` (default: ``now``'s KST week)."""
    snap = await load_snapshot(engine, week=week or now.astimezone(KST).date(), now=now)
    health = await load_run_health(engine, day=snap.focus_day, now=now)
    cluster = cluster_section(await load_cluster(engine, now=now))
    return render_page(snap, sections=[run_health_section(health), cluster])


def write_page(page: str, path: Path) -> Path:
    """Write ``page`` to ``path`` atomically (a reader never sees half a page)."""
    path = path.expanduser()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"cannot write the page: {exc.strerror or exc}",
                         file=str(path)) from None
    return path


async def write_dashboard(engine: AsyncEngine, path: Path, *, now: datetime,
                          week: date | None = None) -> Path:
    """Read, render and write the page; returns the path written."""
    return write_page(await dashboard_html(engine, now=now, week=week), path)
