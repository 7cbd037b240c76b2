"""A worker's cluster session: its registry row kept alive, the shared limits refilled, the
fall-back to local limits while Redis is gone.

- Presence: a heartbeat every ``heartbeat`` seconds; each beat also reaps workers seen dead
  (batch/cluster/registry.py) and refreshes the live count. ``stopped_at`` at the end.
- Shared rate: every slice, one pipelined round trip reserves each provider's permits
  (batch/cluster/permits.py, scripts.py); a 42902 seen here lowers the cluster's rate.
- Redis lost (an error or a timeout on any round trip): every provider's limiter runs
  alone at its rate divided by the live workers, loudly logged and counted for the summary;
  Redis is tried again every second, and the shared limit comes back with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from redis import exceptions as redis_exceptions
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.aio import cancel_and_wait
from batch.clock import Clock
from batch.cluster import registry
from batch.cluster.allowance import SharedAllowance
from batch.cluster.circuit import CircuitSettings, ProviderCircuit
from batch.cluster.circuit_node import CircuitNode
from batch.cluster.permits import SLICE, PermitStock, ServerClock
from batch.cluster.scripts import Keys, RateAsk, Scripts
from batch.db.nodes import heartbeat
from batch.errors import InputError, describe
from batch.resilience.bulkhead import worker_share
from batch.resilience.chain import ProviderChain
from batch.resilience.limiter import DECREASE_GAP

log = logging.getLogger("mydata.cluster")

#: the window a provider counts its limit over (seconds): any 1-second window
PROVIDER_WINDOW = 1.0


class RedisUnreachable(InputError):
    """Cluster mode asked for, Redis not answering at the start."""


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    redis_url: str
    #: seconds between heartbeats, and without one before a worker is dead (clock seconds)
    heartbeat: float = 3.0
    dead_after: float = 15.0
    namespace: str = "mydata"
    #: how far ahead a worker reserves shared permits (seconds)
    horizon: float = 0.3
    #: a Redis round trip slower than this counts as Redis lost (real seconds)
    redis_timeout: float = 0.5
    #: the cluster circuit's settings (env MYDATA_CIRCUIT; None: the defaults)
    circuit: CircuitSettings | None = None

    def __post_init__(self) -> None:
        if not self.redis_url:
            raise ValueError("redis_url is empty")
        if not 0 < self.heartbeat < self.dead_after:
            raise ValueError("heartbeat must be positive and shorter than dead_after")
        if self.horizon <= 0 or self.redis_timeout <= 0:
            raise ValueError("horizon and redis_timeout must be positive")


def _speed(clock: Clock) -> float:
    speed = getattr(clock, "speed", 1.0)
    return float(speed) if isinstance(speed, int | float) and speed > 0 else 1.0


def redis_client(url: str, timeout: float) -> Redis:
    return Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                          health_check_interval=0)


async def check_redis(url: str, timeout: float = 2.0) -> None:
    """RedisUnreachable (one line, exit 2) unless Redis answers a PING."""
    client = redis_client(url, timeout)
    try:
        await client.ping()
    except Exception as exc:
        raise RedisUnreachable(
            f"cluster mode: Redis at {_redact(url)} is unreachable ({describe(exc)}); "
            "start it or run without --redis") from None
    finally:
        await client.aclose()


def _redact(url: str) -> str:
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url


class ClusterSession:
    """What ``run --redis`` adds to one worker (the runner's ``cluster`` hooks)."""

    def __init__(self, engine: AsyncEngine, *, clock: Clock, options: ClusterOptions) -> None:
        self.options = options
        self._engine = engine
        self._clock = clock
        self.speed = _speed(clock)
        self._redis = redis_client(options.redis_url, options.redis_timeout)
        self.scripts = Scripts(self._redis, keys=Keys(options.namespace), speed=self.speed)
        self._chains: dict[str, ProviderChain] = {}
        self._stocks: dict[str, PermitStock] = {}
        self._server_clock = ServerClock()
        self._concurrency: dict[str, int] = {}  # the providers' max_concurrency
        self._caps: dict[str, int | None] = {}  # this worker's own cap (run --concurrency)
        self.allowances: dict[str, SharedAllowance] = {}
        self._live = 1
        self._lane = 0  # this worker's lane of the shared slots (_refresh_live)
        self._shared = True
        self._lost_at: float | None = None
        self.node_id = 0
        self._tasks: list[asyncio.Task[None]] = []
        # for the summary
        self.fallbacks = 0
        self.fallback_seconds = 0.0
        self.pool_full = 0  # round trips refused by our own full connection pool
        self._pool_full_logged = float("-inf")
        self.reaped = 0
        self.taken_back = 0
        self.last_error = ""
        #: this worker's part of the cluster circuit (:meth:`circuit_node`)
        self.circuit: CircuitNode | None = None

    # ---------------------------------------------------------------- the Link of allowances
    def live(self) -> int:
        return self._live

    @property
    def shared(self) -> bool:
        return self._shared

    def lost(self, exc: BaseException) -> None:
        """Redis failed a round trip: every limiter falls back to its share, loudly.

        Not when this worker's own connection pool is full: Redis is there for the other
        workers, who keep the shared rate, so a local share beside them would add up to
        more than the provider's limit. That round trip's permits are simply not had
        (calls wait for the next refill or stay due), and it is counted."""
        if _pool_full(exc):
            self.pool_full += 1
            now = self._clock.monotonic()
            if now - self._pool_full_logged >= 10.0:
                self._pool_full_logged = now
                log.warning("Redis connection pool full: a round trip skipped, the shared "
                            "limit kept", extra={"action": "redis_pool_full",
                                                 "count": self.pool_full})
            return
        if not self._shared:
            return
        self._shared = False
        self._lost_at = self._clock.monotonic()
        self.fallbacks += 1
        self.last_error = describe(exc)
        self._apply_local(lost_at=self._lost_at)
        log.error("REDIS LOST: shared rate limits replaced by local ones (rate / live "
                  "workers) until it is back", extra={
                      "action": "shared_limit_lost", "error": self.last_error,
                      "live_workers": self._live})

    def _apply_local(self, *, lost_at: float | None = None) -> None:
        """Each limiter alone at its share of the rate. Just lost (``lost_at``, now): the
        first local call waits out the shared permits granted before (any worker's, at most
        a horizon past their grant, which came before we saw Redis go) and one interval
        more, so the seconds across the switch hold the limit plus its burst too."""
        share = 1.0 / max(1, self._live)
        now = self._clock.monotonic()
        for org, chain in self._chains.items():
            limiter = chain.limiter
            rising = share > limiter.share
            limiter.shared = None
            limiter.set_share(share)
            self._stocks[org].clear()
            if lost_at is not None:
                limiter.hold(lost_at + self.options.horizon + limiter.interval)
            elif rising:
                # Fewer live workers: a departed one's last calls may still be in the
                # provider's 1-second window; the larger share starts once they are out of
                # it (at once, the survivors' calls and its own could pass the limit and
                # its burst in that second)
                limiter.hold(now + PROVIDER_WINDOW + limiter.interval)

    def _restore(self) -> None:
        self._shared = True
        if self._lost_at is not None:
            self.fallback_seconds += self._clock.monotonic() - self._lost_at
            self._lost_at = None
        for org, chain in self._chains.items():
            chain.limiter.set_share(1.0)
            chain.limiter.shared = self._stocks[org]
        log.warning("Redis is back: shared rate limits in force again", extra={
            "action": "shared_limit_restored"})

    # ---------------------------------------------------------------- the runner's hooks
    async def schema_current(self, engine: AsyncEngine) -> bool:
        """The schema is at this version already: a worker joining a running cluster must
        not re-run the migrations' DDL under the others' claims (PostgreSQL deadlocks)."""
        from sqlalchemy import func, select
        from sqlalchemy.exc import SQLAlchemyError

        from batch.db import schema as db_schema
        from batch.db.engine import connect

        try:
            async with connect(engine) as conn:
                have = (await conn.execute(select(func.max(
                    db_schema.schema_migrations.c.version)))).scalar()
        except (SQLAlchemyError, OSError, InputError):
            return False
        return isinstance(have, int) and have >= db_schema.SCHEMA_VERSION

    def server_scale(self, engine: AsyncEngine) -> float:
        """Clock seconds per second of the heartbeat's clock: PostgreSQL's is the server's
        (real time), SQLite's the worker's own clock."""
        return self.speed if engine.dialect.name == "postgresql" else 1.0

    def allowance(self, org_code: str, *, day: date, quota: int,
                  attempted_before: int, run_id: str = "") -> SharedAllowance:
        a = SharedAllowance(org_code, scripts=self.scripts, link=self, day=day.isoformat(),
                            quota=quota, seed=attempted_before, member=run_id)
        self.allowances[org_code] = a
        return a

    def circuit_node(self, worker_id: str) -> CircuitNode:
        """This worker's part of the cluster circuit, on the session's Redis client; the
        probe workers are picked from the registry's live workers (oldest first)."""
        from dataclasses import replace

        from batch.cluster.circuit_events import transition_sink

        record = transition_sink(self._engine)
        speed = self.speed

        async def live() -> list[str]:
            return [w.worker_id for w in
                    await registry.live_workers(self._engine, now=self._clock.now())]

        async def on_transitions(moves: Sequence[tuple[ProviderCircuit | None,
                                                       ProviderCircuit]], actor: str) -> None:
            # circuit_events holds server (real) times; a scaled clock's are TIME * speed
            await record([(old, replace(new, since=new.since / speed)) for old, new in moves]
                         if speed != 1.0 else moves, actor)

        self.circuit = CircuitNode(self._redis, worker_id=worker_id, clock=self._clock,
                                   settings=self.options.circuit, live_workers=live,
                                   on_transitions=on_transitions,
                                   prefix=f"{self.options.namespace}:circuit:",
                                   speed=speed)
        return self.circuit

    def attach(self, chain: ProviderChain, *, cap: int | None = None) -> None:
        """Put ``chain``'s limiter behind the shared permits and its bulkhead on this
        worker's share of the provider's concurrency (at most ``cap``, run --concurrency)."""
        st = chain.limiter.settings
        stock = PermitStock(chain.org_code, rate=st.calls_per_second, burst=st.burst,
                            horizon=self.options.horizon)
        self._chains[chain.org_code] = chain
        self._stocks[chain.org_code] = stock
        chain.limiter.shared = stock
        self._concurrency[chain.org_code] = chain.bulkhead.limit
        self._caps[chain.org_code] = cap
        self._share_concurrency(chain)

    def _share_concurrency(self, chain: ProviderChain) -> None:
        """A provider's max_concurrency is the whole cluster's: each worker's bulkhead holds
        its share over the live workers, Redis or not (worker_share)."""
        org = chain.org_code
        chain.bulkhead.set_limit(worker_share(self._concurrency[org], self._live,
                                              self._caps.get(org)))

    async def start(self, node_id: int) -> None:
        self.node_id = node_id
        await self._refresh_live()
        self._tasks = [asyncio.create_task(self._presence(), name="cluster-presence"),
                       asyncio.create_task(self._refill(), name="cluster-refill")]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
        for a in self.allowances.values():
            await asyncio.gather(*a._refunds, return_exceptions=True)
        if self._lost_at is not None:
            self.fallback_seconds += self._clock.monotonic() - self._lost_at
            self._lost_at = None
        try:
            await heartbeat(self._engine, self.node_id, now=self._clock.now(), stopped=True)
        except Exception as exc:
            log.warning("could not mark this worker stopped", extra={
                "action": "worker_stop_failed", "error": describe(exc)})
        await self._redis.aclose()

    def report(self) -> dict[str, Any]:
        """For the summary: what the shared state did in this worker."""
        return {
            "node_id": self.node_id, "live_workers": self._live,
            "shared_limit": "shared" if self._shared else "local (Redis lost)",
            "redis_fallbacks": self.fallbacks,
            "redis_fallback_seconds": round(self.fallback_seconds, 1),
            "redis_pool_full": self.pool_full,
            "permit_refusals": sum(s.refused for s in self._stocks.values()),
            "permit_waits": sum(s.waited for s in self._stocks.values()),
            "late_slots": sum(c.limiter.late_slots for c in self._chains.values()),
            "dead_workers_reaped": self.reaped,
            "starts_taken_back": self.taken_back,
            **({"circuit": self.circuit.status()} if self.circuit is not None else {}),
            **({"redis_error": self.last_error} if self.fallbacks else {}),
        }

    # ---------------------------------------------------------------- loops
    async def _refresh_live(self) -> None:
        live = await registry.live_workers(self._engine, now=self._clock.now())
        n = max(1, len(live))
        # this worker's lane of the shared slots: its place among the live by node number
        # (two that see the registry differently for a beat may share one: still exact)
        ids = sorted(w.node_id for w in live)
        self._lane = ids.index(self.node_id) if self.node_id in ids else self.node_id % n
        if n != self._live:
            self._live = n
            for chain in self._chains.values():
                self._share_concurrency(chain)
            if not self._shared:
                self._apply_local()

    async def _presence(self) -> None:
        timeout_s = self.options.dead_after
        while True:
            await self._clock.sleep(self.options.heartbeat)
            try:
                await heartbeat(self._engine, self.node_id, now=self._clock.now())
                got = await registry.reap(self._engine, now=self._clock.now(), me=self.node_id)
                self.reaped += len(got)
                for dead in got:
                    await self._take_back(dead)
                await self._refresh_live()
            except Exception as exc:
                log.warning("heartbeat failed", extra={
                    "action": "heartbeat_failed", "error": describe(exc),
                    "dead_after": timeout_s})

    async def _take_back(self, dead: registry.Reaped) -> None:
        """A dead worker's run was granted starts it never accounted for: those it never
        made and those lost with it (no outcome row; the consents are due again and need a
        start of their own). They go back to each provider's day, or the survivors would
        run out of quota with work left."""
        if dead.run_id is None or not self.allowances:
            return
        day = next(iter(self.allowances.values())).day
        used = await registry.outcomes_of_run(self._engine, dead.run_id,
                                              day=date.fromisoformat(day))
        back: dict[str, int] = {}
        try:
            for org in self.allowances:
                n = await self.scripts.reclaim(org, day=day, member=dead.run_id,
                                               used=used.get(org, 0))
                if n:
                    back[org] = n
        except Exception as exc:
            self.lost(exc)
        if back:
            self.taken_back += sum(back.values())
            log.warning("a dead worker's unused starts are back in the day's quota", extra={
                "action": "starts_taken_back", "dead_worker": dead.worker_id,
                "dead_run": dead.run_id, "starts": back})

    async def _refill(self) -> None:
        while True:
            await self._clock.sleep(SLICE if self._shared else 1.0)
            try:
                if self._shared:
                    await self._refill_once()
                else:
                    await self._redis.ping()
                    self._restore()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.lost(exc)

    async def _refill_once(self) -> None:
        now = self._clock.monotonic()
        asks: list[RateAsk] = []
        for org, stock in self._stocks.items():
            chain = self._chains[org]
            st = chain.limiter.settings
            if stock.pop_throttled():
                await self.scripts.throttle(
                    org, factor=st.throttle_factor, floor=st.min_rate_fraction,
                    hold=st.throttle_hold, gap=DECREASE_GAP, recovery=st.recovery_time)
            n = stock.want(now, self._live)
            if n > 0:
                asks.append(RateAsk(org, st.calls_per_second, st.burst, n,
                                    self.options.horizon, st.recovery_time,
                                    lane=self._lane, lanes=self._live))
        if not asks:
            return
        sent = self._clock.monotonic()
        got = await self.scripts.permits(asks)
        # one steady offset onto the server's clock, not each round trip's own midpoint
        server = self._server_clock
        server.sample(sent, self._clock.monotonic(), got[0].server_now)
        for ask, g in zip(asks, got, strict=True):
            self._stocks[ask.org_code].add(g.offsets, server.to_local(g.server_now), g.factor)


def _pool_full(exc: BaseException) -> bool:
    """redis-py's "Too many connections": this client's pool is full (MaxConnectionsError
    from redis-py 6; a plain ConnectionError with that message before)."""
    full = getattr(redis_exceptions, "MaxConnectionsError", None)
    if full is not None and isinstance(exc, full):
        return True
    return isinstance(exc, redis_exceptions.ConnectionError) and str(exc) == "Too many connections"
