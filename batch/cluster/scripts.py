"""The Redis side of cluster mode: three Lua scripts, each one atomic round trip, each on
the server's clock (``TIME``), never a worker's.

Keys (``{ns}`` is the cluster's namespace, ``mydata`` by default):

- ``{ns}:rate:{org}`` (hash, 1 h expiry): the provider's GCRA state ``tat`` and the
  cluster-wide back-off ``low`` / ``hold`` / ``last`` (after a 42902 anywhere the rate is
  ``low`` of the configured one until ``hold``, then climbs back linearly).
- ``{ns}:minute:{org}:{day}:{minute}`` (counter, 2 h expiry): starts handed out in that
  provider-minute, cluster-wide.
- ``{ns}:day:{org}:{day}`` (counter, 2 days expiry): starts handed out that day (seeded with
  the attempts the database had already recorded when the first worker asked).

Times inside the scripts are server seconds (since 2023-11-14, for precision) times
``speed`` (1 in production; a test's scaled clock runs faster, and every worker of a
cluster uses the same one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

#: The server's time (Redis TIME) in the cluster clock's seconds, ARGV[5] its speed: the
#: first lines of every script that reads the time.
_SERVER_NOW = """
local t = redis.call('TIME')
local speed = tonumber(ARGV[5])
local now = (tonumber(t[1]) - 1700000000 + tonumber(t[2]) / 1000000) * speed
"""

#: GCRA over a batch: up to n permits whose slots lie within `horizon` seconds of now;
#: returns {factor, now, offset_1, ..., offset_k} (the server's now in cluster seconds, the
#: offsets in seconds from it; as strings).
#:
#: One worker (ARGV[8] `lanes` = 1): one `tat`, slots in order, the burst allowed. Several:
#: one lattice of slots `sp` apart from `base`, dealt out in lanes, lane j (ARGV[7], mod
#: `lanes`) holding the points base + (k * lanes + j) * sp, each lane with its own next `kj`.
#: The lanes' points never coincide, so together they hold the rate as one `tat` would
#: (without the burst); but each worker's permits are spread over the horizon instead of
#: coming in one stretch each round trip: with one `tat` over-asked by every worker, each
#: round trip's newest stretch went whole to whoever asked first, and a worker's calls
#: waited out the stretches the others held (a 2-worker cluster's calls 23 ms later each).
#: A new lattice (the number of lanes changed, the back-off moved the spacing) starts after
#: every slot already handed out (`tat` is past them all in both modes).
PERMITS = _SERVER_NOW + """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local horizon = tonumber(ARGV[4])
local recovery = tonumber(ARGV[6])
local lanes = tonumber(ARGV[8])
local h = redis.call('HMGET', KEYS[1], 'tat', 'low', 'hold', 'lanes', 'base', 'sp')
local tat = tonumber(h[1]) or now
local factor = 1
local low = tonumber(h[2])
local hold = tonumber(h[3])
if low and hold then
  if now < hold then
    factor = low
  else
    factor = low + (1 - low) * (now - hold) / recovery
    if factor >= 1 then factor = 1 end
  end
end
local interval = 1 / (rate * factor)
local out = {string.format('%.17g', factor), string.format('%.17g', now)}
local had = tonumber(h[4])
local function forget()
  if had then
    for j = 0, had - 1 do redis.call('HDEL', KEYS[1], 'k' .. j) end
    redis.call('HDEL', KEYS[1], 'lanes', 'base', 'sp')
  end
