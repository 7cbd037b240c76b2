"""The simulated providers' decisions: header checks, rules, capacity, faults, answers.

Each :class:`ProviderSim` decides what to answer from the request and the injected clock
alone (no I/O): ``app.py`` serves the :class:`Reply`. Random fates (faults, latency, expired
tokens, dead assets, item counts) come from hashes of the seed and the request's
``x-api-tran-id``, token or item id, so they are reproducible whatever the arrival order.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from statistics import NormalDist
from typing import Any

from batch.clock import KST, Clock
from batch.config import Institutions, Provider
from batch.errors import ConfigError
from batch.routes import API_TYPES, MAX_PAGE_LIMIT, ROUTES, TOKEN_PATH, IndustryRoutes
from batch.simulator.bucket import TokenBucket
from batch.simulator.scenario import FAULT_KINDS, Behaviour, Event, Scenario, http_status
from batch.simulator.stats import ProviderStats
from planning.calendar import week_start
from planning.windows import Window, in_windows

MESSAGES = {
    "00000": "success",
    "40001": "invalid parameter",
    "40002": "missing or malformed header",
    "40101": "invalid or expired access token",
    "40301": "call not allowed now",
    "40305": "asset closed or lost",
    "40404": "asset not found",
    "42901": "request limit exceeded: already transferred this week",
    "42902": "too many requests",
    "50001": "system failure",
    "50002": "processing failed",
    "50003": "processing time exceeded",
    "50005": "service unavailable",
}
ACCESS_TOKEN_SECONDS = 90 * 86400
REFRESH_TOKEN_SECONDS = 365 * 86400
_Z99 = NormalDist().inv_cdf(0.99)
_UNIT = float(1 << 32)
_STD_NORMAL = NormalDist()


def consent_key(token: str) -> str:
    """How stats name a consent: never the token, a short hash of it."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Reply:
    """What to serve: after ``delay`` seconds, ``body`` with ``status``, or a reset."""

    status: int
    code: str
    body: dict[str, Any] | None
    delay: float
    reset: bool = False


def _valid_tran_id(tran: str | None) -> bool:
    return tran is not None and len(tran) == 25 and tran.isascii() and tran.isalnum()


