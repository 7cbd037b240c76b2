"""Building blocks for the cluster tests: a private Redis, worker commands, the final rows."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from sqlalchemy import select

from batch.db import schema
from batch.db.engine import make_engine
from tests.integration.helpers import free_ports


@contextmanager
def private_redis() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server of our own on a free port (never the machine's shared one)."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed")
    port = free_ports(1)[0]
    proc = subprocess.Popen([exe, "--port", str(port), "--save", "", "--appendonly", "no",
                             "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


def worker_cmd(db_url: str, redis_url: str, window: str, *, name: str,
               extra: tuple[str, ...] = ()) -> list[str]:
    import sys
    return [sys.executable, "-m", "batch.cli", "--db", db_url, "--redis", redis_url, "run",
            "--window-override", window, "--json", "--lease-seconds", "60",
            "--progress", "none", "--log-level", "WARNING", "--worker-id", name,
            "--heartbeat-seconds", "2", "--dead-after-seconds", "20", *extra]


def final_rows(db_url: str) -> tuple[list[Any], list[Any], list[Any]]:
    async def go() -> tuple[list[Any], list[Any], list[Any]]:
        engine = make_engine(db_url)
        try:
            async with engine.connect() as conn:
                rows = (await conn.execute(select(
                    schema.consents.c.id, schema.consents.c.due_week,
                    schema.consents.c.week_result, schema.consents.c.lease_owner))).all()
                outs = (await conn.execute(select(
                    schema.call_outcomes.c.consent_id, schema.call_outcomes.c.action,
                    schema.call_outcomes.c.run_id))).all()
                nodes = (await conn.execute(select(schema.nodes))).all()
            return list(rows), list(outs), list(nodes)
        finally:
            await engine.dispose()

    return asyncio.run(go())
