"""Which turns of the event loop hold it up, and how much of that is this thread's CPU.

An opt-in probe for the benchmarks (``BENCH_STEPS=1``, ``BENCH_STEPS_MS`` its threshold; it
adds two clock reads and a coroutine walk to every step, so lateness figures taken with it
on are not the product's):
every callback the loop runs is timed by wall clock and by this thread's CPU clock, and the
steps over ``threshold`` are summed by where they resumed and where they stopped (the
innermost coroutine before the step, then the chain of coroutines it awaits after), with
the garbage collector's time inside them.

A step whose wall time is far above its CPU time did not run our code for that long: the
thread was taken off its core. On a 2-core machine that also runs PostgreSQL and the
simulator, the steps that send a statement or a request are the ones: the woken server
process preempts the sender on its core (2026-12-03, paced 500 calls/s: the writer's
statement-sending steps over 2 ms spent 178 ms in wall time and 8.6 ms on the CPU in one
minute; with the client pinned to one core and PostgreSQL and the simulator to the other,
those steps fell under 2 ms).
"""

from __future__ import annotations

import asyncio
import asyncio.events
import gc
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Sum:
    steps: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    gc: float = 0.0
    longest: float = 0.0


@dataclass
class StepLog:
    """The steps over ``threshold`` seconds, summed per (resumed at, stopped in)."""

    threshold: float
    by_place: dict[str, _Sum] = field(default_factory=lambda: defaultdict(_Sum))
    gc_seconds: float = 0.0

    def add(self, place: str, wall: float, cpu: float, in_gc: float) -> None:
        s = self.by_place[place]
        s.steps += 1
        s.wall += wall
        s.cpu += cpu
        s.gc += in_gc
        s.longest = max(s.longest, wall)

    def report(self, top: int = 8) -> list[str]:
        """Lines: the totals, then the ``top`` places by wall time."""
        rows = sorted(self.by_place.items(), key=lambda kv: -kv[1].wall)
        steps = sum(s.steps for _, s in rows)
        wall = sum(s.wall for _, s in rows)
        cpu = sum(s.cpu for _, s in rows)
        out = [f"loop steps over {self.threshold * 1e3:g} ms: {steps:,}, {wall * 1e3:,.0f} ms "
               f"wall, {cpu * 1e3:,.0f} ms this thread's CPU (all collections: "
               f"{self.gc_seconds * 1e3:,.0f} ms)"]
        out += [f"  {s.steps:6,} steps {s.wall * 1e3:8.1f} ms wall {s.cpu * 1e3:7.1f} cpu "
                f"{s.gc * 1e3:6.1f} gc  max {s.longest * 1e3:6.1f}  {place}"
                for place, s in rows[:top]]
        return out


def _awaited(handle: Any) -> list[Any] | None:
    """The chain of coroutines the task a callback resumes is in, outermost first (None:
    the callback is not a task's step)."""
    task = getattr(handle._callback, "__self__", None)
    if not isinstance(task, asyncio.Task):
        return None
    chain = []
    coro: Any = task.get_coro()
    while coro is not None and hasattr(coro, "cr_frame"):
        chain.append(coro)
        coro = coro.cr_await
    return chain


def _innermost(handle: Any) -> str:
    """Where the task a callback resumes is waiting: its innermost coroutine and line."""
    chain = _awaited(handle)
    if not chain:
        return ""
    frame = chain[-1].cr_frame
    return f"{getattr(chain[-1], '__qualname__', '?')}:{frame.f_lineno if frame else '-'}"


def _chain(handle: Any) -> str:
    """The callback's name, or its task's chain of awaited coroutines (after the step)."""
    chain = _awaited(handle)
    if chain is None:
        return getattr(handle._callback, "__qualname__", repr(handle._callback))
    names = [getattr(coro, "__qualname__", "?") for coro in chain]
    if len(names) > 5:  # the task's own coroutine, what it is in, and where it waits
        names = [*names[:2], "..", *names[-2:]]
    return ">".join(names)


@contextmanager
def loop_steps(threshold: float | None = None) -> Iterator[StepLog]:
    """Time every event-loop callback run inside the block (any loop of this thread); the
    steps over ``threshold`` seconds are kept (default ``BENCH_STEPS_MS``, else 2 ms: a
    higher one shows only the stalls that make a tick late for many providers at once)."""
    if threshold is None:
        threshold = float(os.environ.get("BENCH_STEPS_MS", "2")) / 1e3
    log = StepLog(threshold)
    original = asyncio.events.Handle._run

    def timed(self: asyncio.events.Handle) -> None:
        resumed = _innermost(self)
        gc0 = collections.total
        c0 = time.thread_time()
        t0 = time.perf_counter()
        original(self)
        wall = time.perf_counter() - t0
        if wall > threshold:
            log.add(f"{resumed} => {_chain(self)}", wall, time.thread_time() - c0,
                    collections.total - gc0)

    with gc_tally() as collections:
        asyncio.events.Handle._run = timed  # type: ignore[method-assign]
        try:
            yield log
        finally:
            asyncio.events.Handle._run = original  # type: ignore[method-assign]
            log.gc_seconds = collections.total


@dataclass
class GcTally:
    """The garbage collector's collections in a block, per generation: how many, their
    time in all and the longest, and what they collected."""

    count: list[int] = field(default_factory=lambda: [0, 0, 0])
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    longest: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    collected: list[int] = field(default_factory=lambda: [0, 0, 0])
    total: float = 0.0  # seconds, every generation
    #: (monotonic start, seconds) of every collection over 10 ms, to set beside late ticks
    long_ones: list[tuple[float, float]] = field(default_factory=list)

    def line(self) -> str:
        return ", ".join(
            f"gen{g} {self.count[g]:,} x {1000 * self.seconds[g] / max(1, self.count[g]):.2f}"
            f" ms = {self.seconds[g]:.2f} s (longest {1000 * self.longest[g]:.0f} ms, "
            f"{self.collected[g]:,} freed)" for g in range(3))


@contextmanager
def gc_tally() -> Iterator[GcTally]:
    """Count and time every collection inside the block (cheap: one callback each)."""
    tally = GcTally()
    started = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        g, took = info["generation"], time.perf_counter() - started[0]
        tally.count[g] += 1
        tally.seconds[g] += took
        tally.total += took
        tally.longest[g] = max(tally.longest[g], took)
        tally.collected[g] += info["collected"]
        if took > 0.01:
            tally.long_ones.append((started[0], took))

    gc.callbacks.append(on_gc)
    try:
        yield tally
    finally:
        gc.callbacks.remove(on_gc)
