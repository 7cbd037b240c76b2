"""The MyData client over httpx's MockTransport: headers, pages in order, details, token
refresh once, resuming details, the window guard, and no cookies between consents."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from batch.client import REVOKED_MEANWHILE, MydataClient, Progress, make_http_client
from batch.clock import FakeClock
from batch.config import Institutions, Provider, parse_institutions
from batch.lifecycle import error_line
from batch.resilience.outcomes import Kind, Layer, Outcome
from batch.tranid import TRAN_ID_RE, TranIdGenerator


def _institutions(org_code: str, industry: str, base_url: str) -> Institutions:
    return parse_institutions(f'''operator_org_code = "OPERATOR01"
[[providers]]
org_code = "{org_code}"
industry = "{industry}"
base_url = "{base_url}"
windows = ["0000:0600"]
calls_per_second = 10
max_concurrency = 2
''')


INSTS = _institutions("BANK000001", "bank", "http://127.0.0.1:9")


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
           page_limit: int = 500, provider: Provider = INSTS.providers[0],
           ) -> tuple[MydataClient, httpx.AsyncClient]:
    http = make_http_client(transport=httpx.MockTransport(handler))
    return MydataClient(provider, http=http, chain=PassThrough(),
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


@pytest.mark.parametrize(("method", "path", "content"), [
    ("GET", "/v1/bank/accounts", {"params": {"org_code": "BANK000001", "limit": 500}}),
    ("GET", "/v1/card/cards/C%2F1", {"params": {"org_code": "BANK000001"}}),
    ("POST", "/v1/bank/accounts/deposit/basic", {"json": {
        "org_code": "BANK000001", "account_num": "계좌-1 \"x\"", "search_timestamp": 0}}),
    ("POST", "/v1/bank/accounts/deposit/basic", {}),
    ("POST", "/oauth/2.0/token", {"data": {"grant_type": "refresh_token",
                                           "refresh_token": "r 1&2"}}),
])
def test_a_request_is_the_one_httpx_would_build(
        method: str, path: str, content: dict[str, Any]) -> None:
    """The client builds its list and detail requests itself (a third of the time): the
    method, URL, every header in httpx's order, the body and the timeouts are httpx's."""
    c, _ = client(fleet()[0])
    ours = c._request(method, path, "tok-a", "T" * 25, 9.5, **content)
    params = content.get("params")
    theirs = httpx.Request(
        method, httpx.URL(c._base + path, params=params),
        headers={"Authorization": "Bearer tok-a", "x-api-tran-id": "T" * 25,
                 "x-api-type": "scheduled"},
        json=content.get("json"), data=content.get("data"),
        extensions={"timeout": httpx.Timeout(9.5, connect=min(
            INSTS.providers[0].connect_timeout, 9.5)).as_dict()})
    assert (ours.method, ours.url, ours.headers.raw, ours.content) == (
        theirs.method, theirs.url, theirs.headers.raw, theirs.content)
    assert ours.extensions == theirs.extensions


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


def _pages(*bodies: dict[str, object]) -> tuple[Handler, list[httpx.Request]]:
    """A provider whose list pages are ``bodies`` in order (00000 added), each ``next_page``
    as given; every detail call answers 00000."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "POST":
            return httpx.Response(200, json={"rsp_code": "00000"})
        n = sum(r.method == "GET" for r in seen) - 1
        return httpx.Response(200, content=json.dumps({"rsp_code": "00000", **bodies[n]}),
                              headers={"content-type": "application/json"})

    return handle, seen


@pytest.mark.parametrize(("entries", "named"), [
    ([{"account_num": "A\x00"}], "entry 0"),
    ([{"account_num": "A1"}, {"account_num": "\ud800"}], "entry 1"),
    ([{"account_num": "x" * 65}], "entry 0"),
    ([{"account_num": ""}], "entry 0"),
    ([{"account_num": {"num": 1}}], "entry 0"),
    ([{"account_num": True}], "entry 0"),
    ([{"account_num": 1.5}], "entry 0"),
    ([{"other": "A1"}], "entry 0"),
    (["A1"], "entry 0"),
    ({"account_num": "A1"}, "not a list"),
])
async def test_a_list_page_whose_ids_cannot_be_read_is_the_providers_fault(
        entries: object, named: str) -> None:
    """An id goes into the provider's URL or body and into our database, where a NUL or a
    lone surrogate makes PostgreSQL refuse the whole batch it rides in. A 00000 page with
    an entry we cannot read is a provider fault (retried later), named and escaped in the
    detail, and no detail call is made on what it held."""
    handler, seen = _pages({"account_list": entries})
    c, http = client(handler)
    res = await c.refresh(access_token="tok-a", refresh_token=None)
    await http.aclose()
    out = res.outcome
    assert out.kind is Kind.FAULT and out.action.value == "retry_later"
    assert named in out.detail and out.detail.isprintable() and len(out.detail) < 120
    assert res.progress is None and res.items == 0 and len(seen) == 1


async def test_a_later_page_that_cannot_be_read_is_asked_again_at_its_cursor() -> None:
    """Page 1 was a transfer: a later page the client cannot read (an entry, or its own
    next_page cursor) keeps the items before it and that page's cursor, never page 1."""
    for broken in ({"account_list": [{"account_num": "B\x00"}]},
                   {"account_list": [{"account_num": "B1"}], "next_page": "p\x003"},
                   {"account_list": [{"account_num": "B1"}], "next_page": "p" * 513},
                   {"account_list": [{"account_num": "B1"}], "next_page": ["p3"]}):
        handler, seen = _pages({"account_list": [{"account_num": "A1"}, {"account_num": 7}],
                                "next_page": "p2"}, broken)
        c, http = client(handler)
        res = await c.refresh(access_token="tok-a", refresh_token=None)
        await http.aclose()
        assert res.outcome.kind is Kind.FAULT, broken
        assert res.progress == Progress(("A1", "7"), "p2"), broken
        assert [r.method for r in seen] == ["GET", "GET"]
        assert "\x00" not in res.outcome.detail and res.outcome.detail.isprintable()


