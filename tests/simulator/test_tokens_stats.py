"""Token refresh, and stats that count exactly what the server saw."""

from __future__ import annotations

import json
from datetime import datetime

from batch.clock import KST, FakeClock
from batch.simulator import Behaviour, Event, Scenario, consent_key
from tests.simulator.conftest import StartSim


async def test_refresh_answers_a_new_token_that_works_even_when_all_tokens_expire(
        start_sim: StartSim) -> None:
    _sim, c = await start_sim(Scenario(defaults=Behaviour(latency_median_ms=0,
                                                         expired_token_fraction=1.0)))
    assert (await c.bank_list("old-access")).body["rsp_code"] == "40101"
    url = f"{c.urls['BANK000001']}/oauth/2.0/token"
    form = await c.send("POST", url, data={"grant_type": "refresh_token",
                                           "refresh_token": "r-1"})
    assert form.status == 200
    assert form.body["token_type"] == "Bearer"
    assert form.body["expires_in"] > 0
    assert form.body["access_token"] and form.body["refresh_token"]
    assert (await c.bank_list(form.body["access_token"])).body["rsp_code"] == "00000"
    js = await c.send("POST", url, json={"grant_type": "refresh_token", "refresh_token": "r-2"})
    assert js.body["access_token"] != form.body["access_token"]
    assert (await c.bank_list(js.body["access_token"])).body["rsp_code"] == "00000"


async def test_refresh_with_wrong_grant_or_no_refresh_token_is_40001(
        start_sim: StartSim) -> None:
    _sim, c = await start_sim()
    url = f"{c.urls['BANK000001']}/oauth/2.0/token"
    for data in ({"grant_type": "password", "refresh_token": "r"}, {"grant_type": "refresh_token"}):
        a = await c.send("POST", url, data=data)
        assert (a.status, a.body["rsp_code"]) == (400, "40001")


async def test_refreshed_tokens_alias_back_to_the_same_consent(start_sim: StartSim) -> None:
    sim, c = await start_sim()
    url = f"{c.urls['BANK000001']}/oauth/2.0/token"
    assert (await c.bank_list("acc-a")).body["rsp_code"] == "00000"
    # the old access token sent along ties the new pair to its consent
    new = await c.send("POST", url, data={"grant_type": "refresh_token", "refresh_token": "r"},
                       headers={"Authorization": "Bearer acc-a"})
    assert (await c.bank_list(new.body["access_token"])).body["rsp_code"] == "42901"
    # without it, a refresh token we issued still leads back to the consent
    newer = await c.send("POST", url, data={"grant_type": "refresh_token",
                                            "refresh_token": new.body["refresh_token"]})
    assert (await c.bank_list(newer.body["access_token"])).body["rsp_code"] == "42901"
    s = sim.stats(detail=True)
    assert s["consents"]["BANK000001"] == {consent_key("acc-a"): 1}
    assert s["providers"]["BANK000001"]["violations"]["second_transfer"] == 2


async def test_stats_count_exactly_what_was_sent(start_sim: StartSim) -> None:
    sim, c = await start_sim(cps={"BANK000001": 10})  # burst 2
    await c.bank_list("t1")                          # 00000 scheduled, transfer
    await c.bank_list("t1", api_type="user-search")  # 00000
    await c.bank_list("t2", api_type="bogus")        # 40001 before the bucket
    await c.bank_detail("acc-1")                     # bucket empty: 42902
    await c.send("POST", f"{c.urls['BANK000001']}/oauth/2.0/token",
                 data={"grant_type": "refresh_token", "refresh_token": "r"})
    await c.send("GET", f"{c.urls['CARD000001']}/v1/card/cards/x1", headers=c.headers())
    s = sim.stats()
    bank = s["providers"]["BANK000001"]
    assert bank["calls"] == 5
    assert bank["by_route"] == {"GET /v1/bank/accounts": 3,
                                "POST /v1/bank/accounts/deposit/basic": 1,
                                "POST /oauth/2.0/token": 1}
    assert bank["by_api_type"] == {"scheduled": 2, "user-search": 1, "invalid": 1,
                                   "missing": 1}
    assert bank["by_code"] == {"00000": 3, "40001": 1, "42902": 1}
    assert bank["transfers"] == 1
    assert bank["violations"]["rate"] == 1
    assert bank["peak_100ms"] == 5  # the FakeClock stood still: one 100 ms bucket
    assert bank["peak_1s"] == 5
    assert bank["peak_concurrency"] == 1
    assert set(bank["latency_ms"]) == {"p50", "p90", "p99", "max"}
    card = s["providers"]["CARD000001"]
    assert card["calls"] == 1
    assert s["providers"]["INVEST0001"]["calls"] == 0
    total = s["total"]
    assert total["calls"] == 6
    assert total["by_code"] == {"00000": 4, "40001": 1, "42902": 1}
    assert total["by_route"]["GET /v1/card/cards/{id}"] == 1


