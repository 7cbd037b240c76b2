"""Test doubles for the chain: a scripted provider and a driver for the fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from batch.clock import FakeClock
from batch.resilience.outcomes import Kind, Outcome, classify, connection_error

T = TypeVar("T")

OK = Outcome(Kind.SUCCESS, "00000", 200)
FAULT = classify(500, "50001")          # retryable provider fault
DOWN = classify(503, "50005")           # retryable, provider down
UNKNOWN = classify(500, "50003")        # processing time exceeded: outcome unknown
THROTTLED = classify(429, "42902")
PAUSED = classify(403, "40301")
DEAD = classify(403, "40305")
DONE_WEEK = classify(429, "42901")
BAD_REQUEST = classify(400, "40001")
CONN = connection_error("connection refused")


class Provider:
    """A fake provider: answers from a script (or a function of the attempt number).

    Each attempt gets a fresh tran id, takes ``latency`` fake seconds, and is logged with
    its start time and the timeout it was given.
    """

    def __init__(self, clock: FakeClock,
                 answers: Iterable[Outcome] | Callable[[int], Outcome] = (),
                 *, latency: float = 0.0, default: Outcome = OK) -> None:
        self.clock = clock
        self._fn = answers if callable(answers) else None
        self._script = [] if callable(answers) else list(answers)
        self.latency = latency
        self.default = default
        self.starts: list[float] = []
        self.timeouts: list[float] = []
        self.ends: list[float] = []

    @property
    def calls(self) -> int:
        return len(self.starts)

    async def __call__(self, timeout_s: float) -> Outcome:
        n = len(self.starts)
        self.starts.append(self.clock.monotonic())
        self.timeouts.append(timeout_s)
        if self.latency:
            await self.clock.sleep(self.latency)
        if self._fn is not None:
            out = self._fn(n)
        elif self._script:
            out = self._script.pop(0)
        else:
            out = self.default
        self.ends.append(self.clock.monotonic())
        return out.with_(tran_id=f"OPERATOR01T{n:014d}")


async def drive(clock: FakeClock, aw: Awaitable[T], *, limit: float = 100_000.0) -> T:
    """Await ``aw`` while stepping the fake clock from timer to timer until it is done."""
    task = asyncio.ensure_future(aw)
    start = clock.monotonic()
    idle = 0
    while True:
        for _ in range(5):  # let the task (and whatever it woke) run before time moves
            await asyncio.sleep(0)
        if task.done():
            return task.result()
        nxt = clock.next_deadline
        if nxt is None:
            idle += 1
            if idle > 200:
                task.cancel()
                raise AssertionError("task is stuck with no timer pending")
            continue
        idle = 0
        if nxt - start > limit:
            task.cancel()
            raise AssertionError("task ran past the time limit")
        await clock.run_for(max(0.0, nxt - clock.monotonic()))


async def drive_all(clock: FakeClock, aws: Iterable[Awaitable[T]]) -> list[T]:
    """Start every awaitable at the same fake instant and drive them all to the end."""
    async def together() -> list[T]:
        return list(await asyncio.gather(*aws))
    return await drive(clock, together())
