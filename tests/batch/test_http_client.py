"""The shared HTTP client: one client serves every user's consents, so it keeps no cookies."""

from __future__ import annotations

import httpx

from batch.client import make_http_client


async def test_a_cookie_one_response_sets_is_never_sent_with_the_next_call() -> None:
    sent: list[str | None] = []

    def provider(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get("cookie"))
        return httpx.Response(200, json={"rsp_code": "00000"},
                              headers={"set-cookie": "session=user-a; Path=/"})

    http = make_http_client(transport=httpx.MockTransport(provider))
    try:
        for _ in range(2):
            resp = await http.get("http://127.0.0.1:9/v1/bank/accounts")
            assert resp.headers["set-cookie"] == "session=user-a; Path=/"
    finally:
        await http.aclose()
    assert sent == [None, None]
    assert len(http.cookies) == 0


async def test_the_default_client_is_the_aiohttp_transport_with_tls_verification() -> None:
    from httpx_aiohttp import AiohttpTransport

    http = make_http_client(max_connections=7)
    try:
        assert isinstance(http._transport, AiohttpTransport)
        assert http.follow_redirects is False
    finally:
        await http.aclose()