async def test_peaks_follow_the_injected_clock(start_sim: StartSim, clock: FakeClock) -> None:
    sim, c = await start_sim()
    for _ in range(3):
        await c.bank_list("t", api_type="user-search")
        clock.advance(0.1)
    clock.advance(5)
    await c.bank_list("t", api_type="user-search")
    s = sim.stats()["providers"]["BANK000001"]
    assert (s["peak_100ms"], s["peak_1s"]) == (1, 3)


async def test_stats_over_http_and_reset_clear_counters_and_transfers(
        start_sim: StartSim) -> None:
    sim, c = await start_sim()
    await c.bank_list("secret-token-1")
    await c.bank_list("secret-token-1")
    raw = await c.session.get(f"{c.urls['CARD000001']}/_sim/stats?detail=consents")
    text = await raw.text()
    assert "secret-token" not in text
    s = json.loads(text)
    assert s["providers"]["BANK000001"]["calls"] == 2
    assert s["consents"]["BANK000001"] == {consent_key("secret-token-1"): 1}
    r = await c.session.post(f"{c.urls['BANK000001']}/_sim/reset")
    assert r.status == 200
    s = sim.stats(detail=True)
    assert s["providers"]["BANK000001"]["calls"] == 0
    assert s["total"]["violations"]["second_transfer"] == 0
    assert s["consents"]["BANK000001"] == {}
    assert (await c.bank_list("secret-token-1")).body["rsp_code"] == "00000"


async def test_unknown_route_is_404_with_the_tran_id(start_sim: StartSim) -> None:
    sim, c = await start_sim()
    h = c.headers()
    a = await c.send("GET", f"{c.urls['BANK000001']}/v1/card/cards", headers=h)
    assert a.status == 404
    assert a.headers["x-api-tran-id"] == h["x-api-tran-id"]
    assert sim.stats()["total"]["calls"] == 0


async def test_the_same_week_ends_on_saturday_night_kst(start_sim: StartSim,
                                                        clock: FakeClock) -> None:
    _sim, c = await start_sim()
    clock.set_now(datetime(2026, 12, 5, 23, 59, tzinfo=KST))  # Saturday 23:59 KST
    assert (await c.bank_list("w")).body["rsp_code"] == "00000"
    clock.set_now(datetime(2026, 12, 6, 0, 0, tzinfo=KST))  # Sunday 00:00: next week
    assert (await c.bank_list("w")).body["rsp_code"] == "00000"


async def test_token_refresh_fails_while_the_provider_is_down(start_sim: StartSim,
                                                             clock: FakeClock) -> None:
    _sim, c = await start_sim(Scenario(defaults=Behaviour(latency_median_ms=0),
                                      timeline=(Event("BANK000001", 10, 20, "down"),)))
    url = f"{c.urls['BANK000001']}/oauth/2.0/token"
    data = {"grant_type": "refresh_token", "refresh_token": "r"}
    clock.advance(10)
    a = await c.send("POST", url, data=data)
    assert (a.status, a.body["rsp_code"]) == (503, "50005")
    clock.advance(10)
    assert (await c.send("POST", url, data=data)).status == 200
