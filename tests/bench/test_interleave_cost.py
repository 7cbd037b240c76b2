"""What our microseconds measured alone cost once they run between real HTTP calls.

Run: ``pytest -s tests/bench/test_interleave_cost.py`` (``INTERLEAVE_BENCH_ROUNDS``,
``INTERLEAVE_BENCH_SECONDS``). ``test_dispatch_in_process.py`` measures our part of a call
without the network (about 20 us a call on 2026-12-06's machine), while the dispatch
benchmark's (b) row costs about 30 us a call more than its (a3) over real sockets. This
says where the difference goes: (a3) against the simulator over HTTP, alternated with the
same loop running a fixed piece of Python between its calls (objects made and dropped, a
dict filled, small calls: the kind of work the chain, the dispatcher and the metrics do),
whose cost alone is timed before and after. Interleaved with the HTTP layer's, such work
costs more than alone (the caches and the branch predictor are shared: each side evicts
the other's), and the HTTP layer's own cost rises with it.

Printed: each round's CPU a call (``time.process_time`` over calls made) and calls/s, the
medians, the work's cost alone and added, the inflation (added / alone), and what that
leaves for our part measured alone under the dispatch benchmark's goal (the full path at
0.8x of (a3): at most a quarter of (a3)'s cost added). Nothing about the times is asserted.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import pytest

from tests.bench.test_dispatch_throughput import Setup, client_loop, setup

__all__ = ["setup"]  # the fixture, used below

ROUNDS = int(os.environ.get("INTERLEAVE_BENCH_ROUNDS", "4"))
SECONDS = float(os.environ.get("INTERLEAVE_BENCH_SECONDS", "4"))
CONCURRENCY = 50  # (a3)'s best on this machine (test_dispatch_throughput.py)
#: iterations of the work's loop: about 15-20 us alone
SIZE = 60


class _Item:
    __slots__ = ("key", "pair", "value")

    def __init__(self, value: int, key: str, pair: tuple[int, int]) -> None:
        self.value = value
        self.key = key
        self.pair = pair


def work(size: int = SIZE) -> int:
    """A fixed piece of Python like ours: objects made and dropped, a dict, small calls."""
    seen: dict[str, _Item] = {}
    total = 0
    for i in range(size):
        item = _Item(i, str(i), (i, i))
        seen[item.key] = item
        total += len(item.pair)
    return total


def _alone(n: int = 20_000) -> float:
    """The work's CPU seconds a run, alone in a tight loop."""
    c0 = time.process_time()
    for _ in range(n):
        work()
    return (time.process_time() - c0) / n


@pytest.mark.timeout(900)
def test_interleaved_work_costs_more_than_alone(setup: Setup) -> None:
    alone = [_alone()]
    rows: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(ROUNDS):
        for with_work in (False, True):
            c0 = time.process_time()
            calls, ok = asyncio.run(client_loop(setup.insts, CONCURRENCY, SECONDS,
                                                work=work if with_work else None))
            assert ok == calls > 0, (ok, calls)
            rows[with_work].append(((time.process_time() - c0) / calls, calls / SECONDS))
    alone.append(_alone())
    plain = statistics.median(c for c, _ in rows[False])
    mixed = statistics.median(c for c, _ in rows[True])
    solo = statistics.median(alone)
    added = mixed - plain
    print(f"\n== (a3) over HTTP with and without {1e6 * solo:.1f} us of Python between its "
          f"calls, concurrency {CONCURRENCY}, {ROUNDS} rounds of {SECONDS:g} s taking turns ==")
    for with_work in (False, True):
        label = "(a3) + the work" if with_work else "(a3)"
        rounds = ", ".join(f"{1e6 * c:.1f} us ({r:,.0f}/s)" for c, r in rows[with_work])
        print(f"  {label:<16} median {1e6 * statistics.median(c for c, _ in rows[with_work]):6.1f}"
              f" us a call  (rounds {rounds})")
    print(f"  the work alone: {', '.join(f'{1e6 * a:.1f}' for a in alone)} us (before, after)")
    print(f"  added between the calls: {1e6 * added:.1f} us a call, {added / solo:.2f}x its "
          "cost alone")
    budget = plain / 4
    print(f"  the goal (0.8x of (a3)) allows {1e6 * budget:.1f} us a call added: about "
          f"{1e6 * budget * solo / added:.1f} us of our work measured alone "
          "(test_dispatch_in_process.py's 'ours a call')")
