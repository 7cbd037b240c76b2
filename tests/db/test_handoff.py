"""batch/db/handoff.py: the loop lets go of the GIL each turn only while a statement runs."""

from __future__ import annotations

import asyncio

from batch.db.handoff import GilHandoff


async def test_the_loop_pauses_each_turn_only_while_a_statement_is_in_flight() -> None:
    h = GilHandoff()
    async with h:
        assert h.active
        for _ in range(5):
            await asyncio.sleep(0)
        during = h.pauses
    assert during >= 4  # once per turn of the loop
    for _ in range(5):
        await asyncio.sleep(0)
    assert h.pauses <= during + 1  # the last scheduled turn sees it inactive and stops
    assert not h.active


async def test_nested_statements_keep_one_pause_per_turn() -> None:
    h = GilHandoff()
    async with h, h:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert 1 <= h.pauses <= 2
    assert not h.active
