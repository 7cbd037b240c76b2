"""Run the simulator out of process: ``python -m batch.cli simulate`` as a subprocess.

Benchmarks and crash tests use it so the simulator never shares the client's event loop
or CPU core. Readiness is every provider answering ``{base_url}/_sim/stats``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import batch
from batch.config import load_institutions
from batch.errors import MydataError
from planning.windows import Window


class SimulatorStartError(MydataError):
    """The simulator subprocess exited or did not answer in time."""


def _get(url: str, *, method: str = "GET", timeout: float = 5.0) -> dict[str, Any]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


class SimulatorProcess:
    """``with SimulatorProcess("institutions.toml") as sim: ... sim.stats()``."""

    def __init__(
        self,
        institutions_path: str | Path,
        *,
        scenario_path: str | Path | None = None,
        window_override: Sequence[Window | str] | None = None,
        seed: int = 0,
        startup_timeout: float = 30.0,
    ) -> None:
        self.institutions_path = Path(institutions_path)
        self.scenario_path = Path(scenario_path) if scenario_path is not None else None
        self.window_override = [str(w) for w in window_override or ()]
        self.seed = seed
        self.startup_timeout = startup_timeout
        self.urls = {p.org_code: p.base_url
                     for p in load_institutions(self.institutions_path).providers}
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None
        self.output = ""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def admin_url(self) -> str:
        return next(iter(self.urls.values()))

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "batch.cli", "simulate",
               "--institutions", str(self.institutions_path), "--seed", str(self.seed)]
        if self.scenario_path is not None:
            cmd += ["--scenario", str(self.scenario_path)]
        for w in self.window_override:
            cmd += ["--window-override", w]
        return cmd

    def start(self) -> None:
        root = str(Path(batch.__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self._out = tempfile.TemporaryFile()  # noqa: SIM115 (closed in _collect)
        self._proc = subprocess.Popen(self.command(), stdout=self._out,
                                      stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.startup_timeout
        pending = list(self.urls.values())
        while pending:
            if self._proc.poll() is not None:
                self._collect()
                last = self.output.strip().splitlines()[-1:] or [""]
                raise SimulatorStartError(
                    f"simulator exited with {self._proc.returncode}: {last[0]}")
            if time.monotonic() > deadline:
                self.stop()
                raise SimulatorStartError(
                    f"simulator did not answer within {self.startup_timeout:g} s at "
                    f"{', '.join(pending)}")
            try:
                _get(f"{pending[0]}/_sim/stats", timeout=1.0)
                pending.pop(0)
            except (urllib.error.URLError, OSError, ValueError):
                time.sleep(0.05)  # real time: waiting for another process to bind

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; keeps what it printed in ``output``."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._collect()
        self._proc = None

    def _collect(self) -> None:
        if self._out is not None:
            self._out.seek(0)
            self.output = self._out.read().decode(errors="replace")
            self._out.close()
            self._out = None

    def stats(self, *, detail: bool = False) -> dict[str, Any]:
        q = "?detail=consents" if detail else ""
        return _get(f"{self.admin_url}/_sim/stats{q}")

    def reset(self) -> None:
        _get(f"{self.admin_url}/_sim/reset", method="POST")

    async def stats_async(self, *, detail: bool = False) -> dict[str, Any]:
        return await asyncio.to_thread(lambda: self.stats(detail=detail))

    async def reset_async(self) -> None:
        await asyncio.to_thread(self.reset)

    def __enter__(self) -> SimulatorProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> SimulatorProcess:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)
