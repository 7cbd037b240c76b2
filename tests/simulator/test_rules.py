"""Scheduled-transfer rules over real HTTP: one transfer a week, windows, pagination."""

from __future__ import annotations

from datetime import datetime

from batch.clock import KST, FakeClock
from batch.simulator import Behaviour, Scenario, consent_key
from planning.windows import parse_window
from tests.simulator.conftest import StartSim


async def test_second_scheduled_transfer_in_a_week_is_42901_but_next_pages_are_not(
        start_sim: StartSim, clock: FakeClock) -> None:
    sim, c = await start_sim(Scenario(defaults=Behaviour(latency_median_ms=0, items_min=3,
                                                         items_max=3)))
    first = await c.bank_list("tok-a", limit=1)
    assert first.body["rsp_code"] == "00000"
    page2 = await c.bank_list("tok-a", limit=1, next_page=first.body["next_page"])
    page3 = await c.bank_list("tok-a", limit=1, next_page=page2.body["next_page"])
    assert [page2.body["rsp_code"], page3.body["rsp_code"]] == ["00000", "00000"]
    assert "next_page" not in page3.body
    clock.set_now(datetime(2026, 12, 5, 23, 30, tzinfo=KST))  # Saturday, same week
    again = await c.bank_list("tok-a", limit=1)
    assert (again.status, again.body["rsp_code"]) == (429, "42901")
    s = sim.stats(detail=True)
    assert s["providers"]["BANK000001"]["violations"]["second_transfer"] == 1
    assert s["providers"]["BANK000001"]["transfers"] == 1
    assert s["consents"]["BANK000001"] == {consent_key("tok-a"): 1}


async def test_a_new_week_starting_sunday_allows_the_next_transfer(
        start_sim: StartSim, clock: FakeClock) -> None:
    sim, c = await start_sim()
    assert (await c.bank_list("tok-a")).body["rsp_code"] == "00000"
    clock.set_now(datetime(2026, 12, 6, 1, 0, tzinfo=KST))  # Sunday: a new week
    assert (await c.bank_list("tok-a")).body["rsp_code"] == "00000"
    assert sim.stats()["providers"]["BANK000001"]["violations"]["second_transfer"] == 0


async def test_user_initiated_and_other_consents_calls_are_not_limited(
        start_sim: StartSim) -> None:
    sim, c = await start_sim()
    assert (await c.bank_list("tok-a")).body["rsp_code"] == "00000"
    for api_type in ("user-search", "user-refresh", "user-consent"):
        assert (await c.bank_list("tok-a", api_type=api_type)).body["rsp_code"] == "00000"
    assert (await c.bank_list("tok-b")).body["rsp_code"] == "00000"
    assert sim.stats()["total"]["transfers"] == 2


async def test_a_failed_first_page_is_not_a_transfer(start_sim: StartSim) -> None:
    scen = Scenario(defaults=Behaviour(latency_median_ms=0, faults={"50001": 1.0}))
    sim, c = await start_sim(scen)
    assert (await c.bank_list("tok-a")).body["rsp_code"] == "50001"
    assert sim.stats()["total"]["transfers"] == 0


async def test_scheduled_call_outside_the_windows_is_rejected_and_counted(
        start_sim: StartSim, clock: FakeClock) -> None:
    sim, c = await start_sim()
    clock.set_now(datetime(2026, 11, 30, 6, 0, tzinfo=KST))  # windows 0030-0530, 2300-0030
    a = await c.bank_list("tok-a")
    assert (a.status, a.body["rsp_code"]) == (403, "40301")
    assert (await c.bank_list("tok-a", api_type="user-search")).body["rsp_code"] == "00000"
    clock.set_now(datetime(2026, 11, 30, 23, 0, tzinfo=KST))
    assert (await c.bank_list("tok-a")).body["rsp_code"] == "00000"
    v = sim.stats()["providers"]["BANK000001"]["violations"]
    assert v["window"] == 1


async def test_window_rejection_code_is_configurable(start_sim: StartSim,
                                                     clock: FakeClock) -> None:
    sim, c = await start_sim(Scenario(defaults=Behaviour(latency_median_ms=0,
                                                         window_reject_code="42902")))
    clock.set_now(datetime(2026, 11, 30, 12, 0, tzinfo=KST))
    a = await c.bank_list("tok-a")
    assert (a.status, a.body["rsp_code"]) == (429, "42902")
    assert sim.stats()["total"]["violations"] == {
        "rate": 0, "window": 1, "duplicate_tran_id": 0, "second_transfer": 0, "concurrency": 0}


