"""The chain's cost a call in instructions (cachegrind), not in time: a change of a few
hundred nanoseconds shows at once and the same on every run, where the timed benchmarks of
this shared two-core machine swing by more than that between rounds.

Run: ``pytest -s tests/bench/test_chain_instructions.py`` (needs ``valgrind``; skipped
without it). Each case runs in a child Python under ``valgrind --tool=cachegrind`` twice,
with ``CHAIN_INSN_CALLS`` calls and with six times as many; the difference over the extra
calls is the instructions a call, start-up and imports cancelled out. Cases, side by side:

bare            the attempt alone (returns at once / yields once to the loop, as I/O does)
chain           ``ProviderChain.call`` over it: breaker, budget, limiter, bulkhead, the
                attempt's timeout, the outcome recorded by the breaker
chain+recorder  the same with the run's metrics recorder listening (its call sink)

Printed: instructions a call and ours (case - bare). Only sanity is asserted (the counts
came out, and the chain costs something): the figures are the instrument. Compare two
versions by running this file in each (``git worktree``); ``tests/bench/test_chain_overhead.py``
gives the same cases in microseconds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CALLS = int(os.environ.get("CHAIN_INSN_CALLS", "2000"))
ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import asyncio, sys
    from tests.bench.test_chain_overhead import noop_attempt, ours, yielding_attempt
    n, which, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    attempt = yielding_attempt if which == "yields" else noop_attempt

    async def main():
        if mode == "bare":
            def one():
                return attempt(23.0)
        elif mode == "recorder":
            from batch.observe.recorder import ChainRecorder
            one = ours(attempt, (ChainRecorder(),))
        else:
            one = ours(attempt)
        for _ in range(n):
            await one()
    asyncio.run(main())
""")


def _instructions(calls: int, which: str, mode: str) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, "-c", CHILD, str(calls), which, mode],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0"})
    m = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    assert m, out.stderr[-2000:]
    return int(m.group(1).replace(",", ""))


def per_call(which: str, mode: str) -> float:
    """Instructions a call: the run of 6 x CALLS against the run of CALLS."""
    return (_instructions(6 * CALLS, which, mode) - _instructions(CALLS, which, mode)) / (
        5 * CALLS)


@pytest.mark.timeout(3600)
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_chain_instructions_a_call() -> None:
    print(f"\n== the chain in instructions a call (cachegrind; {CALLS:,} and {6 * CALLS:,} "
          "calls a case) ==")
    print(f"    {'attempt':<16} {'bare':>9} {'chain':>9} {'ours':>9} {'+recorder':>10} "
          f"{'ours':>9}")
    for which in ("returns", "yields"):
        bare = per_call(which, "bare")
        chain = per_call(which, "chain")
        recorded = per_call(which, "recorder")
        print(f"    {which + ' at once' if which == 'returns' else 'yields once':<16} "
              f"{bare:9,.0f} {chain:9,.0f} {chain - bare:9,.0f} {recorded:10,.0f} "
              f"{recorded - bare:9,.0f}")
        assert bare > 0 and chain > bare and recorded > chain