end
if lanes <= 1 then
  forget()
  local tau = (burst - 1) * interval
  for i = 1, n do
    local slot = tat - tau
    if slot < now then slot = now end
    if slot - now > horizon then break end
    if tat < slot then tat = slot end
    tat = tat + interval
    out[#out + 1] = string.format('%.17g', slot - now)
  end
else
  local base = tonumber(h[5])
  local sp = tonumber(h[6])
  if had ~= lanes or not base or not sp or sp < interval or sp > 1.01 * interval then
    forget()
    base = tat
    if base < now then base = now end
    sp = interval
  end
  local lane = tonumber(ARGV[7]) % lanes
  local kf = 'k' .. lane
  local k = tonumber(redis.call('HGET', KEYS[1], kf) or '0')
  local first = math.ceil((now - base - lane * sp) / (lanes * sp))
  if k < first then k = first end
  for i = 1, n do
    local slot = base + (k * lanes + lane) * sp
    if slot - now > horizon then break end
    k = k + 1
    if tat < slot + sp then tat = slot + sp end
    out[#out + 1] = string.format('%.17g', slot - now)
  end
  redis.call('HSET', KEYS[1], kf, string.format('%.17g', k), 'lanes', lanes,
             'base', string.format('%.17g', base), 'sp', string.format('%.17g', sp))
end
redis.call('HSET', KEYS[1], 'tat', string.format('%.17g', tat))
redis.call('EXPIRE', KEYS[1], 3600)
return out
"""

#: a 42902 somewhere in the cluster: lower the shared rate (not twice within `gap`)
THROTTLE = _SERVER_NOW + """
local mult = tonumber(ARGV[1])
local floor = tonumber(ARGV[2])
local holdfor = tonumber(ARGV[3])
local gap = tonumber(ARGV[4])
local recovery = tonumber(ARGV[6])
local h = redis.call('HMGET', KEYS[1], 'low', 'hold', 'last')
local low = tonumber(h[1])
local hold = tonumber(h[2])
local last = tonumber(h[3])
local factor = 1
if low and hold then
  if now < hold then
    factor = low
  else
    factor = low + (1 - low) * (now - hold) / recovery
    if factor >= 1 then factor = 1 end
  end
end
if last and now - last < gap then
  redis.call('HSET', KEYS[1], 'hold', string.format('%.17g', now + holdfor))
  return string.format('%.17g', factor)
end
local newlow = factor * mult
if newlow < floor then newlow = floor end
redis.call('HSET', KEYS[1], 'low', string.format('%.17g', newlow),
           'hold', string.format('%.17g', now + holdfor), 'last', string.format('%.17g', now))
redis.call('EXPIRE', KEYS[1], 3600)
return string.format('%.17g', newlow)
"""

#: starts for one provider-minute: at most `want`, never past the minute's cumulative
#: `due` so far, never past the day's `quota`
GRANT = """
redis.call('SET', KEYS[2], ARGV[4], 'NX', 'EX', 172800)
local want = tonumber(ARGV[1])
local due = tonumber(ARGV[2])
local quota = tonumber(ARGV[3])
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local day = tonumber(redis.call('GET', KEYS[2]) or '0')
local g = want
if due - used < g then g = due - used end
if quota - day < g then g = quota - day end
if g < 0 then g = 0 end
if g > 0 then
  redis.call('INCRBY', KEYS[1], g)
  redis.call('INCRBY', KEYS[2], g)
  redis.call('HINCRBY', KEYS[3], ARGV[5], g)
  redis.call('EXPIRE', KEYS[3], 172800)
end
redis.call('EXPIRE', KEYS[1], 7200)
return g
"""

# Starts that never reached the provider: back to the day's quota, off the run's ledger,
# and back to the minute they were granted in (while it lasts), or a worker whose grants
# were refused by the rate limiter would use up the minute for the others.
REFUND = """
local n = tonumber(ARGV[1])
redis.call('DECRBY', KEYS[1], n)
redis.call('HINCRBY', KEYS[2], ARGV[2], -n)
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('DECRBY', KEYS[3], n)
end
return n
"""

# A dead worker's run: what it was granted and did not account for (no outcome written:
# never started, or lost with the process) goes back to the day's quota, once.
RECLAIM = """
local granted = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
redis.call('HDEL', KEYS[2], ARGV[1])
local back = granted - tonumber(ARGV[2])
if back <= 0 then return 0 end
local day = tonumber(redis.call('GET', KEYS[1]) or '0')
if back > day then back = day end
redis.call('DECRBY', KEYS[1], back)
return back
"""


@dataclass(frozen=True, slots=True)
class Keys:
    """The key names of one cluster (its namespace)."""

    ns: str = "mydata"

    def __post_init__(self) -> None:
        if not self.ns or any(ch in self.ns for ch in " {}"):
            raise ValueError("the namespace must be non-empty, without spaces or braces")

    def rate(self, org: str) -> str:
        return f"{self.ns}:rate:{org}"

    def minute(self, org: str, day: str, minute: int) -> str:
        return f"{self.ns}:minute:{org}:{day}:{minute}"

    def day(self, org: str, day: str) -> str:
        return f"{self.ns}:day:{org}:{day}"

    def ledger(self, org: str, day: str) -> str:
        """Starts granted per run (a hash): what a dead worker's run did not use comes back."""
        return f"{self.ns}:ledger:{org}:{day}"


@dataclass(frozen=True, slots=True)
class RateAsk:
    """One provider's ask in a permits round trip."""

    org_code: str
    rate: float
    burst: int
    n: int
    horizon: float
    recovery: float
    #: this worker's lane of the shared slots, and how many lanes (the live workers)
    lane: int = 0
    lanes: int = 1

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1 or self.n < 0 or self.horizon <= 0:
            raise ValueError("bad permit ask")
        if self.lanes < 1 or self.lane < 0:
            raise ValueError("bad permit lane")


@dataclass(frozen=True, slots=True)
class Granted:
    """Permits granted: slot offsets (seconds after the server's now), the shared back-off
    factor in force, and that server now (cluster seconds: the scripts' time base)."""

    factor: float
    offsets: tuple[float, ...]
    server_now: float


class Scripts:
    """The scripts, registered once on one client (EVALSHA, reloaded if flushed)."""

    def __init__(self, redis: Redis, *, keys: Keys | None = None, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.redis = redis
        self.keys = keys or Keys()
        self.speed = speed
        self._permits = redis.register_script(PERMITS)
        self._throttle = redis.register_script(THROTTLE)
        self._grant = redis.register_script(GRANT)
        self._refund = redis.register_script(REFUND)
        self._reclaim = redis.register_script(RECLAIM)

    async def permits(self, asks: list[RateAsk]) -> list[Granted]:
        """One round trip (a pipeline) for every provider's ask."""
        if not asks:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for a in asks:
                await self._permits(keys=[self.keys.rate(a.org_code)], args=[
                    a.rate, a.burst, a.n, a.horizon, self.speed, a.recovery, a.lane,
                    a.lanes], client=pipe)
            raw: list[Any] = await pipe.execute()
        return [Granted(float(r[0]), tuple(float(x) for x in r[2:]), float(r[1]))
                for r in raw]

    async def throttle(self, org: str, *, factor: float, floor: float, hold: float,
                       gap: float, recovery: float) -> float:
        """Lower the provider's shared rate; returns the factor now in force."""
        got = await self._throttle(keys=[self.keys.rate(org)], args=[
            factor, floor, hold, gap, self.speed, recovery])
        return float(got)

    async def grant(self, org: str, *, day: str, minute: int, want: int, due: int,
                    quota: int, seed: int, member: str = "") -> int:
        """Up to ``want`` starts of the minute (``member``: the asking run, on the ledger)."""
        got = await self._grant(keys=[self.keys.minute(org, day, minute),
                                      self.keys.day(org, day), self.keys.ledger(org, day)],
                                args=[want, due, quota, seed, member])
        return int(got)

    async def reclaim(self, org: str, *, day: str, member: str, used: int) -> int:
        """A dead run's grants beyond the ``used`` it accounted for (its outcome rows) go
        back to the day's quota; returns how many."""
        got = await self._reclaim(keys=[self.keys.day(org, day), self.keys.ledger(org, day)],
                                  args=[member, used])
        return int(got)

    async def refund(self, org: str, *, day: str, n: int, member: str = "",
                     minute: int | None = None) -> None:
        """Starts that never reached the provider go back to the day's quota (and to the
        ``minute`` they were granted in)."""
        if n > 0:
            await self._refund(keys=[self.keys.day(org, day), self.keys.ledger(org, day),
                                     self.keys.minute(org, day, -1 if minute is None
                                                      else minute)],
                               args=[n, member])

    async def day_used(self, org: str, *, day: str, seed: int) -> int:
        """Starts granted today, cluster-wide (``seed`` before the first grant)."""
        got = await self.redis.get(self.keys.day(org, day))
        return seed if got is None else int(got)
