"""A worker's cached view of the cluster circuit: which providers are open, and whether it
is one of the probe workers.

:meth:`CircuitView.refresh` reads the states, the overrides and the coordinator's beat in
one round trip every ``refresh_interval``; verdicts between reads come from that cache, so
asking costs no I/O. A read is fresh when Redis answered and the coordinator's beat is
younger than ``coordinator_stale_after`` by the server's clock. When reads stop being
fresh (Redis or the coordinator lost) the worker keeps its last list for ``keep_last_for``
seconds, then answers LOCAL: the caller relies on its local breakers alone. Each change of
mode is logged once (``circuit_mode``) and shown by :meth:`status`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from batch.clock import Clock
from batch.cluster.circuit import (
    CircuitSettings,
    CircuitState,
    Forced,
    ProviderCircuit,
    ViewMode,
    probe_workers,
    view_mode,
)
from batch.cluster.circuit_redis import CircuitStore
from batch.errors import describe

log = logging.getLogger("mydata.cluster")

#: the live workers' ids, oldest first (the registry's ``live_workers()``)
LiveWorkers = Callable[[], Awaitable[Sequence[str]]]
#: called with (org_code, old state, new state) when a provider's cached state changes
ChangeHook = Callable[[str, CircuitState, CircuitState], None]
#: called with (old mode, new mode) when the view's mode changes
ModeHook = Callable[[ViewMode, ViewMode], None]


class CircuitView:
    """One worker's cache of the open list, its mode and its probe designation."""

    def __init__(self, store: CircuitStore, *, worker_id: str, clock: Clock,
                 live_workers: LiveWorkers | None = None) -> None:
        self.store = store
        self.settings: CircuitSettings = store.settings
        self.worker_id = worker_id
        self._clock = clock
        self._live_workers = live_workers
        self._states: dict[str, CircuitState] = {}
        self._reasons: dict[str, tuple[str, float]] = {}
        self._fresh_at: float | None = None
        self._fresh = False
        self._mode = ViewMode.LOCAL
        self._probe = False
        self._hooks: list[ChangeHook] = []
        self._mode_hooks: list[ModeHook] = []
        self.last_error: str | None = None
        self.leader: str | None = None
        self.reads = 0
        #: times the view left CLUSTER mode (went stale or local), and the modes it was in
        self.left_cluster = 0
        self.modes_seen: set[ViewMode] = set()
        #: set after every refresh (tests wait on it rather than sleeping)
        self.refreshed = asyncio.Event()

    # -- reading the cache (no I/O) ----------------------------------------------------
    def mode(self) -> ViewMode:
        """The mode now (between refreshes a kept list can expire: STALE becomes LOCAL)."""
        return view_mode(now=self._clock.monotonic(), fresh_at=self._fresh_at,
                         fresh=self._fresh, keep_last_for=self.settings.keep_last_for)

    def state(self, org_code: str) -> CircuitState | None:
        """The provider's cluster state, or None when only the local breaker decides."""
        if self.mode() is ViewMode.LOCAL:
            return None
        return self._states.get(org_code, CircuitState.CLOSED)

    def is_open(self, org_code: str) -> bool:
        s = self.state(org_code)
        return s is not None and s.is_open

    @property
    def is_probe_worker(self) -> bool:
        return self._probe

    def on_change(self, hook: ChangeHook) -> None:
        self._hooks.append(hook)

    def on_mode(self, hook: ModeHook) -> None:
        """``hook(old, new)`` on each change of mode, seen at a refresh."""
        self._mode_hooks.append(hook)

    def status(self) -> dict[str, object]:
        """For the run summary and logs: mode, how old the list is, what is open."""
        now = self._clock.monotonic()
        return {
            "mode": str(self.mode()),
            "list_age_s": round(now - self._fresh_at, 3) if self._fresh_at is not None
            else None,
            "open": {org: {"state": str(s), "reason": self._reasons.get(org, ("", 0.0))[0],
                           "since": self._reasons.get(org, ("", 0.0))[1]}
                     for org, s in sorted(self._states.items()) if s.is_open},
            "probe_worker": self._probe,
            "coordinator": self.leader,
            "last_error": self.last_error,
            "left_cluster": self.left_cluster,
            "modes_seen": sorted(str(m) for m in self.modes_seen),
        }

    # -- reading Redis -----------------------------------------------------------------
    async def refresh(self) -> ViewMode:
        """One read of the list (and the live workers); returns the mode after it."""
        self.reads += 1
        try:
            v = await self.store.read_view()
        except Exception as exc:
            self.last_error = describe(exc)
            self._fresh = False
        else:
            beat_ok = v.beat_at is not None and \
                v.now - v.beat_at <= self.settings.coordinator_stale_after
            self.leader = v.leader
            if beat_ok:
                self.last_error = None
                self._apply(v.states, v.forced)
                self._fresh, self._fresh_at = True, self._clock.monotonic()
            else:
                self.last_error = "coordinator beat missing or stale"
                self._fresh = False
                # Operator overrides need no coordinator: they apply to the kept list.
                if self._fresh_at is not None and v.forced:
                    self._apply_forced(v.forced)
        if self._live_workers is not None:
            try:
                self._probe = self.worker_id in probe_workers(await self._live_workers())
            except Exception as exc:
                log.warning("live workers unknown; probe designation kept", extra={
                    "action": "live_workers_failed", "error": describe(exc)})
        mode = self.mode()
        self.modes_seen.add(mode)
        if mode is not self._mode:
            if self._mode is ViewMode.CLUSTER:
                self.left_cluster += 1
            (log.info if mode is ViewMode.CLUSTER else log.warning)(
                "cluster circuit: %s", _MODE_TEXT[mode], extra={
                    "action": "circuit_mode", "mode": str(mode), "previous": str(self._mode),
                    "worker_id": self.worker_id, "error": self.last_error})
            old, self._mode = self._mode, mode
            for hook in self._mode_hooks:
                try:
                    hook(old, mode)
                except Exception:
                    log.exception("circuit mode hook failed")
        self.refreshed.set()
        return mode

    def _apply(self, states: dict[str, ProviderCircuit], forced: dict[str, Forced]) -> None:
        new = {org: s.state for org, s in states.items()}
        reasons = {org: (s.reason, s.since) for org, s in states.items()}
        for org, f in forced.items():  # an override applies before the coordinator echoes it
            new[org] = f.state
            reasons[org] = (f"forced: {f.reason}", f.since)
        self._set(new, reasons)

    def _apply_forced(self, forced: dict[str, Forced]) -> None:
        new = dict(self._states)
        reasons = dict(self._reasons)
        for org, f in forced.items():
            new[org] = f.state
            reasons[org] = (f"forced: {f.reason}", f.since)
        self._set(new, reasons)

    def _set(self, new: dict[str, CircuitState],
             reasons: dict[str, tuple[str, float]]) -> None:
        old = self._states
        self._states, self._reasons = new, reasons
        for org in sorted(set(old) | set(new)):
            a = old.get(org, CircuitState.CLOSED)
            b = new.get(org, CircuitState.CLOSED)
            if a is not b:
                log.warning("cluster circuit %s for %s, seen by %s", b, org, self.worker_id,
                            extra={"action": "circuit_seen", "org_code": org,
                                   "state": str(b), "previous": str(a),
                                   "worker_id": self.worker_id,
                                   "clock_s": round(self._clock.monotonic(), 3)})
                for hook in self._hooks:
                    try:
                        hook(org, a, b)
                    except Exception:
                        log.exception("circuit change hook failed")

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every ``refresh_interval`` until ``stop``."""
        while not stop.is_set():
            await self.refresh()
            try:
                async with self._clock.timeout(self.settings.refresh_interval):
                    await stop.wait()
            except TimeoutError:
                pass

    async def reserve_probe(self, org_code: str) -> bool:
        """A cluster-wide probe reservation for one call (False on any Redis error)."""
        try:
            return await self.store.reserve_probe(org_code, self.worker_id)
        except Exception as exc:
            self.last_error = describe(exc)
            return False


_MODE_TEXT = {
    ViewMode.CLUSTER: "following the coordinator's list",
    ViewMode.STALE: "Redis or the coordinator lost; keeping the last list for a while",
    ViewMode.LOCAL: "no usable list; local breakers only",
}
