"""The cluster circuit's Redis keys and scripts: every read and write is one round trip.

Keys (``prefix`` is ``mydata:circuit:`` unless configured):

    {prefix}counts:{bucket}  hash  "{org}|s" / "{org}|f" / "{org}|w": successes, failures,
                                   slow calls pushed in [bucket, bucket + bucket_seconds)
                                   of the server's clock; expires after the history
    {prefix}state            hash  org -> ProviderCircuit JSON; written by the coordinator
                                   only, through the fenced write
    {prefix}beat             str   JSON {at, leader, generation}: the coordinator's last tick
    {prefix}forced           hash  org -> Forced JSON (operator overrides)
    {prefix}leader           str   "{generation}:{candidate}", with the lease as its expiry
    {prefix}generation       int   incremented on every election: the fencing number
    {prefix}probe:{org}      str   a probe reservation: exists for one probe interval

Every script reads the time from the server (``TIME``), never from a worker; a test's
scaled clock (``speed``) is applied to that time, so every setting is in the cluster clock's
seconds. The fenced
write checks, in the same script that writes, that the caller's token is still the leader
key's value: a coordinator that was paused past its lease (and maybe replaced) cannot write.
The scripts compute key names from ``prefix``, so this needs one Redis server (or a
primary), not Redis Cluster.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from batch.cluster.circuit import (
    CircuitSettings,
    CircuitState,
    Counts,
    Forced,
    ProviderCircuit,
)

DEFAULT_PREFIX = "mydata:circuit:"

_PUSH = """
local t = redis.call('TIME')
local sec = math.floor((tonumber(t[1]) + tonumber(t[2]) / 1000000) * tonumber(ARGV[4]))
local size = tonumber(ARGV[2])
local b = sec - sec % size
local key = ARGV[1] .. 'counts:' .. b
local i = 5
while i <= #ARGV do
  local org = ARGV[i]
  local s, f, w = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  if s > 0 then redis.call('HINCRBY', key, org .. '|s', s) end
  if f > 0 then redis.call('HINCRBY', key, org .. '|f', f) end
  if w > 0 then redis.call('HINCRBY', key, org .. '|w', w) end
  i = i + 4
end
redis.call('EXPIRE', key, tonumber(ARGV[3]))
return b
"""

_READ = """
local t = redis.call('TIME')
local sec = math.floor((tonumber(t[1]) + tonumber(t[2]) / 1000000) * tonumber(ARGV[4]))
local size = tonumber(ARGV[2])
local last = sec - sec % size
local out = {t[1], t[2], redis.call('HGETALL', ARGV[1] .. 'state'),
             redis.call('HGETALL', ARGV[1] .. 'forced'), redis.call('GET', ARGV[1] .. 'leader')}
