"""The MyData client over httpx's MockTransport: headers, pages in order, details, token
refresh once, resuming details, the window guard, and no cookies between consents."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import httpx
import pytest

from batch.client import MydataClient, Progress, make_http_client
from batch.clock import FakeClock
from batch.config import parse_institutions
from batch.lifecycle import error_line
from batch.resilience.outcomes import Kind, Layer, Outcome
from batch.tranid import TRAN_ID_RE, TranIdGenerator

INSTS = parse_institutions('''operator_org_code = "OPERATOR01"
[[providers]]
org_code = "BANK000001"
industry = "bank"
base_url = "http://127.0.0.1:9"
windows = ["0000:0600"]
calls_per_second = 10
max_concurrency = 2
''')


class PassThrough:
    """A chain that just makes the attempt (the chain has its own tests)."""

    async def call(self, attempt: Callable[[float], Awaitable[Outcome]], *,
                   deadline: float | None = None) -> Outcome:
        return await attempt(10.0)


Handler = Callable[[httpx.Request], httpx.Response]


def fleet(items: int = 3, *, expired: frozenset[str] = frozenset(),
          dead: frozenset[str] = frozenset(),
          fail_detail: frozenset[str] = frozenset(),
          fail_page: frozenset[str] = frozenset()) -> tuple[Handler, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        tran = request.headers.get("x-api-tran-id", "")
        echo = {"x-api-tran-id": tran, "set-cookie": "sid=someone; Path=/"}
        if request.url.path == "/oauth/2.0/token":
            return httpx.Response(200, json={"access_token": "tok-NEW-456", "refresh_token": "r2",
                                             "token_type": "Bearer", "expires_in": 7776000})
        token = request.headers["authorization"].removeprefix("Bearer ")
        if token in expired:
            return httpx.Response(401, json={"rsp_code": "40101", "rsp_msg": "expired"},
                                  headers=echo)
        if request.url.path == "/v1/bank/accounts":
            if request.url.params.get("next_page", "") in fail_page:  # "": page 1
                return httpx.Response(500, json={"rsp_code": "50001"}, headers=echo)
            page = int(request.url.params.get("next_page", "0"))
            limit = int(request.url.params["limit"])
            ids = [f"A{i}" for i in range(items)][page:page + limit]
            body = {"rsp_code": "00000", "rsp_msg": "ok", "account_cnt": len(ids),
                    "account_list": [{"account_num": a} for a in ids]}
            if page + limit < items:
                body["next_page"] = str(page + limit)
            return httpx.Response(200, json=body, headers=echo)
        num = json.loads(request.content)["account_num"]
        if num in dead:
            return httpx.Response(404, json={"rsp_code": "40404"}, headers=echo)
        if num in fail_detail:
            return httpx.Response(500, json={"rsp_code": "50001"}, headers=echo)
        return httpx.Response(200, json={"rsp_code": "00000", "basic_cnt": 1}, headers=echo)

    return handle, seen


def client(handler: Callable[[httpx.Request], httpx.Response], clock: FakeClock | None = None,
           page_limit: int = 500) -> tuple[MydataClient, httpx.AsyncClient]:
    http = make_http_client(transport=httpx.MockTransport(handler))
    return MydataClient(INSTS.providers[0], http=http, chain=PassThrough(),
                        tran_ids=TranIdGenerator("OPERATOR01", node_id=1),
                        clock=clock or FakeClock(), page_limit=page_limit), http


async def test_a_refresh_walks_pages_in_order_then_details_with_every_header() -> None:
    handler, seen = fleet(items=3)
    c, http = client(handler, page_limit=2)
    res = await c.refresh(access_token="tok-a", refresh_token=None)
    await http.aclose()
    assert res.outcome.kind is Kind.SUCCESS and res.calls == 5 and res.items == 3
    paths = [(r.method, r.url.path, r.url.params.get("next_page")) for r in seen]
    assert paths == [("GET", "/v1/bank/accounts", None), ("GET", "/v1/bank/accounts", "2"),
                     ("POST", "/v1/bank/accounts/deposit/basic", None),
                     ("POST", "/v1/bank/accounts/deposit/basic", None),
                     ("POST", "/v1/bank/accounts/deposit/basic", None)]
    tran_ids = [r.headers["x-api-tran-id"] for r in seen]
    assert all(TRAN_ID_RE.match(t) and t.startswith("OPERATOR01M") for t in tran_ids)
    assert len(set(tran_ids)) == 5  # a fresh id per call
    assert {r.headers["x-api-type"] for r in seen} == {"scheduled"}
    assert {r.headers["authorization"] for r in seen} == {"Bearer tok-a"}
    assert [json.loads(r.content)["account_num"] for r in seen[2:]] == ["A0", "A1", "A2"]
    assert all("cookie" not in r.headers for r in seen)


async def test_request_urls_parsed_once_are_the_urls_httpx_would_build() -> None:
    """Two consents, two pages each: each request's URL is what httpx makes of the string
    and the params, and the first page and the detail calls share one parsed URL."""
    handler, seen = fleet(items=3)
    c, http = client(handler, page_limit=2)
    for token in ("tok-a", "tok-b"):
        await c.refresh(access_token=token, refresh_token=None)
    await http.aclose()
    base, org = "http://127.0.0.1:9", "BANK000001"
    page1 = httpx.URL(f"{base}/v1/bank/accounts", params={
        "org_code": org, "search_timestamp": 0, "limit": 2})
    page2 = httpx.URL(f"{base}/v1/bank/accounts", params={
        "org_code": org, "search_timestamp": 0, "limit": 2, "next_page": "2"})
    detail = httpx.URL(f"{base}/v1/bank/accounts/deposit/basic")
    assert [str(r.url) for r in seen] == [str(u) for u in (page1, page2, detail, detail,
                                                           detail)] * 2
    assert seen[0].url == page1 and seen[0].url.params["limit"] == "2"
    assert sorted(map(str, c._urls.values())) == sorted(map(str, (page1, page2, detail)))


def test_the_parsed_url_cache_stays_small_when_paths_churn() -> None:
    c, _ = client(fleet()[0])
    for i in range(1000):
        assert c._url(f"/v1/card/cards/{i}/bills", {"org_code": "BANK000001"}).path == \
            f"/v1/card/cards/{i}/bills"
    assert 0 < len(c._urls) <= 256


async def test_an_expired_token_is_refreshed_once_and_the_call_retried_once() -> None:
    handler, seen = fleet(items=1, expired=frozenset({"tok-OLD-123"}))
    c, http = client(handler)
    res = await c.refresh(access_token="tok-OLD-123", refresh_token="r1")
    await http.aclose()
    assert res.outcome.kind is Kind.SUCCESS
    assert res.new_access_token == "tok-NEW-456" and res.new_refresh_token == "r2"
    assert [r.url.path for r in seen][:3] == ["/v1/bank/accounts", "/oauth/2.0/token",
                                              "/v1/bank/accounts"]
    assert "tok-OLD-123" not in repr(res) and "tok-NEW-456" not in repr(res)


async def test_without_a_refresh_token_40101_is_the_consents_problem() -> None:
    handler, seen = fleet(items=1, expired=frozenset({"tok-OLD-123"}))
    c, http = client(handler)
    res = await c.refresh(access_token="tok-OLD-123", refresh_token=None)
    await http.aclose()
    assert res.outcome.kind is Kind.CONSENT and res.outcome.rsp_code == "40101"
    assert len(seen) == 1


@pytest.mark.parametrize(("status", "code", "kind"), [
    (200, "0\x000000", Kind.CLIENT), (500, "5" * 10_000, Kind.FAULT), (200, 0, Kind.CLIENT),
    (503, "", Kind.FAULT)])
async def test_an_rsp_code_that_is_not_a_code_is_kept_out_of_the_outcome(
        status: int, code: object, kind: Kind) -> None:
    """What a provider puts in rsp_code lands in the outcome log: a NUL or a page of text
    there would make PostgreSQL refuse the whole batch of outcomes, at every retry. It is
    classified as an answer without a code, and named, escaped and cut short, in the
    detail."""
    c, http = client(lambda _r: httpx.Response(status, json={"rsp_code": code}))
    res = await c.refresh(access_token="tok-a", refresh_token=None)
    await http.aclose()
    out = res.outcome
    assert out.kind is kind and out.rsp_code is None
    assert out.detail is not None and "unreadable rsp_code" in out.detail
    assert "\x00" not in out.detail and len(out.detail) < 80 and out.detail.isprintable()
    assert "\x00" not in error_line(out)


async def test_a_failed_detail_keeps_the_rest_and_a_resume_skips_the_list() -> None:
    handler, seen = fleet(items=3, fail_detail=frozenset({"A1"}))
    c, http = client(handler)
    res = await c.refresh(access_token="t", refresh_token=None)
    assert res.outcome.kind is Kind.FAULT and res.progress == Progress(("A1", "A2"))
    seen.clear()
    handler2, seen2 = fleet(items=3)
    c2, http2 = client(handler2)
    again = await c2.refresh(access_token="t", refresh_token=None,
                             progress=res.progress)
    await http.aclose()
    await http2.aclose()
    assert again.outcome.kind is Kind.SUCCESS
    assert [r.url.path for r in seen2] == ["/v1/bank/accounts/deposit/basic"] * 2


async def test_a_dead_asset_is_skipped_and_the_consent_still_succeeds() -> None:
    handler, _ = fleet(items=3, dead=frozenset({"A0"}))
    c, http = client(handler)
    res = await c.refresh(access_token="t", refresh_token=None)
    await http.aclose()
    assert res.outcome.kind is Kind.SUCCESS and res.dead_items == ("A0",)


async def test_no_call_starts_once_the_window_has_closed() -> None:
    handler, seen = fleet(items=2)
    clock = FakeClock()
    c, http = client(handler, clock)
    res = await c.refresh(access_token="t", refresh_token=None, not_after=clock.monotonic())
    await http.aclose()
    assert res.outcome.kind is Kind.REJECTED and res.outcome.layer is Layer.WINDOW
    assert seen == [] and res.calls == 0


async def test_a_list_failing_after_page_1_resumes_at_its_cursor_never_at_page_1() -> None:
    handler, _ = fleet(items=5, fail_page=frozenset({"2"}))
    c, http = client(handler, page_limit=2)
    res = await c.refresh(access_token="t", refresh_token=None)
    assert res.outcome.kind is Kind.FAULT
    assert res.progress == Progress(("A0", "A1"), next_page="2")
    handler2, seen2 = fleet(items=5)
    c2, http2 = client(handler2, page_limit=2)
    again = await c2.refresh(access_token="t", refresh_token=None, progress=res.progress)
    await http.aclose()
    await http2.aclose()
    assert again.outcome.kind is Kind.SUCCESS and again.items == 5
    pages = [r.url.params.get("next_page") for r in seen2 if r.url.path == "/v1/bank/accounts"]
    assert pages == ["2", "4"]  # page 1 is never asked for again
    details = [json.loads(r.content)["account_num"] for r in seen2 if r.method == "POST"]
    assert details == ["A0", "A1", "A2", "A3", "A4"]


async def test_a_failing_page_1_leaves_nothing_to_resume() -> None:
    handler, _ = fleet(items=5, fail_page=frozenset({""}))
    c, http = client(handler, page_limit=2)
    res = await c.refresh(access_token="t", refresh_token=None)
    await http.aclose()
    assert res.outcome.kind is Kind.FAULT and res.progress is None


async def test_a_dead_asset_recorded_on_its_detail_call_is_never_called_again() -> None:
    handler, seen = fleet(items=3)
    c, http = client(handler)
    res = await c.refresh(access_token="t", refresh_token=None, dead_items=frozenset({"A1"}))
    await http.aclose()
    assert res.outcome.kind is Kind.SUCCESS and res.items == 3
    assert [json.loads(r.content)["account_num"] for r in seen if r.method == "POST"] == [
        "A0", "A2"]


async def test_a_refreshed_token_is_saved_before_the_retried_call() -> None:
    handler, seen = fleet(items=1, expired=frozenset({"tok-OLD-123"}))
    c, http = client(handler)
    saved: list[tuple[str, str | None, int]] = []

    async def save(access: str, refresh: str | None) -> None:
        saved.append((access, refresh, len(seen)))

    res = await c.refresh(access_token="tok-OLD-123", refresh_token="r1", on_token=save)
    await http.aclose()
    assert res.outcome.kind is Kind.SUCCESS
    # saved after the token call (2 requests so far), before the retried list call
    assert saved == [("tok-NEW-456", "r2", 2)]
    assert res.new_access_token is None  # saved: nothing left for the caller to store


async def test_a_token_pair_that_could_not_be_saved_comes_back_in_the_result() -> None:
    handler, _ = fleet(items=1, expired=frozenset({"tok-OLD-123"}))
    c, http = client(handler)

    async def broken(access: str, refresh: str | None) -> None:
        raise ConnectionError("database down")

    res = await c.refresh(access_token="tok-OLD-123", refresh_token="r1", on_token=broken)
    await http.aclose()
    assert res.outcome.kind is Kind.SUCCESS
    assert res.new_access_token == "tok-NEW-456" and res.new_refresh_token == "r2"
