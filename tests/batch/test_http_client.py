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


async def _plain_answer(n: int) -> bytes:
    """An answer with nothing to decode: the transport sets httpx's read state itself."""
    body = '{"rsp_code":"00000","a":"é"}'.encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
            b"X-Twice: a\r\nX-Twice: b\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\n\r\n" + body)


async def _chunked_answer(n: int) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            b"b\r\n{\"rsp_code\"\r\na\r\n:\"00000\"}\r\n0\r\n\r\n")


async def _empty_answer(n: int) -> bytes:
    return b"HTTP/1.1 204 No Content\r\nX-Empty: 1\r\n\r\n"


def _as_httpx_has_it(resp: httpx.Response) -> tuple[object, ...]:
    """Everything a caller can read of an answer, as httpx's own ``read()`` leaves it."""
    with pytest.raises(httpx.StreamConsumed):
        list(resp.iter_raw())
    return (resp.status_code, resp.reason_phrase, resp.headers.raw, resp.http_version,
            resp.content, resp.text, resp.encoding, list(resp.iter_bytes()),
            list(resp.iter_text()), resp.num_bytes_downloaded, resp.is_closed,
            resp.is_stream_consumed, resp.read())


@pytest.mark.parametrize("answer", [_plain_answer, _chunked_answer, _empty_answer])
async def test_an_answer_with_nothing_to_decode_reads_as_httpx_reads_it(
        serve: Callable[[Handler], Awaitable[Server]],
        answer: Callable[[int], Awaitable[bytes]]) -> None:
    from httpx_aiohttp import AiohttpTransport

    server = await serve(_answering(answer, []))
    url = f"{server.url}/v1/bank/accounts"
    theirs = httpx.AsyncClient(transport=AiohttpTransport())
    ours = make_http_client()
    try:
        want = await theirs.get(url)
        await want.aread()
        # the product's path: the transport itself (MydataClient), and through the client
        direct = await ours._transport.handle_async_request(httpx.Request("GET", url))
        through = await ours.get(url)
        got = [_as_httpx_has_it(r) for r in (want, direct, through)]
    finally:
        await theirs.aclose()
        await ours.aclose()
    assert got[1] == got[0] and got[2] == got[0]
    if answer is not _empty_answer:
        assert direct.json()["rsp_code"] == "00000"


async def test_a_cookie_an_answer_sets_is_never_sent_again_over_real_http(
        serve: Callable[[Handler], Awaitable[Server]]) -> None:
    """aiohttp's own cookie jar (under httpx's) keeps a cookie from a host name (not from an
    IP address): to ``localhost`` it would ride along with every later call."""
    async def answer(n: int) -> bytes:
        return (b"HTTP/1.1 200 OK\r\nSet-Cookie: session=user-a; Path=/\r\n"
                b'Content-Length: 20\r\n\r\n{"rsp_code":"00000"}')

    seen: list[bytes] = []
    server = await serve(_answering(answer, seen))
    http = make_http_client()
    try:
        for host in ("127.0.0.1", "localhost", "localhost"):
            url = server.url.replace("127.0.0.1", host) + "/v1/bank/accounts"
            resp = await http._transport.handle_async_request(httpx.Request("GET", url))
            assert resp.headers["set-cookie"] == "session=user-a; Path=/"
            resp = await http.get(url)
            assert resp.json() == {"rsp_code": "00000"}
    finally:
        await http.aclose()
    assert len(seen) == 6
    assert not [r for r in seen if b"cookie" in r.lower()]


@pytest.mark.parametrize("raw", [
    [(b"Host", b"a:1"), (b"Authorization", b"Bearer t"), (b"X-Twice", b"1"), (b"x-twice", b"2")],
    [(b"X-Name", "é".encode()), (b"Authorization", b"Bearer t")],  # utf-8
    [(b"X-Name", b"\xe9t\xe9"), (b"Host", b"a")],  # latin-1
])
def test_the_headers_handed_to_aiohttp_are_httpx_multi_items(
        raw: list[tuple[bytes, bytes]]) -> None:
    from batch.client import _header_pairs

    headers = httpx.Request("GET", "http://a/", headers=raw).headers
    assert _header_pairs(headers) == headers.multi_items()


@pytest.mark.parametrize("path", ["/v1/a%2Fb?q=%20x&y=%C3%A9", "/v1/é/x?c=a+b&d=é",
                                  "/v1/bank/accounts?next_page=a%3Db"])
async def test_the_url_sent_is_the_one_httpx_aiohttp_sends(
        serve: Callable[[Handler], Awaitable[Server]], path: str) -> None:
    from httpx_aiohttp import AiohttpTransport

    seen: list[bytes] = []
    server = await serve(_answering(_ok, seen))
    url = httpx.URL(server.url + path)
    theirs = AiohttpTransport()
    ours = make_http_client()._transport
    try:
        for transport in (theirs, ours, ours):  # ours twice: its URL made once, then kept
            resp = await transport.handle_async_request(httpx.Request("GET", url))
            await resp.aread()
        # an equal URL, another object: made again, the same
        resp = await ours.handle_async_request(httpx.Request("GET", httpx.URL(str(url))))
    finally:
        await theirs.aclose()
        await ours.aclose()
    lines = [r.split(b"\r\n", 1)[0] for r in seen]
    assert len(lines) == 4 and len(set(lines)) == 1, lines


@pytest.mark.parametrize("given", [{"uds": "/tmp/x.sock"}, {"client": object()}])
def test_the_transport_refuses_a_session_it_would_not_make_itself(
        given: dict[str, object]) -> None:
    from batch.client import _NoResendTransport

    with pytest.raises(ValueError, match="its own session"):
        _NoResendTransport(**given)