for i = 0, tonumber(ARGV[3]) - 1 do
  local b = last - i * size
  out[#out + 1] = b
  out[#out + 1] = redis.call('HGETALL', ARGV[1] .. 'counts:' .. b)
end
return out
"""

_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then return {0, cur} end
local gen = redis.call('INCR', KEYS[2])
local token = gen .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], token, 'PX', tonumber(ARGV[2]))
return {gen, token}
"""

_WRITE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
local t = redis.call('TIME')
local i = 5
while i <= #ARGV do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  i = i + 2
end
local at = (tonumber(t[1]) + tonumber(t[2]) / 1000000) * tonumber(ARGV[4])
redis.call('SET', KEYS[3], '{"at":' .. string.format('%.6f', at) .. ',' .. ARGV[3])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def _server_time(sec: Any, usec: Any, speed: float = 1.0) -> float:
    return (int(_s(sec)) + int(_s(usec)) / 1e6) * speed


def parse_states(raw: Mapping[str, str]) -> dict[str, ProviderCircuit]:
    """The state hash, decoded (an entry that does not parse is skipped, not fatal)."""
    out: dict[str, ProviderCircuit] = {}
    for org, text in raw.items():
        try:
            out[org] = ProviderCircuit.from_json(json.loads(text))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def parse_forced(raw: Mapping[str, str]) -> dict[str, Forced]:
    out: dict[str, Forced] = {}
    for org, text in raw.items():
        try:
            d = json.loads(text)
            out[org] = Forced(CircuitState(d["state"]), str(d["reason"]), float(d["since"]),
                              str(d.get("actor", "")))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def parse_counts(raw: Mapping[str, str]) -> dict[str, Counts]:
    """One bucket's hash -> counts per provider."""
    acc: dict[str, list[int]] = {}
    for field, value in raw.items():
        org, _, kind = field.rpartition("|")
        slot = "sfw".find(kind)
        if not org or slot < 0:
            continue
        acc.setdefault(org, [0, 0, 0])[slot] += int(value)
    return {org: Counts(s, f, w) for org, (s, f, w) in acc.items()}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the coordinator reads in one round trip: server time, the state it wrote, the
    forced overrides, the current leader token and each provider's buckets."""

    now: float
    states: dict[str, ProviderCircuit]
    forced: dict[str, Forced]
    leader: str | None
    buckets: dict[str, dict[int, Counts]]


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What a worker reads in one round trip."""

    now: float
    states: dict[str, ProviderCircuit]
    forced: dict[str, Forced]
    beat_at: float | None
    leader: str | None


class CircuitStore:
    """The cluster circuit's Redis operations (one round trip each)."""

    def __init__(self, redis: Redis, *, settings: CircuitSettings,
                 prefix: str = DEFAULT_PREFIX, speed: float = 1.0) -> None:
        if not speed > 0:
            raise ValueError("speed must be positive")
        self.redis = redis
        self.settings = settings
        self.prefix = prefix
        #: the cluster clock's seconds per server second (1 in production; a test's
        #: scaled clock runs faster): server times are read as ``TIME * speed``, and
        #: expiries set in server milliseconds are the settings' seconds / speed
        self.speed = float(speed)
        self._push = redis.register_script(_PUSH)
        self._read = redis.register_script(_READ)
        self._acquire = redis.register_script(_ACQUIRE)
        self._write = redis.register_script(_WRITE)
        self._release = redis.register_script(_RELEASE)

    def key(self, name: str) -> str:
        return self.prefix + name

    def _ms(self, seconds: float) -> int:
        """Cluster-clock seconds as server milliseconds (an expiry), at least 1."""
        return max(1, round(seconds / self.speed * 1000))

    # -- workers ----------------------------------------------------------------------
    async def push(self, counts: Mapping[str, Counts]) -> int:
        """Add every provider's counts to the current server-time bucket; returns it."""
        st = self.settings
        args: list[str | int | float] = [
            self.prefix, st.bucket_seconds,
            int((st.history_seconds + 3 * st.bucket_seconds) / self.speed + 60), self.speed]
        for org, c in counts.items():
            args += [org, c.successes, c.failures, c.slow]
        return int(await self._push(keys=[], args=args))

    async def read_view(self) -> WorkerView:
        """Server time, states, forced overrides and the coordinator's beat (pipelined)."""
        async with self.redis.pipeline(transaction=False) as p:
            p.time()
            p.hgetall(self.key("state"))
            p.hgetall(self.key("forced"))
            p.get(self.key("beat"))
            p.get(self.key("leader"))
            t, state, forced, beat, leader = await p.execute()
        beat_at: float | None = None
        if beat is not None:
            try:
                beat_at = float(json.loads(_s(beat))["at"])
            except (ValueError, KeyError, TypeError):
                beat_at = None
        return WorkerView(now=_server_time(t[0], t[1], self.speed),
                          states=parse_states({_s(k): _s(v) for k, v in state.items()}),
                          forced=parse_forced({_s(k): _s(v) for k, v in forced.items()}),
                          beat_at=beat_at, leader=_s(leader) if leader is not None else None)

    async def reserve_probe(self, org_code: str, worker_id: str) -> bool:
        """One probe call's reservation: at most one per probe interval, cluster-wide."""
        ms = self._ms(self.settings.probe_interval)
        return bool(await self.redis.set(self.key(f"probe:{org_code}"), worker_id, nx=True,
                                         px=ms))

    # -- the coordinator --------------------------------------------------------------
    async def read_snapshot(self) -> Snapshot:
        st = self.settings
        raw = await self._read(keys=[], args=[self.prefix, st.bucket_seconds,
                                              st.history_buckets, self.speed])
        buckets: dict[str, dict[int, Counts]] = {}
        for i in range(5, len(raw) - 1, 2):
            b = int(raw[i])
            for org, c in parse_counts(_pairs(raw[i + 1])).items():
                buckets.setdefault(org, {})[b] = c
        return Snapshot(now=_server_time(raw[0], raw[1], self.speed),
                        states=parse_states(_pairs(raw[2])),
                        forced=parse_forced(_pairs(raw[3])),
                        leader=_s(raw[4]) if raw[4] is not None else None, buckets=buckets)

    async def acquire(self, candidate: str) -> tuple[int, str]:
        """(generation, token) if elected now; (0, current leader token) if someone holds it."""
        gen, token = await self._acquire(
            keys=[self.key("leader"), self.key("generation")],
            args=[candidate, self._ms(self.settings.lease_ttl)])
        return int(gen), _s(token)

    async def write(self, token: str, generation: int,
                    states: Sequence[ProviderCircuit]) -> bool:
        """Write the states and the beat and renew the lease, only if ``token`` still holds
        the lease (fencing); False if it does not: the caller is no longer the coordinator."""
        leader = token.split(":", 1)[1] if ":" in token else token
        beat_tail = json.dumps({"leader": leader, "generation": generation})[1:]
        args: list[str | int | float] = [token, self._ms(self.settings.lease_ttl),
                                         beat_tail, self.speed]
        for s in states:
            args += [s.org_code, json.dumps(s.to_json())]
        ok = await self._write(keys=[self.key("leader"), self.key("state"), self.key("beat")],
                               args=args)
        return bool(ok)

    async def release(self, token: str) -> bool:
        """Give the lease up (a clean stop), only if it is still ours."""
        return bool(await self._release(keys=[self.key("leader")], args=[token]))

    # -- operators --------------------------------------------------------------------
    async def server_time(self) -> float:
        t = await self.redis.time()
        return _server_time(t[0], t[1], self.speed)

    async def force(self, org_code: str, forced: Forced) -> None:
        await self.redis.hset(self.key("forced"), org_code, json.dumps({
            "state": str(forced.state), "reason": forced.reason, "since": forced.since,
            "actor": forced.actor}))

    async def release_force(self, org_code: str) -> bool:
        return bool(await self.redis.hdel(self.key("forced"), org_code))
