"""Only an error raised before the request left is "nothing processed": the table of every
httpx exception class, and the cases that matter proven over real HTTP through the
product's transport (httpx-aiohttp), against tiny servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import replace

import aiohttp
import httpx
import pytest

from batch.client import MydataClient, make_http_client
from batch.clock import SystemClock
from batch.http_errors import HTTPX_ERRORS, Sent, sent, transport_outcome
from batch.resilience.chain import ProviderChain
from batch.resilience.outcomes import Kind
from batch.resilience.settings import ChainSettings
from batch.tranid import TranIdGenerator
from tests.batch.conftest import Handler, Server
from tests.batch.test_client import INSTS


def _httpx_exception_classes() -> set[type[Exception]]:
    return {v for v in vars(httpx).values()
            if isinstance(v, type) and issubclass(v, Exception)}


def test_every_httpx_exception_class_has_exactly_one_row_in_the_table() -> None:
    # A class a new httpx adds must be decided here, not fall through to a guess.
    assert set(HTTPX_ERRORS) == _httpx_exception_classes()


EXPECTED = {
    "ConnectError": Sent.NOT_SENT, "ConnectTimeout": Sent.NOT_SENT,
    "PoolTimeout": Sent.NOT_SENT, "ProxyError": Sent.NOT_SENT,
    "ReadTimeout": Sent.UNKNOWN, "WriteTimeout": Sent.UNKNOWN, "ReadError": Sent.UNKNOWN,
    "WriteError": Sent.UNKNOWN, "CloseError": Sent.UNKNOWN,
    "RemoteProtocolError": Sent.UNKNOWN, "DecodingError": Sent.UNKNOWN,
    "TooManyRedirects": Sent.UNKNOWN, "HTTPStatusError": Sent.UNKNOWN,
    "HTTPError": Sent.UNKNOWN, "RequestError": Sent.UNKNOWN, "TransportError": Sent.UNKNOWN,
    "TimeoutException": Sent.UNKNOWN, "NetworkError": Sent.UNKNOWN,
    "ProtocolError": Sent.UNKNOWN,
    "LocalProtocolError": Sent.OUR_BUG, "UnsupportedProtocol": Sent.OUR_BUG,
    "InvalidURL": Sent.OUR_BUG, "CookieConflict": Sent.OUR_BUG, "StreamError": Sent.OUR_BUG,
    "StreamConsumed": Sent.OUR_BUG, "StreamClosed": Sent.OUR_BUG,
    "ResponseNotRead": Sent.OUR_BUG, "RequestNotRead": Sent.OUR_BUG,
}


def _instance(cls: type[Exception]) -> Exception:
    """An instance of any httpx exception class, whatever its constructor wants."""
    return cls.__new__(cls)


def _name(cls: type[Exception]) -> str:
    return cls.__name__


@pytest.mark.parametrize("cls", sorted(_httpx_exception_classes(), key=str), ids=_name)
def test_only_an_error_before_the_request_left_is_retryable(cls: type[Exception]) -> None:
    verdict = EXPECTED[cls.__name__]
    assert HTTPX_ERRORS[cls] is verdict
    out = transport_outcome(_instance(cls))
    assert out.kind is {Sent.NOT_SENT: Kind.FAULT, Sent.UNKNOWN: Kind.TIMEOUT,
                        Sent.OUR_BUG: Kind.CLIENT}[verdict]
    assert out.retryable is (verdict is Sent.NOT_SENT)


def _mislabelled(cause: Exception) -> httpx.ConnectTimeout:
    """What httpx-aiohttp raises for any aiohttp ClientConnectionError."""
    exc = httpx.ConnectTimeout(str(cause))
    exc.__cause__ = cause
    return exc


def test_a_server_disconnect_that_httpx_aiohttp_calls_connect_timeout_is_unknown() -> None:
    assert sent(_mislabelled(aiohttp.ServerDisconnectedError())) is Sent.UNKNOWN
    assert sent(_mislabelled(aiohttp.ClientOSError(104, "reset"))) is Sent.UNKNOWN
    assert sent(_mislabelled(aiohttp.SocketTimeoutError())) is Sent.UNKNOWN


def test_a_refused_or_unresolved_connection_behind_connect_timeout_is_not_sent() -> None:
    key = aiohttp.client_reqrep.ConnectionKey("h", 1, False, True, None, None, None)
    refused = aiohttp.ClientConnectorError(key, OSError(111, "refused"))
    dns = aiohttp.ClientConnectorDNSError(key, OSError(-2, "Name or service not known"))
    assert sent(_mislabelled(refused)) is Sent.NOT_SENT
    assert sent(_mislabelled(dns)) is Sent.NOT_SENT
    assert sent(_mislabelled(aiohttp.ConnectionTimeoutError())) is Sent.NOT_SENT


def test_an_unmapped_aiohttp_protocol_error_is_unknown() -> None:
    assert sent(_instance(aiohttp.ClientResponseError)) is Sent.UNKNOWN
    assert sent(_mislabelled(_instance(aiohttp.ClientPayloadError))) is Sent.UNKNOWN
    assert sent(aiohttp.NonHttpUrlClientError("ftp://x")) is Sent.OUR_BUG


# -- over real HTTP ---------------------------------------------------------------------

async def _read_then_close(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await r.readuntil(b"\r\n\r\n")
    w.close()


async def _read_then_reset(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await r.readuntil(b"\r\n\r\n")
    w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                          struct.pack("ii", 1, 0))
    w.close()


async def _garbage(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await r.readuntil(b"\r\n\r\n")
    w.write(b"NOT HTTP\r\n\r\n")
    await w.drain()
    w.close()


async def _short_body(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await r.readuntil(b"\r\n\r\n")
    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"rsp")
    await w.drain()
    w.close()


def _client(base_url: str) -> tuple[MydataClient, httpx.AsyncClient]:
    p = replace(INSTS.providers[0], base_url=base_url, calls_per_second=1000,
                connect_timeout=2, read_timeout=5)
    clock = SystemClock()
    chain = ProviderChain(p.org_code, ChainSettings.from_provider(p), clock=clock,
                          random=lambda: 0.0)
    http = make_http_client()
    return MydataClient(p, http=http, chain=chain, tran_ids=TranIdGenerator("OPERATOR01", 1),
                        clock=clock), http


@pytest.mark.parametrize("handler", [_read_then_close, _read_then_reset, _garbage, _short_body],
                         ids=["read-then-close", "read-then-reset", "malformed-answer",
                              "short-body"])
async def test_a_connection_dropped_after_the_request_was_sent_is_unknown_and_not_retried(
        serve: Callable[[Handler], Awaitable[Server]], handler: Handler) -> None:
    server = await serve(handler)
    client, http = _client(server.url)
    try:
        result = await client.refresh(access_token="tok", refresh_token=None)
    finally:
        await http.aclose()
    assert result.outcome.kind is Kind.TIMEOUT
    assert not result.outcome.retryable
    assert server.requests == 1  # the retry policy did not send it again
    assert result.calls == 1


async def test_a_refused_connection_is_retried_as_nothing_processed() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nobody listens: connection refused
    client, http = _client(f"http://127.0.0.1:{port}")
    try:
        result = await client.refresh(access_token="tok", refresh_token=None)
    finally:
        await http.aclose()
    assert result.outcome.kind is Kind.FAULT
    assert result.outcome.retryable
    assert result.outcome.attempts == 3  # retried by the chain (default max_attempts)
