"""How many calls/s one simulator process sustains, beside a trivial aiohttp server.

Run: ``pytest -s tests/bench/test_simulator_throughput.py``. Both servers run in their own
subprocess on 127.0.0.1; the same bare aiohttp client loop (scheduled list call with a new
token, then one detail call) drives each at concurrency 10/50/100 for a few seconds.
The ratio simulator/hello says how much of a bare aiohttp server the simulator keeps.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import statistics
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from batch.simulator import SimulatorProcess

SECONDS = float(os.environ.get("SIM_BENCH_SECONDS", "2"))
ROUNDS = int(os.environ.get("SIM_BENCH_ROUNDS", "3"))  # alternate servers, report medians
CONCURRENCY = (10, 50, 100)
_COUNTER = itertools.count()  # across runs: every call a new token and tran id

HELLO = textwrap.dedent("""
    import sys
    from aiohttp import web
    BODY = b'{"rsp_code":"00000","rsp_msg":"success","account_cnt":1,' \\
           b'"account_list":[{"account_num":"x000"}]}'
    async def hello(request):
        if request.method == "POST":
            await request.json()
        return web.Response(body=BODY, content_type="application/json",
                            headers={"x-api-tran-id": request.headers.get("x-api-tran-id", "")})
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hello)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None,
                print=None, backlog=1024)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Hello:
    url: str
    pid: int


@pytest.fixture
def hello() -> Iterator[Hello]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", HELLO, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(url, timeout=1).read()
                break
            except OSError:
                time.sleep(0.05)
        yield Hello(url, proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimulatorProcess]:
    inst = tmp_path / "inst.toml"
    inst.write_text(
        'operator_org_code = "OPERATOR01"\n[[providers]]\norg_code = "BANK000001"\n'
        f'industry = "bank"\nbase_url = "http://127.0.0.1:{_free_port()}"\n'
        'windows = ["0000:1200", "1200:2400"]\ncalls_per_second = 1000000\n'
        "max_concurrency = 1000\n")
    scen = tmp_path / "scen.toml"
    scen.write_text("[defaults]\nlatency_median_ms = 0\nitems_min = 1\nitems_max = 1\n")
    with SimulatorProcess(inst, scenario_path=scen, window_override=["0000:2359"]) as p:
        yield p


async def client_loop(base: str, concurrency: int, seconds: float) -> tuple[int, int]:
    """(calls answered, calls answered 00000) in ``seconds`` with ``concurrency`` workers."""
    counter = _COUNTER
    ok = 0
    calls = 0
    deadline = time.monotonic() + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal ok, calls
        while time.monotonic() < deadline:
            n = next(counter)
            h = {"x-api-tran-id": f"OPERATOR01M{2 * n:014d}", "x-api-type": "scheduled",
                 "Authorization": f"Bearer bench-{n}"}
            async with session.get(f"{base}/v1/bank/accounts",
                                   params={"org_code": "BANK000001", "limit": "500",
                                           "search_timestamp": "0"}, headers=h) as r:
                body = await r.json(content_type=None)
            calls += 1
            ok += body["rsp_code"] == "00000"
            acc = body["account_list"][0]["account_num"]
            h["x-api-tran-id"] = f"OPERATOR01M{2 * n + 1:014d}"
            async with session.post(f"{base}/v1/bank/accounts/deposit/basic",
                                    json={"org_code": "BANK000001", "account_num": acc},
                                    headers=h) as r:
                body = await r.json(content_type=None)
            calls += 1
            ok += body["rsp_code"] == "00000"

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return calls, ok


def test_simulator_sustained_calls_per_second(sim: SimulatorProcess, hello: Hello) -> None:
    base, hello_url = sim.urls["BANK000001"], hello.url
    assert sim.pid is not None
    asyncio.run(client_loop(base, 10, 0.5))  # warm up both sides
    asyncio.run(client_loop(hello_url, 10, 0.5))
    sim.reset()
    print(f"\nsimulator vs trivial aiohttp server, bare aiohttp client loop, {SECONDS:g} s x "
          f"{ROUNDS} alternating rounds, medians ({os.cpu_count()} CPUs; client and each "
          "server in its own process)")
    print(f"{'concurrency':>11} {'simulator/s':>12} {'hello/s':>10} {'ratio':>6}")
    sent = h_sent = 0
    cpu0, h_cpu0 = _cpu_seconds(sim.pid), _cpu_seconds(hello.pid)
    for conc in CONCURRENCY:
        s_rates, h_rates = [], []
        for _ in range(ROUNDS):
            calls, ok = asyncio.run(client_loop(base, conc, SECONDS))
            assert ok == calls  # every call answered 00000: the rules were not in the way
            sent += calls
            s_rates.append(calls / SECONDS)
            h_calls, _ = asyncio.run(client_loop(hello_url, conc, SECONDS))
            h_rates.append(h_calls / SECONDS)
            h_sent += h_calls
        s_rate, h_rate = statistics.median(s_rates), statistics.median(h_rates)
        print(f"{conc:>11} {s_rate:>12,.0f} {h_rate:>10,.0f} {s_rate / h_rate:>6.2f}")
    cpu, h_cpu = _cpu_seconds(sim.pid) - cpu0, _cpu_seconds(hello.pid) - h_cpu0
    print(f"server CPU per call: simulator {cpu / sent * 1e6:,.0f} us, hello "
          f"{h_cpu / h_sent * 1e6:,.0f} us -> one simulator core can serve about "
          f"{sent / cpu:,.0f} calls/s (hello {h_sent / h_cpu:,.0f})")
    stats = sim.stats()["total"]
    assert stats["calls"] == sent  # the server counted exactly what the client sent
    print(f"server saw {stats['calls']} calls, peak_1s={stats['peak_1s']}, "
          f"peak_100ms={stats['peak_100ms']}, peak_concurrency={stats['peak_concurrency']}, "
          f"p50={stats['latency_ms']['p50']} ms p99={stats['latency_ms']['p99']} ms")
