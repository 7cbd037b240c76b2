"""Fixtures for the simulator tests: free ports, a small fleet, a FakeClock, an HTTP helper."""

from __future__ import annotations

import itertools
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp
import pytest

from batch.clock import KST, FakeClock
from batch.config import Institutions, parse_institutions
from batch.simulator import Behaviour, Scenario, Simulator
from planning.windows import Window

OPERATOR = "OPERATOR01"
MONDAY_0100 = datetime(2026, 11, 30, 1, 0, tzinfo=KST)  # inside 0030:0530
FAST = Behaviour(latency_median_ms=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def institutions_toml(cps: dict[str, float] | None = None) -> str:
    """Bank alone on one port; card and invest sharing another, routed by path prefix."""
    cps = cps or {}
    p1, p2 = free_port(), free_port()
    rows = [("BANK000001", "bank", f"http://127.0.0.1:{p1}"),
            ("CARD000001", "card", f"http://127.0.0.1:{p2}/CARD000001"),
            ("INVEST0001", "invest", f"http://127.0.0.1:{p2}/INVEST0001")]
    text = f'operator_org_code = "{OPERATOR}"\n'
    for org, industry, url in rows:
        text += (f'[[providers]]\norg_code = "{org}"\nindustry = "{industry}"\n'
                 f'base_url = "{url}"\nwindows = ["0030:0530", "2300:0030"]\n'
                 f"calls_per_second = {cps.get(org, 1000)}\nmax_concurrency = 20\n")
    return text


_tran = itertools.count(1)


def tran_id() -> str:
    return f"{OPERATOR}M{next(_tran):014d}"


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


class Client:
    """Sends MyData calls with valid headers unless told otherwise."""

    def __init__(self, session: aiohttp.ClientSession, inst: Institutions) -> None:
        self.session = session
        self.urls = {p.org_code: p.base_url for p in inst.providers}

    async def send(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                   **kw: Any) -> Answer:
        async with self.session.request(method, url, headers=headers, **kw) as resp:
            body = await resp.json(content_type=None)
            return Answer(resp.status, body, dict(resp.headers))

    def headers(self, token: str | None = "tok-1", api_type: str | None = "scheduled",
                tran: str | None = None) -> dict[str, str]:
        h: dict[str, str] = {"x-api-tran-id": tran or tran_id()}
        if api_type is not None:
            h["x-api-type"] = api_type
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        return h

    async def bank_list(self, token: str = "tok-1", *, limit: int = 500,
                        next_page: str | None = None, api_type: str = "scheduled",
                        org: str = "BANK000001", **hkw: Any) -> Answer:
        params = {"org_code": org, "search_timestamp": "0", "limit": str(limit)}
        if next_page is not None:
            params["next_page"] = next_page
        return await self.send("GET", f"{self.urls[org]}/v1/bank/accounts", params=params,
                               headers=self.headers(token, api_type, **hkw))

    async def bank_detail(self, account: str, token: str = "tok-1") -> Answer:
        return await self.send("POST", f"{self.urls['BANK000001']}/v1/bank/accounts/deposit/basic",
                               json={"org_code": "BANK000001", "account_num": account},
                               headers=self.headers(token))


StartSim = Callable[..., Awaitable[tuple[Simulator, Client]]]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(MONDAY_0100)


@pytest.fixture
async def start_sim(clock: FakeClock) -> AsyncIterator[StartSim]:
    """``sim, client = await start_sim(scenario=..., cps=..., window_override=...)``."""
    sims: list[Simulator] = []
    sessions: list[aiohttp.ClientSession] = []

    async def start(scenario: Scenario | None = None, *, cps: dict[str, float] | None = None,
                    window_override: Sequence[Window] | None = None,
                    seed: int = 0) -> tuple[Simulator, Client]:
        inst = parse_institutions(institutions_toml(cps))
        sim = Simulator(inst, scenario or Scenario(defaults=FAST), clock=clock,
                        window_override=window_override, seed=seed)
        await sim.start()
        sims.append(sim)
        session = aiohttp.ClientSession()
        sessions.append(session)
        return sim, Client(session, inst)

    yield start
    for s in sessions:
        await s.close()
    for sim in sims:
        await sim.stop()