class ProviderSim:
    """One provider: its rules, its state (transfers, tokens, ids seen) and its stats."""

    def __init__(
        self,
        provider: Provider,
        behaviour: Behaviour,
        events: Sequence[Event],
        *,
        clock: Clock,
        windows: Sequence[Window],
        seed: int,
        total: ProviderStats,
    ) -> None:
        self.provider = provider
        self.org = provider.org_code
        self.behaviour = behaviour
        self.events = tuple(events)
        self.clock = clock
        self.windows = tuple(windows)
        self.seed = seed
        self.total = total
        self.stats = ProviderStats()
        self.routes: IndustryRoutes = ROUTES[provider.industry]
        self.list_label = f"GET {self.routes.list_path}"
        self.detail_label = f"{self.routes.detail_method} {self.routes.detail_route}"
        self.token_label = f"POST {TOKEN_PATH}"
        burst = behaviour.burst or max(2.0, 0.2 * provider.calls_per_second)
        self.bucket = TokenBucket(provider.calls_per_second, burst)
        cap = behaviour.concurrency_cap
        self.concurrency_cap: int | None = (
            provider.max_concurrency if cap is True else (None if cap is False else int(cap))
        )
        if behaviour.latency_median_ms > 0:
            self._mu = math.log(behaviour.latency_median_ms / 1000.0)
            p99 = max(behaviour.latency_p99_ms, behaviour.latency_median_ms)
            self._sigma = (math.log(p99) - math.log(behaviour.latency_median_ms)) / _Z99
        self._faults = [(k, behaviour.faults.get(k, 0.0)) for k in FAULT_KINDS
                        if behaviour.faults.get(k, 0.0) > 0]
        self.started_at = clock.monotonic()
        # rule state
        self._transfers: dict[str, tuple[date, int]] = {}
        self._tran_day: date | None = None
        self._week = date.min
        self._minute = (-1, False)
        self._stamp_cache: tuple[datetime | None, str] = (None, "")
        self._tran_ids: set[str] = set()
        # token state: issued tokens are never expired and alias back to their consent
        self._alias: dict[str, str] = {}
        self._refresh_roots: dict[str, str] = {}
        self._issued = 0

    def _in_windows(self, minute: int) -> bool:
        if self._minute[0] != minute:
            self._minute = (minute, in_windows(self.windows, minute))
        return self._minute[1]

    def _stamp(self, wall: datetime) -> str:
        """``search_timestamp`` (yyyymmddhhmmss), formatted once a second."""
        second = wall.replace(microsecond=0)
        if self._stamp_cache[0] != second:
            self._stamp_cache = (second, second.strftime("%Y%m%d%H%M%S"))
        return self._stamp_cache[1]

    # -- fates ---------------------------------------------------------------------------
    def _units(self, text: str) -> tuple[float, float, float, float]:
        d = hashlib.blake2b(f"{self.seed}|{self.org}|{text}".encode(), digest_size=16).digest()
        return (int.from_bytes(d[0:4]) / _UNIT, int.from_bytes(d[4:8]) / _UNIT,
                int.from_bytes(d[8:12]) / _UNIT, int.from_bytes(d[12:16]) / _UNIT)

    def _latency(self, u: float) -> float:
        if self.behaviour.latency_median_ms <= 0:
            return 0.0
        z = _STD_NORMAL.inv_cdf(min(max(u, 1e-9), 1 - 1e-9))
        return math.exp(self._mu + self._sigma * z)

    def _expired(self, token: str) -> bool:
        if token in self._alias:
            return False
        b = self.behaviour
        if token in b.expired_tokens:
            return True
        return b.expired_token_fraction > 0 and self._units(f"exp|{token}")[0] < \
            b.expired_token_fraction

    def consent_of(self, token: str) -> str:
        """The consent a token belongs to (refreshed tokens alias to the first)."""
        return self._alias.get(token) or consent_key(token)

    def item_count(self, key: str) -> int:
        """How many assets (accounts, cards...) a consent holds: items_min..items_max."""
        b = self.behaviour
        span = b.items_max - b.items_min + 1
        return b.items_min + int(self._units(f"items|{key}")[0] * span) % span

    def items(self, key: str, start: int = 0, stop: int | None = None) -> list[str]:
        """The consent's item ids ``[start:stop]`` (stable: derived from its key)."""
        n = self.item_count(key)
        return [f"{key[:12]}{i:03d}" for i in range(start, n if stop is None else min(stop, n))]

    def dead_code(self, item_id: str) -> str | None:
        b = self.behaviour
        u = self._units(f"dead|{item_id}")
        if item_id in b.dead_assets or (b.dead_asset_fraction > 0 and u[0] <
                                        b.dead_asset_fraction):
            return "40404" if u[1] < 0.5 else "40305"
        return None

    # -- answers -------------------------------------------------------------------------
    def _reply(self, code: str, delay: float, tran: str | None, data: dict[str, Any] | None
               = None) -> Reply:
        body: dict[str, Any] = {"rsp_code": code, "rsp_msg": MESSAGES.get(code, "error")}
        if data:
            body.update(data)
        return Reply(http_status(code) if code != "00000" else 200, code, body, delay)

    def call(self, detail: bool, headers: Mapping[str, str], query: Mapping[str, str],
             item_id: str | None) -> Reply:
        """Decide the answer to a list (``detail=False``) or detail call.

        Order: outage, header checks (MYDATA.md's order), duplicate id, capacity, window,
        the call's own rules (weekly transfer, dead asset, parameters), faults, success.
        """
        now = self.clock.monotonic()
        tran = headers.get("x-api-tran-id")
        u_fault, u_lat, u_err, _ = self._units(tran or "")
        delay, down, error_event = self._timeline(now, self._latency(u_lat))
        if down is not None:
            return self._down_reply(down, delay, tran)
        api_type = headers.get("x-api-type")
        auth = headers.get("Authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        wall = self.clock.now().astimezone(KST)
        refusal = self._gate(tran, api_type, token, now, wall)
        if refusal is not None:
            return self._reply(refusal, delay, tran)
        key = self.consent_of(token)
        scheduled = api_type == "scheduled"
        if detail:
            if not item_id:
                return self._reply("40001", delay, tran)
            code = self.dead_code(item_id)
            starts_transfer = False
        else:
            code = self._list_refusal(key, query, scheduled)
            starts_transfer = scheduled and "next_page" not in query
        if code is not None:
            return self._reply(code, delay, tran)
        fault = self._fault(u_fault, u_err, error_event)
        if fault is not None:
            if starts_transfer and fault == "50003" and self.behaviour.timeout_counts_as_transfer:
                self._record_transfer(key)
            if fault == "reset":
                return Reply(0, "reset", None, delay, reset=True)
            return self._reply(fault, delay, tran)
        stamp = self._stamp(wall)
        if detail:
            assert item_id is not None
            return self._reply("00000", delay, tran, self._detail_data(item_id, stamp))
        if starts_transfer:
            self._record_transfer(key)
        return self._reply("00000", delay, tran, self._list_data(key, query, stamp))

    def _timeline(self, now: float, delay: float) -> tuple[float, Event | None, Event | None]:
        """(latency after ``slow`` events, the ``down`` event, the first ``error`` event)."""
        error_event: Event | None = None
        if self.events:
            t = now - self.started_at
            for ev in self.events:
                if not ev.active(t):
                    continue
                if ev.kind == "down":
                    return delay, ev, None
                if ev.kind == "slow":
                    delay *= ev.factor
                elif error_event is None:
                    error_event = ev
        return delay, None, error_event

    def _down_reply(self, down: Event, delay: float, tran: str | None) -> Reply:
        if down.mode != "503":  # reset; refuse: a request on a kept-alive connection
            return Reply(0, "reset", None, 0.0, reset=True)
        return self._reply("50005", delay, tran)

    def _gate(self, tran: str | None, api_type: str | None, token: str, now: float,
              wall: datetime) -> str | None:
        """The refusal code of the header, capacity and window checks, if any."""
        if tran is None or not _valid_tran_id(tran):
            return "40002"
        if api_type not in API_TYPES:
            return "40001"
        if not token or self._expired(token):
            return "40101"
        today = wall.date()
        if today != self._tran_day:
            self._tran_day = today
            self._week = week_start(today)
            self._tran_ids.clear()
        if tran in self._tran_ids:
            self._violation("duplicate_tran_id")
            if self.behaviour.reject_duplicate_tran_id:
                return "40002"
        else:
            self._tran_ids.add(tran)
        if not self.bucket.take(now):
            self._violation("rate")
            return "42902"
        if self.concurrency_cap is not None and self.stats.in_flight > self.concurrency_cap:
            self._violation("concurrency")
            return "42902"
        if api_type == "scheduled" and not self._in_windows(wall.hour * 60 + wall.minute):
            self._violation("window")
            return self.behaviour.window_reject_code
        return None

    @staticmethod
    def _page_bounds(query: Mapping[str, str]) -> tuple[int, int] | None:
        """(offset, limit) of a list call, None if malformed."""
        try:
            limit = int(query.get("limit", "500"))
            offset = int(query["next_page"]) if "next_page" in query else 0
        except ValueError:
            return None
        if not 1 <= limit <= MAX_PAGE_LIMIT or offset < 0:
            return None
        return offset, limit

    def _list_refusal(self, key: str, query: Mapping[str, str], scheduled: bool) -> str | None:
        """40001 for bad paging, 42901 for a second scheduled transfer this week."""
        bounds = self._page_bounds(query)
        if bounds is None or bounds[0] > self.item_count(key):
            return "40001"
        if scheduled and "next_page" not in query:
            seen = self._transfers.get(key)
            if seen is not None and seen[0] == self._week:
                self._violation("second_transfer")
                return "42901"
        return None

    def _fault(self, u_fault: float, u_err: float, error_event: Event | None) -> str | None:
        """A timeline ``error`` code or a random fault from the mix, by this call's fate."""
        if error_event is not None and u_err < error_event.rate:
            return error_event.code
        acc = 0.0
        for kind, rate in self._faults:
            acc += rate
            if u_fault < acc:
                return kind
        return None

    def _list_data(self, key: str, query: Mapping[str, str], stamp: str) -> dict[str, Any]:
        bounds = self._page_bounds(query)
        assert bounds is not None
        offset, limit = bounds
        total = self.item_count(key)
        page = self.items(key, offset, offset + limit)
        r = self.routes
        data: dict[str, Any] = {"search_timestamp": stamp, r.count_key: len(page),
                                r.list_key: [{r.id_key: i, "is_consent": True} for i in page]}
        if offset + limit < total:
            data["next_page"] = str(offset + limit)
        return data

    def _detail_data(self, item_id: str, stamp: str) -> dict[str, Any]:
        return {"search_timestamp": stamp, self.routes.id_key: item_id, "currency_code": "KRW",
                "balance_amt": str(int(self._units(item_id)[3] * 1e7))}

    def refresh(self, form: Mapping[str, str], headers: Mapping[str, str]) -> Reply:
        """``POST /oauth/2.0/token`` with ``grant_type=refresh_token``: a new token pair.

        The new access token aliases back to the consent: the one of the bearer token sent
        with the request if any, else of a refresh token we issued, else of this refresh
        token itself.
        """
        tran = headers.get("x-api-tran-id")
        delay = self._latency(self._units(tran or "")[1])
        down = self._timeline(self.clock.monotonic(), delay)[1]
        if down is not None:
            return self._down_reply(down, delay, tran)
        rt = form.get("refresh_token", "")
        if form.get("grant_type") != "refresh_token" or not rt:
            return self._reply("40001", delay, tran)
        auth = headers.get("Authorization", "")
        old = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        root = self.consent_of(old) if old else self._refresh_roots.get(rt) or consent_key(rt)
        self._issued += 1
        stem = hashlib.blake2b(f"{self.seed}|{self.org}|{rt}|{self._issued}".encode(),
                               digest_size=15).hexdigest()
        access, refresh = f"simA{stem}", f"simR{stem}"
        self._alias[access] = root
        self._refresh_roots[refresh] = root
        self._refresh_roots.setdefault(rt, root)
        return self._reply("00000", delay, tran, {
            "token_type": "Bearer", "access_token": access, "expires_in": ACCESS_TOKEN_SECONDS,
            "refresh_token": refresh, "refresh_token_expires_in": REFRESH_TOKEN_SECONDS,
            "scope": self.provider.industry,
        })

    # -- bookkeeping ---------------------------------------------------------------------
    def _violation(self, kind: str) -> None:
        self.stats.violation(kind)
        self.total.violation(kind)

    def _record_transfer(self, key: str) -> None:
        week = self._week
        seen = self._transfers.get(key)
        n = seen[1] + 1 if seen is not None and seen[0] == week else 1
        self._transfers[key] = (week, n)
        self.stats.transfers += 1
        self.total.transfers += 1

    def begin(self, label: str, api_type: str | None) -> None:
        now = self.clock.monotonic()
        kind = api_type if api_type in API_TYPES else ("missing" if api_type is None
                                                       else "invalid")
        assert kind is not None
        self.stats.begin(now, label, kind)
        self.total.begin(now, label, kind)

    def end(self, code: str, latency_ms: float) -> None:
        self.stats.end(code, latency_ms)
        self.total.end(code, latency_ms)

    def consents(self) -> dict[str, int]:
        """Transfers per consent key this simulator recorded (week-independent count)."""
        return {k: n for k, (_, n) in self._transfers.items()}

    def reset(self) -> None:
        """Clear stats and rule state (transfers, ids seen, the bucket); keep issued tokens."""
        self.stats.reset()
        self._transfers.clear()
        self._tran_ids.clear()
        self._tran_day = None
        self.bucket.reset()


def build_fleet(
    institutions: Institutions,
    scenario: Scenario,
    *,
    clock: Clock,
    window_override: Sequence[Window] | None,
    seed: int,
    total: ProviderStats,
) -> dict[str, ProviderSim]:
    """One ProviderSim per provider; scenario names must match the institutions."""
    codes = {p.org_code for p in institutions.providers}
    for org in scenario.overrides:
        if org not in codes:
            raise ConfigError(f"no provider {org!r} in the institutions file",
                              field=f"providers.{org}")
    for i, ev in enumerate(scenario.timeline):
        if ev.provider != "*" and ev.provider not in codes:
            raise ConfigError(f"no provider {ev.provider!r} in the institutions file",
                              field=f"timeline[{i}].provider")
    return {
        p.org_code: ProviderSim(
            p, scenario.behaviour(p.org_code), scenario.events_for(p.org_code), clock=clock,
            windows=tuple(window_override) if window_override else p.windows, seed=seed,
            total=total,
        )
        for p in institutions.providers
    }
