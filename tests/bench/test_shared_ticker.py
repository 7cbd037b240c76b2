"""One timer per provider (what the dispatcher does) against one ticker for all providers.

Run: ``pytest -s tests/bench/test_shared_ticker.py`` (``TICKER_BENCH_PROVIDERS``,
``TICKER_BENCH_SECONDS``, ``TICKER_BENCH_ROUNDS``). Issue 12 asked for one timer for all
providers' 100 ms slices instead of one per provider *if it measures better*; this is that
measurement, in one process, the two alternated in one run, nothing else on the loop but the
ticks and their starts:

- **per provider** (``batch/dispatch/provider.py``): each provider's consumer sleeps until
  its own next slice with something to start (``asyncio.sleep``: one timer each), at its own
  offset into the slice, its starts on its own slices (``slice_counts`` with phase i/N);
- **shared**: one task sleeps to each slice's start and wakes the consumers due in that
  slice (one future each; a consumer wakes only for its starts, as now).

At 2 refreshes/s per provider each start is a detached task whose first step burns
``START_US`` microseconds (a refresh's first step: the chain, the request built and sent).
Printed per mode: the loop's CPU share, and the ticks' lateness p50/p99/max in ms (from each
provider's own deadline: its offset into the slice per provider, the slice's start shared).
Nothing is asserted about the figures.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import zlib
from collections import defaultdict, deque

from batch.dispatch.pacing import SLICE_SECONDS, SLICES_PER_MINUTE, percentile, slice_counts

PROVIDERS = int(os.environ.get("TICKER_BENCH_PROVIDERS", "300"))
SECONDS = float(os.environ.get("TICKER_BENCH_SECONDS", "15"))
ROUNDS = int(os.environ.get("TICKER_BENCH_ROUNDS", "3"))
PER_MINUTE = 120  # 2 refreshes/s
START_US = 200


def _burn() -> None:
    end = time.perf_counter() + START_US / 1e6
    while time.perf_counter() < end:
        pass


async def _start() -> None:
    _burn()


def _plans() -> list[list[int]]:
    """Each provider's slice counts for a minute (phase i/N, as the run gives them)."""
    return [slice_counts(PER_MINUTE, SLICES_PER_MINUTE, i / PROVIDERS)
            for i in range(PROVIDERS)]


def _offset(i: int) -> float:
    return zlib.crc32(f"BANK{i:06d}".encode()) % 1000 / 1000 * SLICE_SECONDS


async def _per_provider(t0: float, slices: int) -> list[float]:
    late: list[float] = []
    tasks: set[asyncio.Task[None]] = set()

    async def consumer(i: int, counts: list[int]) -> None:
        off = _offset(i)
        for k in range(slices):
            n = counts[k % SLICES_PER_MINUTE]
            if not n:
                continue
            deadline = t0 + off + k * SLICE_SECONDS
            delay = deadline - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            late.append(time.monotonic() - deadline)
            for _ in range(n):
                t = asyncio.create_task(_start())
                tasks.add(t)
                t.add_done_callback(tasks.discard)

    await asyncio.gather(*(consumer(i, c) for i, c in enumerate(_plans())))
    await asyncio.gather(*tasks)
    return late


async def _shared(t0: float, slices: int) -> list[float]:
    late: list[float] = []
    tasks: set[asyncio.Task[None]] = set()
    plans = _plans()
    due: dict[int, list[int]] = defaultdict(list)  # slice of the minute -> providers
    for i, counts in enumerate(plans):
        for k, n in enumerate(counts):
            if n:
                due[k].append(i)
    waiting: dict[int, asyncio.Future[float]] = {}  # a consumer's wake-up, once it waits
    behind: dict[int, deque[float]] = defaultdict(deque)  # ticks a busy consumer missed

    async def ticker() -> None:
        for k in range(slices):
            who = due.get(k % SLICES_PER_MINUTE)
            if not who:
                continue
            deadline = t0 + k * SLICE_SECONDS
            delay = deadline - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            for i in who:
                fut = waiting.pop(i, None)
                if fut is None:
                    behind[i].append(deadline)
                else:
                    fut.set_result(deadline)

    async def consumer(i: int, counts: list[int]) -> None:
        loop = asyncio.get_running_loop()
        for k in range(slices):
            n = counts[k % SLICES_PER_MINUTE]
            if not n:
                continue
            if behind[i]:
                deadline = behind[i].popleft()
            else:
                fut = waiting[i] = loop.create_future()
                deadline = await fut
            late.append(time.monotonic() - deadline)
            for _ in range(n):
                t = asyncio.create_task(_start())
                tasks.add(t)
                t.add_done_callback(tasks.discard)

    await asyncio.gather(ticker(), *(consumer(i, c) for i, c in enumerate(plans)))
    await asyncio.gather(*tasks)
    return late


def _measure(mode: str) -> dict[str, float]:
    slices = int(SECONDS / SLICE_SECONDS)

    async def main() -> tuple[list[float], float, float]:
        t0 = time.monotonic() + 0.5
        c0 = time.process_time()
        late = await (_per_provider if mode == "per provider" else _shared)(t0, slices)
        return late, time.process_time() - c0, time.monotonic() - t0 + 0.5

    late, cpu, wall = asyncio.run(main())
    late.sort()
    return {"ticks": len(late), "cpu": cpu / wall, "p50": percentile(late, 50) * 1e3,
            "p99": percentile(late, 99) * 1e3, "max": late[-1] * 1e3}


def test_one_timer_per_provider_against_one_shared_ticker() -> None:
    rounds = [(mode, _measure(mode)) for _ in range(ROUNDS)
              for mode in ("per provider", "shared")]
    print(f"\n== {PROVIDERS} providers x 2 starts/s, {SECONDS:g} s a run, each start "
          f"{START_US} us of work, {ROUNDS} rounds alternated, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f} ==")
    print(f"    {'timers':<16}{'ticks':>8}{'cpu':>7}{'late p50':>10}{'p99':>8}{'max ms':>8}")
    for mode, f in rounds:
        print(f"    {mode:<16}{f['ticks']:>8,}{f['cpu']:>7.1%}{f['p50']:>10.2f}"
              f"{f['p99']:>8.2f}{f['max']:>8.2f}")

    def median(mode: str, key: str) -> float:
        return statistics.median(f[key] for m, f in rounds if m == mode)

    print("    medians, shared / per provider: "
          + ", ".join(f"{k} {median('shared', k):.2f} / {median('per provider', k):.2f} = "
                      f"{median('shared', k) / max(median('per provider', k), 1e-9):.2f}x"
                      for k in ("cpu", "p50", "p99")))
    assert len({f["ticks"] for _, f in rounds}) == 1
