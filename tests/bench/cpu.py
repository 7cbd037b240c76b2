"""Where a benchmark's cores went: CPU seconds of other processes, read from ``/proc``.

On these 2-core machines the client, the simulator and the database server share the
cores, so a row's calls/s is the client's cost only if its loop's thread was busy all the
time; these say who else was using them (Linux only)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """Process ``pid``'s CPU time so far (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def server_cpu(name: str = "postgres") -> dict[int, float]:
    """CPU time so far of every process whose command line starts with ``name`` (the
    PostgreSQL server's backends and its workers), by pid."""
    out: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if Path(entry.path, "cmdline").read_bytes().startswith(name.encode()):
                out[int(entry.name)] = cpu_seconds(int(entry.name))
        except (OSError, ValueError, IndexError):  # ended meanwhile
            continue
    return out


def server_cpu_since(before: dict[int, float], name: str = "postgres") -> float:
    """CPU seconds the server's processes used since ``before`` (:func:`server_cpu`): the
    processes alive now (one that ended meanwhile is left out; a run's own connections
    live through it)."""
    return sum(t - before.get(pid, 0.0) for pid, t in server_cpu(name).items())


@dataclass
class Shares:
    """The shares of one core each had over ``wall`` seconds (1.0 = one core)."""

    wall: float = 0.0
    loop: float = 0.0  # the thread that ran the block (the event loop's)
    process: float = 0.0  # this process, every thread (SQLite's included)
    simulator: float = 0.0
    database: float = 0.0  # PostgreSQL's server processes

    def line(self) -> str:
        return (f"the loop's thread {self.loop:.0%}, this process {self.process:.0%}, the "
                f"simulator {self.simulator:.0%}, PostgreSQL's server {self.database:.0%} "
                f"(of one core, over {self.wall:.1f} s)")


@contextmanager
def shares(simulator_pid: int | None) -> Iterator[Shares]:
    """Measure :class:`Shares` over the block (the calling thread is the loop's)."""
    import time

    out = Shares()
    t0, p0, l0 = time.monotonic(), time.process_time(), time.thread_time()
    s0 = cpu_seconds(simulator_pid) if simulator_pid else 0.0
    d0 = server_cpu()
    try:
        yield out
    finally:
        wall = time.monotonic() - t0 or 1e-9
        out.wall = wall
        out.loop = (time.thread_time() - l0) / wall
        out.process = (time.process_time() - p0) / wall
        out.simulator = (cpu_seconds(simulator_pid) - s0) / wall if simulator_pid else 0.0
        out.database = server_cpu_since(d0) / wall
