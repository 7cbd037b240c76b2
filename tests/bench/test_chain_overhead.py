"""Per-call overhead of our chain vs the composition a Python user would build from peers.

Theirs: aiobreaker + tenacity AsyncRetrying + aiolimiter.AsyncLimiter + asyncio.Semaphore +
asyncio.timeout, the same five layers in the same order (pybreaker's async support needs
tornado, so aiobreaker is the asyncio peer). Both wrap a no-op attempt that returns
success; the bare attempt's own cost is subtracted. Two attempts: one that returns at once
(never yields to the event loop, so the loop never purges cancelled timer handles: the
worst case for anything built on asyncio.timeout) and one that yields once, as real I/O
always does. The last test runs our chain with the run's observability listeners attached
(the metrics recorder and the event log, as ``run`` attaches them) beside the same chain
without listeners, interleaved in one run (goal: under 5 us a call more). Run:

    PYTHONPATH=$PWD .venv/bin/python -m pytest -s tests/bench/test_chain_overhead.py
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

import aiobreaker
from aiolimiter import AsyncLimiter
from tenacity import AsyncRetrying, retry_if_result, stop_after_attempt, wait_random_exponential

from batch.clock import SystemClock
from batch.observe.logbook import EventLog
from batch.observe.recorder import ChainRecorder
from batch.resilience import (
    BulkheadSettings,
    ChainSettings,
    LimiterSettings,
    ProviderChain,
    RetrySettings,
)
from batch.resilience.events import Listener
from batch.resilience.outcomes import Kind, Outcome

CALLS = 20_000
ROUNDS = 7
RATE = 1e9  # high enough that neither limiter ever waits: we measure bookkeeping only

_SUCCESS = Outcome(Kind.SUCCESS, "00000", 200, tran_id="OPERATOR01A00000000000001")


async def noop_attempt(timeout_s: float) -> Outcome:
    return _SUCCESS


async def yielding_attempt(timeout_s: float) -> Outcome:
    await asyncio.sleep(0)
    return _SUCCESS


Attempt = Callable[[float], Awaitable[Outcome]]


def ours(attempt: Attempt, listeners: Sequence[Listener] = ()
         ) -> Callable[[], Awaitable[Outcome]]:
    settings = ChainSettings(
        retry=RetrySettings(max_attempts=3),
        limiter=LimiterSettings(calls_per_second=RATE, burst=10),
        bulkhead=BulkheadSettings(max_concurrent=20, max_wait=1.0),
    )
    chain = ProviderChain("BANK000001", settings, clock=SystemClock(), listeners=listeners)

    def one() -> Awaitable[Outcome]:
        return chain.call(attempt)

    return one


def theirs(attempt: Attempt) -> Callable[[], Awaitable[Outcome]]:
    breaker = aiobreaker.CircuitBreaker(fail_max=50, timeout_duration=timedelta(seconds=30))
    retrying = AsyncRetrying(
        stop=stop_after_attempt(3),
        wait=wait_random_exponential(multiplier=0.2, max=5),
        retry=retry_if_result(lambda o: o.kind is Kind.FAULT and o.retryable),
        reraise=True,
    )
    limiter = AsyncLimiter(RATE, 1.0)
    semaphore = asyncio.Semaphore(20)

    async def limited() -> Outcome:
        async with limiter, semaphore, asyncio.timeout(23.0):
            return await attempt(23.0)

    async def retried() -> Outcome:
        return await retrying(limited)  # type: ignore[no-any-return]

    def one() -> Awaitable[Outcome]:
        return breaker.call_async(retried)  # type: ignore[no-any-return]

    return one


async def per_call_us(one: Callable[[], Awaitable[Outcome]]) -> float:
    for _ in range(500):  # warm up
        await one()
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(CALLS):
        await one()
    return (time.perf_counter() - t0) / CALLS * 1e6


async def interleaved(attempt: Attempt, *ones: Callable[[], Awaitable[Outcome]]
                      ) -> list[float]:
    """Median us per call of the bare attempt, then of each of ``ones``, round by round."""
    def bare() -> Awaitable[Outcome]:
        return attempt(23.0)

    runs: list[list[float]] = [[] for _ in range(len(ones) + 1)]
    for _ in range(ROUNDS):  # interleaved, so drift hits all alike
        for i, one in enumerate((bare, *ones)):
            runs[i].append(await per_call_us(one))
    return [statistics.median(r) for r in runs]


async def measure(attempt: Attempt) -> list[float]:
    return await interleaved(attempt, ours(attempt), theirs(attempt))


def test_chain_overhead_vs_peer_composition() -> None:
    print()
    print("theirs = aiobreaker + tenacity.AsyncRetrying + aiolimiter.AsyncLimiter"
          " + asyncio.Semaphore + asyncio.timeout")
    for name, attempt in (("attempt returns at once", noop_attempt),
                          ("attempt yields once", yielding_attempt)):
        base, o, t = asyncio.run(measure(attempt))
        ours_over, theirs_over = o - base, t - base
        ratio = ours_over / theirs_over
        met = "met" if ratio <= 0.5 and ours_over < 20 else "NOT met"
        print(f"[{name}] bare {base:6.2f} us | ours {o:6.2f} us (overhead {ours_over:6.2f}) |"
              f" theirs {t:6.2f} us (overhead {theirs_over:6.2f}) | ratio {ratio:5.3f}"
              f" | goal (<= 0.5 and < 20 us): {met}")
        # Sanity only (not a timing assertion): both compositions really ran.
        assert o > 0 and t > 0


async def measure_metrics(attempt: Attempt) -> tuple[list[float], int]:
    """Median us per call: bare attempt, chain without listeners, chain with the run's."""
    recorder = ChainRecorder()
    recorder.track("BANK000001", max_attempts=3)
    listeners: list[Listener] = [recorder, EventLog(clock=SystemClock())]
    medians = await interleaved(attempt, ours(attempt), ours(attempt, listeners))
    return medians, recorder.providers["BANK000001"].by_kind["success"]


def test_metrics_cost_on_the_hot_path_on_vs_off() -> None:
    print()
    for name, attempt in (("attempt returns at once", noop_attempt),
                          ("attempt yields once", yielding_attempt)):
        (base, off, on), calls = asyncio.run(measure_metrics(attempt))
        extra = on - off
        met = "met" if extra < 5.0 else "NOT met"
        print(f"[{name}] bare {base:6.2f} us | chain, metrics off {off:6.2f} us (overhead "
              f"{off - base:6.2f}) | metrics on {on:6.2f} us (overhead {on - base:6.2f}) | "
              f"metrics cost {extra:5.2f} us a call | goal (< 5 us): {met}")
        # Sanity only (not a timing assertion): the listener really counted every call.
        assert calls == ROUNDS * (CALLS + 500)
