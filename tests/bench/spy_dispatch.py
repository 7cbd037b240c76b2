"""Where the CPU goes on the full path, sampled: py-spy against a saturated ``run_day``.

Run: ``make profile PROFILER=py-spy`` (the same ``PROFILE_BACKEND``, ``PROFILE_RATE``,
``PROFILE_PROVIDERS`` and ``PROFILE_TOP`` as ``profile_dispatch.py``). cProfile charges a
hook to every Python call and to every resumption of every coroutine in an await chain ten
deep, so it triples a call's cost and swells the small, much-awaited functions; py-spy reads
the process's stacks from outside, 250 times a second, and the run goes at its own speed.
Only the samples of a running thread count (a thread asleep in ``select`` or a lock is
left out), the database driver's threads included; py-spy's idle test is not exact: part
of aiosqlite's thread waiting in its queue (``core.py:59``) is counted as running (300
providers, 2026-12-06: the driver's threads 13 % of the samples, 90 us a call, against 58
us of their CPU read from ``/proc/self/task`` in a run by hand).

Each sample is put in one place, by the frames on its stack (``classify``):

- **the HTTP layer, which (a3) runs too**: the client's request building, the transport's
  send and read, the classification of the answer (under ``MydataClient._attempt``), the
  client's refresh outside the chain, and aiohttp's and httpx's callbacks on the loop;
- **ours**: the chain's own work (under ``ProviderChain.call``, not in the attempt), the
  dispatcher, the database (SQLAlchemy, the drivers and their threads, ``batch/db``), the
  metrics, the rest of ``batch/``;
- **the event loop**: asyncio's own turn (both run it);
- **(a3)'s workers**, in a profile of (a3) itself (``PROFILE_BASELINE=a3``): its worker loop
  and pass-through chain, what stands there for the dispatcher and the chain.

Printed: each place's share of the samples and, from this process's CPU time over the
calls made, its microseconds of CPU a call; then the lines of ours that the most samples
stopped in. The raw stacks are saved to ``PROFILE_OUT`` (default: a temporary directory;
the path is printed; ``flamegraph.pl`` or speedscope read them).

py-spy stops the process for each sample (its default), so that every stack it reads is one
the thread was really in. ``PROFILE_SPY_NONBLOCKING=1`` reads them while the process runs,
as this script did until 2026-12-07 (py-spy's help: "may lead to inaccurate results"), and
samples piled up on lines of ours that hardly run. On the in-process run
(``test_dispatch_in_process.py``, PostgreSQL, two 60 s samplings one after the other) the
chain's ``await attempt(t)`` line held 2.82 % of the samples read while running against
0.85 % read stopped, its ``return out`` 2.42 % against none, and the recorder's exemplar
line 1.21 % against none. A saturated PostgreSQL ``run_day`` (``PROFILE_RATE=6500``), read
running then stopped: the chain 9.0 % then 6.9 % of the samples, ours in all 20.1 % then
16.4 % (30 then 27 us a call). Stopping the process costs it a little: 151 then 163 us of
CPU a call, (a3) 125 then 134.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RATE = 250  # samples a second

HTTP = "HTTP layer ((a3) runs it too)"
LOOP = "event loop (both)"
CHAIN, DISPATCH, DB, METRICS, OURS = (
    "ours: chain", "ours: dispatcher", "ours: database", "ours: metrics", "ours: other batch/")
#: (a3)'s own loop around the client (``PROFILE_BASELINE=a3``): its workers and pass-through
HARNESS = "(a3)'s workers (the harness)"
PLACES = (HTTP, LOOP, CHAIN, DISPATCH, DB, METRICS, OURS, HARNESS)
_HTTP_LIBS = ("aiohttp/", "httpx/", "httpx_aiohttp/", "yarl/", "multidict/")
_DB_LIBS = ("sqlalchemy/", "aiosqlite/", "asyncpg/", "batch/db/")


def py_spy() -> str:
    """The py-spy beside this interpreter (the bench extra installs it), else on PATH."""
    here = Path(sysconfig.get_path("scripts")) / "py-spy"
    found = str(here) if here.exists() else shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy not found: make install (the bench extra) installs it")
    return found


@contextmanager
def sampling(out: Path, pid: int | None = None) -> Iterator[None]:
    """py-spy records process ``pid`` (this one) while the block runs, into ``out``."""
    proc = subprocess.Popen(
        [py_spy(), "record", "--pid", str(pid or os.getpid()), "--rate", str(RATE),
         *(["--nonblocking"] if os.environ.get("PROFILE_SPY_NONBLOCKING") == "1" else []),
         "--format", "raw", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes what it has and stops
        _, err = proc.communicate(timeout=60)
        if not out.exists():
            raise SystemExit(f"py-spy wrote nothing: {err.strip()}")


def stacks(raw: Path) -> Iterator[tuple[list[str], int]]:
    """``flamegraph.pl``'s collapsed format: frames root first, ``;``-joined, a count."""
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield stack.split(";"), int(count)


