"""Header checks over real HTTP, in MYDATA.md's order, with the tran id always echoed."""

from __future__ import annotations

import pytest

from batch.simulator import Behaviour, Scenario
from tests.simulator.conftest import StartSim, tran_id


@pytest.mark.parametrize("bad", [None, "", "OPERATOR01M0000000000001", "OPERATOR01M000000000000001",
                                 "OPERATOR01M00000000-00001"])
async def test_malformed_tran_id_is_40002_before_type_and_token(start_sim: StartSim,
                                                               bad: str | None) -> None:
    _sim, c = await start_sim()
    headers = {"x-api-type": "nonsense"}
    if bad is not None:
        headers["x-api-tran-id"] = bad
    a = await c.send("GET", f"{c.urls['BANK000001']}/v1/bank/accounts", headers=headers,
                     params={"limit": "10"})
    assert (a.status, a.body["rsp_code"]) == (400, "40002")
    if bad:
        assert a.headers["x-api-tran-id"] == bad


@pytest.mark.parametrize("api_type", [None, "batch", "SCHEDULED"])
async def test_unknown_api_type_is_40001_before_token(start_sim: StartSim,
                                                      api_type: str | None) -> None:
    _sim, c = await start_sim()
    a = await c.bank_list(api_type=api_type, token=None)  # type: ignore[arg-type]
    assert (a.status, a.body["rsp_code"]) == (400, "40001")


async def test_missing_bearer_token_is_40101(start_sim: StartSim) -> None:
    _sim, c = await start_sim()
    h = c.headers(token=None)
    a = await c.send("GET", f"{c.urls['BANK000001']}/v1/bank/accounts", headers=h)
    assert (a.status, a.body["rsp_code"]) == (401, "40101")
    h = c.headers(token=None) | {"Authorization": "Basic abc"}
    a = await c.send("GET", f"{c.urls['BANK000001']}/v1/bank/accounts", headers=h)
    assert (a.status, a.body["rsp_code"]) == (401, "40101")


async def test_token_the_scenario_marks_expired_is_40101_and_others_pass(
        start_sim: StartSim) -> None:
    _sim, c = await start_sim(Scenario(defaults=Behaviour(latency_median_ms=0,
                                                         expired_tokens=frozenset({"old"}))))
    assert (await c.bank_list("old")).body["rsp_code"] == "40101"
    assert (await c.bank_list("anything-else")).body["rsp_code"] == "00000"


async def test_expired_fraction_is_deterministic_by_token(start_sim: StartSim) -> None:
    scen = Scenario(defaults=Behaviour(latency_median_ms=0, expired_token_fraction=0.5))
    _sim, c = await start_sim(scen)
    first = [(await c.bank_list(f"t{i}", api_type="user-search")).body["rsp_code"]
             for i in range(40)]
    again = [(await c.bank_list(f"t{i}", api_type="user-search")).body["rsp_code"]
             for i in range(40)]
    assert first == again
    assert 5 < first.count("40101") < 35
    assert set(first) == {"00000", "40101"}


async def test_tran_id_is_echoed_on_success_and_on_every_error(start_sim: StartSim) -> None:
    sim, c = await start_sim(cps={"BANK000001": 1})
    for kw in ({}, {"api_type": "bogus"}, {"token": None}, {}, {}):
        t = tran_id()
        a = await c.bank_list(tran=t, **kw)
        assert a.headers["x-api-tran-id"] == t
    codes = sim.stats()["providers"]["BANK000001"]["by_code"]
    # burst 2: the 4th call is a second transfer (42901), the 5th finds the bucket empty
    assert codes == {"00000": 1, "40001": 1, "40101": 1, "42901": 1, "42902": 1}


async def test_duplicate_tran_id_in_a_day_is_counted_and_rejected_when_configured(
        start_sim: StartSim) -> None:
    sim, c = await start_sim()
    t = tran_id()
    await c.bank_list("a", api_type="user-search", tran=t)
    a = await c.bank_list("a", api_type="user-search", tran=t)
    assert a.body["rsp_code"] == "00000"
    assert sim.stats()["providers"]["BANK000001"]["violations"]["duplicate_tran_id"] == 1

    _sim2, c2 = await start_sim(Scenario(defaults=Behaviour(latency_median_ms=0,
                                                           reject_duplicate_tran_id=True)))
    await c2.bank_list("a", api_type="user-search", tran=t)
    a = await c2.bank_list("a", api_type="user-search", tran=t)
    assert (a.status, a.body["rsp_code"]) == (400, "40002")
    assert a.headers["x-api-tran-id"] == t
