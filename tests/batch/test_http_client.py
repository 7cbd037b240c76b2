"""The shared HTTP client: one client serves every user's consents, so it keeps no cookies."""

from __future__ import annotations

import asyncio
import gzip
import re
from collections.abc import Awaitable, Callable

import httpx
import pytest

from batch.client import make_http_client
from tests.batch.conftest import Handler, Server


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


# -- the product's transport reads the whole answer itself (batch/client.py) ------------
# Over real HTTP on 127.0.0.1, against a tiny server (conftest.py) that counts its
# connections (``Server.requests``: one per connection its handler served).

def _answering(answer: Callable[[int], Awaitable[bytes | None]],
               seen: list[bytes]) -> Handler:
    """A connection's handler: each request read whole into ``seen``, then answered with
    ``answer(its number)`` (None: no answer, the connection left hanging)."""
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            body = await r.readexactly(int(length.group(1))) if length else b""
            seen.append(head + body)
            out = await answer(len(seen))
            if out is None:
                await asyncio.sleep(30)
                w.close()
                return
            w.write(out)
            await w.drain()

    return handle


_GZIPPED = gzip.compress(b'{"rsp_code":"00000","text":"hello"}')


async def _rich_answer(n: int) -> bytes:
    return (b"HTTP/1.1 201 Created Here\r\nContent-Type: application/json\r\n"
            b"Content-Encoding: gzip\r\nX-Twice: a\r\nX-Twice: b\r\n"
            b"Content-Length: " + str(len(_GZIPPED)).encode() + b"\r\n\r\n" + _GZIPPED)


async def test_the_answer_is_the_one_httpx_aiohttp_gives_and_the_request_the_same(
        serve: Callable[[Handler], Awaitable[Server]]) -> None:
    from httpx_aiohttp import AiohttpTransport

    seen: list[bytes] = []
    server = await serve(_answering(_rich_answer, seen))
    got = []
    for http in (make_http_client(), httpx.AsyncClient(transport=AiohttpTransport())):
        try:
            resp = await http.post(f"{server.url}/v1/bank/accounts?x=1", json={"a": "é"},
                                   headers={"Authorization": "Bearer t", "x-api-type": "s"})
            await resp.aread()
            got.append((resp.status_code, resp.reason_phrase, resp.headers.raw,
                        resp.content, resp.json(), resp.http_version))
        finally:
            await http.aclose()
    assert got[0] == got[1]
    assert got[0][3] == b'{"rsp_code":"00000","text":"hello"}'  # decoded, as httpx does
    assert (b"X-Twice", b"a") in got[0][2] and (b"X-Twice", b"b") in got[0][2]
    assert seen[0] == seen[1]  # byte for byte the same request


async def _ok(n: int) -> bytes:
    return b'HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n{"rsp_code":"00000"}'


async def test_a_fully_read_connection_goes_back_to_the_pool_and_is_reused(
        serve: Callable[[Handler], Awaitable[Server]]) -> None:
    seen: list[bytes] = []
    server = await serve(_answering(_ok, seen))
    http = make_http_client(max_connections=1)  # a leaked connection: the 2nd call waits
    try:
        for _ in range(5):
            resp = await http.get(f"{server.url}/x", timeout=2.0)
            assert resp.json() == {"rsp_code": "00000"}
    finally:
        await http.aclose()
    assert len(seen) == 5
    assert server.requests == 1  # connections


async def test_a_connection_whose_answer_was_cut_short_is_closed_never_reused(
        serve: Callable[[Handler], Awaitable[Server]]) -> None:
    async def answer(n: int) -> bytes | None:
        if n == 1:  # the head and part of the body, then nothing: the read times out
            return b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"rsp'
        return await _ok(n)

    server = await serve(_answering(answer, []))
    http = make_http_client(max_connections=1)
    try:
        with pytest.raises(httpx.ReadTimeout):
            await http.get(f"{server.url}/x", timeout=0.3)
        resp = await http.get(f"{server.url}/x", timeout=2.0)
        assert resp.json() == {"rsp_code": "00000"}
    finally:
        await http.aclose()
    assert server.requests == 2  # connections: the cut one was closed, a new one opened