def _innermost(frames: list[str], function: str) -> int:
    """Index of the innermost frame of ``function`` (-1: none on the stack)."""
    for i in range(len(frames) - 1, -1, -1):
        if frames[i].startswith(function + " "):
            return i
    return -1


def classify(frames: list[str]) -> str:
    """The place one sample's stack belongs to (the module docstring's list)."""
    attempt = _innermost(frames, "MydataClient._attempt")
    chain = _innermost(frames, "ProviderChain.call")
    if chain > attempt:  # in the chain, not (or no longer) inside the HTTP attempt
        return CHAIN
    if attempt >= 0:
        return HTTP
    if "tests/bench/" in frames[-1]:
        return HARNESS  # (a3)'s worker loop or pass-through chain, in its own frame
    joined = ";".join(frames)
    if "MydataClient." in joined:
        return HTTP  # the client's refresh around its calls, as (a3) runs it
    if any(lib in joined for lib in _DB_LIBS):
        return DB
    if any(lib in joined for lib in _HTTP_LIBS):
        return HTTP  # the loop's callbacks into aiohttp (data received, connection made)
    if "batch/dispatch/" in joined:
        return DISPATCH
    if "batch/observe/" in joined:
        return METRICS
    if "batch/" in joined:
        return OURS
    return LOOP


def report(raw: Path, *, cpu: float, calls: int, top: int = 25) -> str:
    """The places' shares and CPU a call, then ours' busiest lines."""
    places: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    total = 0
    for frames, n in stacks(raw):
        total += n
        place = classify(frames)
        places[place] += n
        if place.startswith("ours"):
            i = len(frames) - 1  # the database's: where the driver was
            if place != DB:
                i = next((j for j in range(i, -1, -1) if "batch/" in frames[j]), i)
            lines[f"{place[6:16]:>10}  {frames[i]}"] += n
    if not total:
        return "no samples"
    per_call = 1e6 * cpu / calls if calls else 0.0
    out = [f"{total:,} samples of running threads; this process {cpu:.1f} s of CPU for "
           f"{calls:,} calls = {per_call:.0f} us a call"]
    ours = sum(v for k, v in places.items() if k.startswith("ours"))
    for place in PLACES:
        if place == HARNESS and not places[place]:
            continue  # a run_day profile has none
        share = places[place] / total
        out.append(f"  {share:6.1%}  {share * per_call:6.0f} us a call  {place}")
    out.append(f"  {ours / total:6.1%}  {ours / total * per_call:6.0f} us a call  ours in all")
    out.append("where ours stopped (innermost frame of batch/, or the database's):")
    for key, n in lines.most_common(top):
        out.append(f"  {n / total:6.2%}  {key}")
    return "\n".join(out)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]), cpu=float(sys.argv[2]), calls=int(sys.argv[3])))