async def test_window_override_replaces_every_providers_windows(
        start_sim: StartSim, clock: FakeClock) -> None:
    _sim, c = await start_sim(window_override=[parse_window("1201:1203", step=1)])
    clock.set_now(datetime(2026, 11, 30, 12, 2, tzinfo=KST))
    assert (await c.bank_list("tok-a")).body["rsp_code"] == "00000"
    clock.set_now(datetime(2026, 11, 30, 12, 3, tzinfo=KST))
    assert (await c.bank_list("tok-b")).body["rsp_code"] == "40301"
    clock.set_now(datetime(2026, 12, 1, 1, 0, tzinfo=KST))  # inside the registered windows
    assert (await c.bank_list("tok-c")).body["rsp_code"] == "40301"


async def test_pages_walk_every_item_once_and_limit_is_checked(start_sim: StartSim) -> None:
    _sim, c = await start_sim(Scenario(defaults=Behaviour(latency_median_ms=0, items_min=1,
                                                         items_max=7)))
    for token in ("p1", "p2", "p3"):
        whole = (await c.bank_list(token, api_type="user-search")).body
        ids: list[str] = []
        page = await c.bank_list(token, limit=2)
        while True:
            ids += [i["account_num"] for i in page.body["account_list"]]
            assert page.body["account_cnt"] == len(page.body["account_list"])
            if "next_page" not in page.body:
                break
            page = await c.bank_list(token, limit=2, next_page=page.body["next_page"])
        assert ids == [i["account_num"] for i in whole["account_list"]]
        assert 1 <= len(ids) <= 7
    for bad in (0, 501):
        a = await c.bank_list("p9", limit=bad)
        assert (a.status, a.body["rsp_code"]) == (400, "40001")


async def test_items_per_consent_depend_on_token_and_seed(start_sim: StartSim) -> None:
    scen = Scenario(defaults=Behaviour(latency_median_ms=0, items_min=1, items_max=20))
    _, c1 = await start_sim(scen, seed=1)
    _, c1b = await start_sim(scen, seed=1)
    _, c2 = await start_sim(scen, seed=2)

    async def counts(c: object) -> list[int]:
        return [(await c.bank_list(f"t{i}", api_type="user-search")).body["account_cnt"]  # type: ignore[attr-defined]
                for i in range(10)]

    a, b, d = await counts(c1), await counts(c1b), await counts(c2)
    assert a == b
    assert a != d


async def test_card_list_and_detail_in_the_path_under_a_shared_port(
        start_sim: StartSim) -> None:
    sim, c = await start_sim()
    base = c.urls["CARD000001"]
    lst = await c.send("GET", f"{base}/v1/card/cards", params={"limit": "500"},
                       headers=c.headers("tok-c"))
    assert lst.body["rsp_code"] == "00000"
    card_id = lst.body["card_list"][0]["card_id"]
    assert lst.body["card_cnt"] == len(lst.body["card_list"])
    det = await c.send("GET", f"{base}/v1/card/cards/{card_id}", headers=c.headers("tok-c"))
    assert (det.body["rsp_code"], det.body["card_id"]) == ("00000", card_id)
    inv = await c.send("GET", f"{c.urls['INVEST0001']}/v1/invest/accounts",
                       headers=c.headers("tok-c"))
    assert inv.body["rsp_code"] == "00000"
    s = sim.stats()["providers"]
    assert s["CARD000001"]["by_route"] == {"GET /v1/card/cards": 1, "GET /v1/card/cards/{id}": 1}
    assert s["INVEST0001"]["transfers"] == 1
    assert s["CARD000001"]["transfers"] == 1


async def test_a_card_id_in_the_path_is_read_back_decoded(start_sim: StartSim) -> None:
    """The client sends an id as one percent-encoded segment (routes.detail_path); the
    simulator decodes it after splitting the path as sent, so a '/' in it stays in the id."""
    sim, c = await start_sim()
    base = c.urls["CARD000001"]
    det = await c.send("GET", f"{base}/v1/card/cards/a%2Fb%3F1%20%EC%B9%B4",
                       headers=c.headers("tok-c"))
    assert (det.body["rsp_code"], det.body["card_id"]) == ("00000", "a/b?1 카")
    assert sim.stats()["providers"]["CARD000001"]["by_route"] == {
        "GET /v1/card/cards/{id}": 1}
