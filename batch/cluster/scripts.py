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
#: returns {factor, offset_1, ..., offset_k} (seconds from now, as strings)
PERMITS = _SERVER_NOW + """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local horizon = tonumber(ARGV[4])
local recovery = tonumber(ARGV[6])
local h = redis.call('HMGET', KEYS[1], 'tat', 'low', 'hold')
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
local tau = (burst - 1) * interval
local out = {string.format('%.17g', factor)}
for i = 1, n do
  local slot = tat - tau
  if slot < now then slot = now end
  if slot - now > horizon then break end
  if tat < slot then tat = slot end
  tat = tat + interval
  out[#out + 1] = string.format('%.17g', slot - now)
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
end
redis.call('EXPIRE', KEYS[1], 7200)
return g
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


@dataclass(frozen=True, slots=True)
class RateAsk:
    """One provider's ask in a permits round trip."""

    org_code: str
    rate: float
    burst: int
    n: int
    horizon: float
    recovery: float

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1 or self.n < 0 or self.horizon <= 0:
            raise ValueError("bad permit ask")


@dataclass(frozen=True, slots=True)
class Granted:
    """Permits granted: slot offsets (seconds after the server's now) and the shared
    back-off factor in force."""

    factor: float
    offsets: tuple[float, ...]


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

    async def permits(self, asks: list[RateAsk]) -> list[Granted]:
        """One round trip (a pipeline) for every provider's ask."""
        if not asks:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for a in asks:
                await self._permits(keys=[self.keys.rate(a.org_code)], args=[
                    a.rate, a.burst, a.n, a.horizon, self.speed, a.recovery], client=pipe)
            raw: list[Any] = await pipe.execute()
        return [Granted(float(r[0]), tuple(float(x) for x in r[1:])) for r in raw]

    async def throttle(self, org: str, *, factor: float, floor: float, hold: float,
                       gap: float, recovery: float) -> float:
        """Lower the provider's shared rate; returns the factor now in force."""
        got = await self._throttle(keys=[self.keys.rate(org)], args=[
            factor, floor, hold, gap, self.speed, recovery])
        return float(got)

    async def grant(self, org: str, *, day: str, minute: int, want: int, due: int,
                    quota: int, seed: int) -> int:
        got = await self._grant(keys=[self.keys.minute(org, day, minute),
                                      self.keys.day(org, day)],
                                args=[want, due, quota, seed])
        return int(got)

    async def refund(self, org: str, *, day: str, n: int) -> None:
        """Starts that never reached the provider go back to the day's quota."""
        if n > 0:
            await self.redis.decrby(self.keys.day(org, day), n)
