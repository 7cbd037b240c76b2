"""Capacity (token bucket, concurrency cap), the outage timeline, faults and dead assets."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from batch.clock import FakeClock
from batch.simulator import Behaviour, Event, Scenario
from tests.simulator.conftest import StartSim


async def test_calls_past_the_bucket_get_42902_until_it_refills(
        start_sim: StartSim, clock: FakeClock) -> None:
    sim, c = await start_sim(cps={"BANK000001": 10})  # burst max(2, 0.2*10) = 2
    codes = [(await c.bank_list(f"t{i}", api_type="user-search")).body["rsp_code"]
             for i in range(4)]
    assert codes == ["00000", "00000", "42902", "42902"]
    clock.advance(0.1)  # one token at 10/s
    codes = [(await c.bank_list(f"u{i}", api_type="user-search")).body["rsp_code"]
             for i in range(2)]
    assert codes == ["00000", "42902"]
    v = sim.stats()["providers"]["BANK000001"]["violations"]
    assert v["rate"] == 3
    assert sim.stats()["providers"]["CARD000001"]["violations"]["rate"] == 0


async def test_burst_is_configurable(start_sim: StartSim) -> None:
    _sim, c = await start_sim(Scenario(defaults=Behaviour(latency_median_ms=0, burst=5)),
                             cps={"BANK000001": 10})
    codes = [(await c.bank_list(f"t{i}", api_type="user-search")).body["rsp_code"]
             for i in range(6)]
    assert codes == ["00000"] * 5 + ["42902"]


async def test_concurrency_cap_refuses_calls_past_the_cap(start_sim: StartSim) -> None:
    scen = Scenario(defaults=Behaviour(latency_median_ms=40, latency_p99_ms=41,
                                       concurrency_cap=2))
    sim, c = await start_sim(scen)
    answers = await asyncio.gather(*(c.bank_list(f"t{i}", api_type="user-search")
                                     for i in range(5)))
    codes = sorted(a.body["rsp_code"] for a in answers)
    assert codes == ["00000", "00000", "42902", "42902", "42902"]
    s = sim.stats()["providers"]["BANK000001"]
    assert s["violations"]["concurrency"] == 3
    assert s["peak_concurrency"] == 5


async def test_outage_starts_and_ends_on_time_on_the_injected_clock(
        start_sim: StartSim, clock: FakeClock) -> None:
    scen = Scenario(defaults=Behaviour(latency_median_ms=0),
                    timeline=(Event("BANK000001", 30, 90, "down"),))
    _sim, c = await start_sim(scen)

    async def code() -> str:
        return str((await c.bank_list("t", api_type="user-search")).body["rsp_code"])

    assert await code() == "00000"
    clock.advance(29.9)
    assert await code() == "00000"
    clock.advance(0.1)
    a = await c.bank_list("t", api_type="user-search")
    assert (a.status, a.body["rsp_code"]) == (503, "50005")
    assert "x-api-tran-id" in a.headers
    card = await c.send("GET", f"{c.urls['CARD000001']}/v1/card/cards", headers=c.headers())
    assert card.body["rsp_code"] == "00000"  # only BANK000001 is down
    clock.advance(59.9)
    assert await code() == "50005"
    clock.advance(0.1)
    assert await code() == "00000"


async def test_down_in_reset_mode_drops_the_connection(start_sim: StartSim,
                                                       clock: FakeClock) -> None:
    scen = Scenario(defaults=Behaviour(latency_median_ms=0),
                    timeline=(Event("*", 0, 10, "down", mode="reset"),))
    sim, c = await start_sim(scen)
    with pytest.raises(aiohttp.ClientError):
        await c.bank_detail("acc-1")  # POST: the client does not retry it on its own
    clock.advance(10)
    assert (await c.bank_detail("acc-1")).body["rsp_code"] == "00000"
    assert sim.stats()["providers"]["BANK000001"]["by_code"] == {"reset": 1, "00000": 1}


async def test_error_event_answers_its_code_at_its_rate(start_sim: StartSim,
                                                        clock: FakeClock) -> None:
    scen = Scenario(defaults=Behaviour(latency_median_ms=0),
                    timeline=(Event("BANK000001", 5, 6, "error", code="50002", rate=1.0),
                              Event("BANK000001", 10, 11, "error", code="50001", rate=0.5)))
    _sim, c = await start_sim(scen)
    clock.advance(5)
    assert (await c.bank_list("t", api_type="user-search")).body["rsp_code"] == "50002"
    clock.advance(5)
    codes = [(await c.bank_list("t", api_type="user-search")).body["rsp_code"]
             for _ in range(60)]
    assert set(codes) == {"00000", "50001"}
    assert 10 < codes.count("50001") < 50


def test_slow_event_multiplies_the_latency(clock: FakeClock) -> None:
    from batch.config import parse_institutions
    from batch.simulator.fleet import build_fleet
    from batch.simulator.stats import ProviderStats
    from tests.simulator.conftest import institutions_toml

    inst = parse_institutions(institutions_toml())
    scen = Scenario(defaults=Behaviour(latency_median_ms=5, latency_p99_ms=20),
                    timeline=(Event("BANK000001", 1, 2, "slow", factor=10),))
    sim = build_fleet(inst, scen, clock=clock, window_override=None, seed=0,
                      total=ProviderStats())["BANK000001"]
    h = {"x-api-tran-id": "OPERATOR01M00000000000042", "x-api-type": "user-search",
         "Authorization": "Bearer t"}
    before = sim.call(False, h, {}, None).delay
    clock.advance(1)
    during = sim.call(False, h, {}, None).delay
    clock.advance(1)
    after = sim.call(False, h, {}, None).delay
    assert before > 0
    assert during == pytest.approx(before * 10)
    assert after == pytest.approx(before)


async def test_faults_are_reproducible_for_the_same_seed_and_tran_ids(
        start_sim: StartSim) -> None:
    scen = Scenario(defaults=Behaviour(latency_median_ms=0, faults={
        "50001": 0.1, "50002": 0.1, "50003": 0.1, "50005": 0.1}))
    runs = []
    for _ in range(2):
        _sim, c = await start_sim(scen, seed=7)
        tran = (f"OPERATOR01M{i:014d}" for i in range(100))
        runs.append([(await c.bank_list("t", api_type="user-search", tran=next(tran)))
                     .body["rsp_code"] for _ in range(100)])
    assert runs[0] == runs[1]
    assert set(runs[0]) == {"00000", "50001", "50002", "50003", "50005"}


async def test_dead_assets_stay_dead(start_sim: StartSim) -> None:
    scen = Scenario(defaults=Behaviour(latency_median_ms=0, dead_assets=frozenset({"acc-1"})))
    sim, c = await start_sim(scen)
    codes = {(await c.bank_detail("acc-1")).body["rsp_code"] for _ in range(3)}
    sim.reset()
    codes.add((await c.bank_detail("acc-1")).body["rsp_code"])
    assert len(codes) == 1
    assert codes <= {"40404", "40305"}
    assert (await c.bank_detail("acc-2")).body["rsp_code"] == "00000"


async def test_dead_fraction_kills_the_same_items_every_time(start_sim: StartSim) -> None:
    scen = Scenario(defaults=Behaviour(latency_median_ms=0, dead_asset_fraction=0.3))
    _sim, c = await start_sim(scen)
    first = [(await c.bank_detail(f"acc-{i}")).body["rsp_code"] for i in range(50)]
    again = [(await c.bank_detail(f"acc-{i}")).body["rsp_code"] for i in range(50)]
    assert first == again
    assert {"00000", "40404", "40305"} == set(first)
    a = await c.bank_detail(f"acc-{first.index('40404')}")
    assert a.status == 404
    a = await c.bank_detail(f"acc-{first.index('40305')}")
    assert a.status == 403


async def test_detail_without_its_id_is_40001(start_sim: StartSim) -> None:
    _sim, c = await start_sim()
    a = await c.send("POST", f"{c.urls['BANK000001']}/v1/bank/accounts/deposit/basic",
                     json={"org_code": "BANK000001"}, headers=c.headers())
    assert (a.status, a.body["rsp_code"]) == (400, "40001")


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_down_in_refuse_mode_closes_the_port_on_time(start_sim: StartSim,
                                                           clock: FakeClock) -> None:
    scen = Scenario(defaults=Behaviour(latency_median_ms=0),
                    timeline=(Event("BANK000001", 30, 90, "down", mode="refuse"),))
    _sim, c = await start_sim(scen)
    port = int(c.urls["BANK000001"].rsplit(":", 1)[1])

    async def connects() -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except ConnectionRefusedError:
            return False
        writer.close()
        await writer.wait_closed()
        return True

    await _settle()
    assert await connects()
    clock.advance(29.9)
    await _settle()
    assert await connects()
    clock.advance(0.1)
    await _settle()
    assert not await connects()
    clock.advance(60)
    await _settle()
    assert await connects()
    assert (await c.bank_list("t")).body["rsp_code"] == "00000"


async def test_refuse_mode_may_not_close_a_port_other_providers_share() -> None:
    from batch.config import parse_institutions
    from batch.errors import ConfigError
    from batch.simulator import Simulator
    from tests.simulator.conftest import institutions_toml

    scen = Scenario(timeline=(Event("CARD000001", 0, 1, "down", mode="refuse"),))
    sim = Simulator(parse_institutions(institutions_toml()), scen)
    with pytest.raises(ConfigError) as err:
        await sim.start()
    assert err.value.field == "timeline[0].mode"
