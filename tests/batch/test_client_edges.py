"""Client rules at the edges: the token request's headers, 4xx without a code, one token
refresh per consent, and the page limit the client itself refuses."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

import httpx
import pytest

from batch.client import MydataClient, make_http_client
from batch.clock import FakeClock
from batch.resilience.chain import ProviderChain
from batch.resilience.outcomes import Kind, Outcome
from batch.resilience.settings import ChainSettings, LimiterSettings
from batch.routes import TOKEN_PATH
from batch.tranid import TRAN_ID_RE, TranIdGenerator
from tests.batch.test_client import INSTS, fleet


async def test_the_token_refresh_request_carries_every_mydata_header() -> None:
    handler, seen = fleet(items=1, expired=frozenset({"tok-OLD-123"}))
    c, http = _chained(httpx.MockTransport(handler))
    try:
        assert (await c.refresh(access_token="tok-OLD-123", refresh_token="r1")).outcome.ok
    finally:
        await http.aclose()
    (token_call,) = [r for r in seen if r.url.path == TOKEN_PATH]
    assert token_call.headers["authorization"] == "Bearer tok-OLD-123"
    assert token_call.headers["x-api-type"] == "scheduled"
    assert TRAN_ID_RE.match(token_call.headers["x-api-tran-id"])
    others = {r.headers["x-api-tran-id"] for r in seen if r is not token_call}
    assert token_call.headers["x-api-tran-id"] not in others


def _chained(handler: httpx.MockTransport) -> tuple[MydataClient, httpx.AsyncClient]:
    """A client behind the real chain (retries on), no backoff wait."""
    p = INSTS.providers[0]
    clock = FakeClock()
    # no limiter wait either: the fake clock never moves by itself
    settings = replace(ChainSettings.from_provider(p),
                       limiter=LimiterSettings(calls_per_second=1e6, burst=1000))
    chain = ProviderChain(p.org_code, settings, clock=clock, random=lambda: 0.0)
    http = make_http_client(transport=handler)
    return MydataClient(p, http=http, chain=chain, tran_ids=TranIdGenerator("OPERATOR01", 2),
                        clock=clock), http


@pytest.mark.parametrize("status", [400, 403, 404, 405, 409, 413, 422])
@pytest.mark.parametrize("body", [b"", b"<html>nope</html>", b'{"rsp_msg": "no code"}'],
                         ids=["empty", "html", "json-without-code"])
async def test_a_4xx_answer_without_rsp_code_is_never_retried(status: int, body: bytes) -> None:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, content=body)

    c, http = _chained(httpx.MockTransport(handle))
    res = await c.refresh(access_token="t", refresh_token="r1")
    await http.aclose()
    assert len(seen) == 1
    assert res.outcome.kind is Kind.CLIENT and not res.outcome.retryable
    assert res.outcome.attempts == 1


async def test_a_40101_refreshes_the_token_at_most_once_even_when_the_new_one_is_refused(
        ) -> None:
    # The provider refuses the old token and the new one the refresh hands out.
    handler, seen = fleet(items=3, expired=frozenset({"tok-OLD-123", "tok-NEW-456"}))
    c, http = _chained(httpx.MockTransport(handler))
    res = await c.refresh(access_token="tok-OLD-123", refresh_token="r1")
    await http.aclose()
    assert [r.url.path for r in seen] == ["/v1/bank/accounts", TOKEN_PATH, "/v1/bank/accounts"]
    assert res.outcome.kind is Kind.CONSENT and res.outcome.rsp_code == "40101"


async def test_a_40101_on_every_detail_still_refreshes_the_token_only_once() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == TOKEN_PATH:
            return httpx.Response(200, json={"access_token": "fresh", "refresh_token": "r2"})
        if request.url.path == "/v1/bank/accounts":
            return httpx.Response(200, json={"rsp_code": "00000", "account_list": [
                {"account_num": f"A{i}"} for i in range(4)]})
        return httpx.Response(401, json={"rsp_code": "40101"})

    seen: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return handle(request)

    c, http = _chained(httpx.MockTransport(record))
    res = await c.refresh(access_token="old", refresh_token="r1")
    await http.aclose()
    assert seen.count(TOKEN_PATH) == 1
    assert res.outcome.rsp_code == "40101"
    assert res.progress is not None
    assert (res.progress.items, res.progress.next_page) == (("A0", "A1", "A2", "A3"), None)


async def test_a_40101_after_a_successful_refresh_and_retry_never_refreshes_again() -> None:
    # The list's 40101 refreshes the token and its retry succeeds; the provider then
    # refuses the new token on the details too: the consent's one refresh is spent, so no
    # second token request goes out (the two tests above end the refresh on the retried
    # call itself, which never reaches a second 40101 in the same refresh).
    seen: list[tuple[str, str]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.headers.get("authorization", "")))
        if request.url.path == TOKEN_PATH:
            return httpx.Response(200, json={"access_token": "fresh", "refresh_token": "r2"})
        if request.url.path == "/v1/bank/accounts":
            if request.headers.get("authorization") == "Bearer old":
                return httpx.Response(401, json={"rsp_code": "40101"})
            return httpx.Response(200, json={"rsp_code": "00000", "account_list": [
                {"account_num": f"A{i}"} for i in range(2)]})
        return httpx.Response(401, json={"rsp_code": "40101"})

    c, http = _chained(httpx.MockTransport(handle))
    res = await c.refresh(access_token="old", refresh_token="r1")
    await http.aclose()
    paths = [path for path, _ in seen]
    assert paths.count(TOKEN_PATH) == 1
    assert paths[:3] == ["/v1/bank/accounts", TOKEN_PATH, "/v1/bank/accounts"]
    assert len(paths) == 4  # one detail call, refused, and the refresh ends there
    assert res.outcome.kind is Kind.CONSENT and res.outcome.rsp_code == "40101"
    assert res.progress is not None and res.progress.items == ("A0", "A1")


@pytest.mark.parametrize("page_limit", [0, -1, 501, 10_000])
def test_the_client_itself_refuses_a_page_limit_outside_1_to_500(page_limit: int) -> None:
    http = make_http_client(transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    with pytest.raises(ValueError, match="page_limit"):
        MydataClient(INSTS.providers[0], http=http, chain=_NeverCalled(),
                     tran_ids=TranIdGenerator("OPERATOR01", 3), clock=FakeClock(),
                     page_limit=page_limit)


@pytest.mark.parametrize("page_limit", [1, 500])
def test_the_client_accepts_the_page_limits_at_both_ends(page_limit: int) -> None:
    http = make_http_client(transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    c = MydataClient(INSTS.providers[0], http=http, chain=_NeverCalled(),
                     tran_ids=TranIdGenerator("OPERATOR01", 3), clock=FakeClock(),
                     page_limit=page_limit)
    assert c.provider is INSTS.providers[0]


class _NeverCalled:
    async def call(self, attempt: Callable[[float], Awaitable[Outcome]], *,
                   deadline: float | None = None) -> Outcome:
        raise AssertionError("no call expected")