async def test_an_id_in_a_detail_path_is_one_encoded_segment() -> None:
    """A card's id goes into the detail path: one that holds '/', '?', '#', '..' or '%'
    cannot reach another route or add a query; the simulator reads the same id back."""
    card = _institutions("CARD000001", "card", "https://card.example").providers[0]
    odd = ["../../oauth/2.0/token", "a/b?limit=1#x", "50%", "카드 1"]
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/card/cards":
            return httpx.Response(200, json={"rsp_code": "00000", "card_list": [
                {"card_id": i} for i in odd]})
        return httpx.Response(200, json={"rsp_code": "00000"})

    c, http = client(handle, provider=card)
    res = await c.refresh(access_token="tok-a", refresh_token=None)
    await http.aclose()
    assert res.outcome.kind is Kind.SUCCESS
    details = seen[1:]
    paths = [r.url.raw_path.decode().partition("?")[0] for r in details]
    assert paths == [
        "/v1/card/cards/..%2F..%2Foauth%2F2.0%2Ftoken", "/v1/card/cards/a%2Fb%3Flimit%3D1%23x",
        "/v1/card/cards/50%25", "/v1/card/cards/%EC%B9%B4%EB%93%9C%201"]
    assert all(r.url.host == "card.example" and set(r.url.params) == {
        "org_code", "search_timestamp"} for r in details)
    assert [unquote(p.rpartition("/")[2]) for p in paths] == odd


async def test_an_error_of_the_http_stack_itself_is_an_unknown_outcome_that_keeps_progress(
        caplog: pytest.LogCaptureFixture) -> None:
    """aiohttp 3.14 once raised AttributeError reading an answer (its headers were None).
    Out of the send, any exception is the HTTP stack's bug, after the request may have
    left: the attempt's outcome is unknown, the refresh keeps what it read (page 2 again,
    never page 1), and the error is logged with its traceback but no token."""
    handler, seen = fleet(items=3)

    def flaky(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("next_page") == "2":
            seen.append(request)
            raise AttributeError("'NoneType' object has no attribute 'getall'")
        return handler(request)

    c, http = client(flaky, page_limit=2)
    with caplog.at_level("ERROR", logger="mydata.client"):
        res = await c.refresh(access_token="tok-SECRET-1", refresh_token=None)
    await http.aclose()
    out = res.outcome
    assert out.kind is Kind.TIMEOUT and out.action.value == "unknown" and out.is_failure
    assert out.detail == "HTTP layer error AttributeError: outcome unknown"
    assert res.progress == Progress(("A0", "A1"), "2") and len(seen) == 2
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "http_layer_error"]
    assert record.exc_info is not None and "getall" in record.error
    assert "tok-SECRET-1" not in caplog.text


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


async def test_a_consent_revoked_while_its_token_was_refreshed_gets_no_retried_call(
) -> None:
    """``revoke`` landed during the refresh: the store refuses the new pair (False) and
    the consent is not called again; the refresh ends on the provider's 40101."""
    handler, seen = fleet(items=1, expired=frozenset({"tok-OLD-123"}))
    c, http = client(handler)

    async def revoked(access: str, refresh: str | None) -> bool:
        return False

    res = await c.refresh(access_token="tok-OLD-123", refresh_token="r1", on_token=revoked)
    await http.aclose()
    assert len(seen) == 2 and res.calls == 2  # the list call's 40101, the token call
    assert (res.outcome.kind, res.outcome.rsp_code) == (Kind.CONSENT, "40101")
    assert res.outcome.detail == REVOKED_MEANWHILE
    assert res.new_access_token is None  # nothing for the caller to store either


async def test_a_token_pair_that_could_not_be_saved_comes_back_in_the_result() -> None:
    handler, _ = fleet(items=1, expired=frozenset({"tok-OLD-123"}))
    c, http = client(handler)

    async def broken(access: str, refresh: str | None) -> None:
        raise ConnectionError("database down")

    res = await c.refresh(access_token="tok-OLD-123", refresh_token="r1", on_token=broken)
    await http.aclose()
    assert res.outcome.kind is Kind.SUCCESS
    assert res.new_access_token == "tok-NEW-456" and res.new_refresh_token == "r2"


@pytest.mark.parametrize(("status", "code", "header", "kind", "retry_after"), [
    (429, None, "7", Kind.THROTTLED, 7.0),
    (429, "42902", "2.5", Kind.THROTTLED, 2.5),
    (403, "40301", "3", Kind.THROTTLED, 3.0),
    (429, None, None, Kind.THROTTLED, None),
    (503, None, "9", Kind.FAULT, None),  # not throttled: no wait of its own
    (200, "00000", "9", Kind.SUCCESS, None),
])
async def test_a_throttled_answer_carries_its_retry_after_and_no_other_does(
        status: int, code: str | None, header: str | None, kind: Kind,
        retry_after: float | None) -> None:
    headers = {} if header is None else {"Retry-After": header}
    body = {"rsp_code": code} if code else {}
    c, http = client(lambda _r: httpx.Response(status, json=body, headers=headers))
    try:
        out = await c._attempt("GET", "/v1/bank/accounts", "tok-a", 5.0)
    finally:
        await http.aclose()
    assert out.kind is kind
    assert out.retry_after == retry_after
