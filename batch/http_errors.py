"""What an exception from one HTTP attempt says about the request: one table, one place.

Only an error raised before the request left us means "nothing was processed" and may be
retried now (a FAULT). Once any byte of the request may have reached the provider, the
provider may have processed it and counted the week's transfer: the outcome is unknown
(TIMEOUT, never retried now). An error in the request we built is our bug (CLIENT).

httpx's classes (``HTTPX_ERRORS`` covers every one; a test enumerates httpx so a new
class fails it):

    NOT_SENT   ConnectError, ConnectTimeout, PoolTimeout, ProxyError
    UNKNOWN    ReadTimeout, WriteTimeout, ReadError, WriteError, CloseError,
               RemoteProtocolError, DecodingError, TooManyRedirects, HTTPStatusError,
               and the bases (HTTPError, RequestError, TransportError, TimeoutException,
               NetworkError, ProtocolError) when raised as such
    OUR_BUG    LocalProtocolError, UnsupportedProtocol, InvalidURL, CookieConflict,
               the StreamError family

httpx-aiohttp (our transport) labels every aiohttp ``ClientConnectionError``
``ConnectTimeout``, including a server that read the request and closed the connection
(``ServerDisconnectedError``) and a reset (``ClientOSError``). So when the cause is an
aiohttp error, the cause decides: only a failure to connect (``ClientConnectorError``:
refused, DNS, TLS, proxy; ``ConnectionTimeoutError``: connect or pool timeout) is
NOT_SENT. A protocol error (``ClientResponseError``: a malformed answer) escapes
httpx-aiohttp unmapped; it came after the request, so it is UNKNOWN.

Any other exception out of the send is the HTTP stack's own bug (our request was built
before it): UNKNOWN too (``transport_outcome_of_bug``), logged with its traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import aiohttp
import httpx

from batch.resilience.outcomes import Kind, Outcome, connection_error, timed_out


class Sent(StrEnum):
    """What a transport error tells us about the request."""

    NOT_SENT = "not sent"   # nothing left us: nothing processed, retryable
    UNKNOWN = "unknown"     # the provider may have processed it
    OUR_BUG = "our bug"     # the request we built is wrong: retrying cannot help


HTTPX_ERRORS: Mapping[type[Exception], Sent] = {
    httpx.HTTPError: Sent.UNKNOWN,
    httpx.RequestError: Sent.UNKNOWN,
    httpx.TransportError: Sent.UNKNOWN,
    httpx.TimeoutException: Sent.UNKNOWN,
    httpx.ConnectTimeout: Sent.NOT_SENT,
    httpx.ReadTimeout: Sent.UNKNOWN,
    httpx.WriteTimeout: Sent.UNKNOWN,
    httpx.PoolTimeout: Sent.NOT_SENT,
    httpx.NetworkError: Sent.UNKNOWN,
    httpx.ConnectError: Sent.NOT_SENT,
    httpx.ReadError: Sent.UNKNOWN,
    httpx.WriteError: Sent.UNKNOWN,
    httpx.CloseError: Sent.UNKNOWN,
    httpx.ProtocolError: Sent.UNKNOWN,
    httpx.LocalProtocolError: Sent.OUR_BUG,
    httpx.RemoteProtocolError: Sent.UNKNOWN,
    httpx.ProxyError: Sent.NOT_SENT,
    httpx.UnsupportedProtocol: Sent.OUR_BUG,
    httpx.DecodingError: Sent.UNKNOWN,
    httpx.TooManyRedirects: Sent.UNKNOWN,
    httpx.HTTPStatusError: Sent.UNKNOWN,
    httpx.InvalidURL: Sent.OUR_BUG,
    httpx.CookieConflict: Sent.OUR_BUG,
    httpx.StreamError: Sent.OUR_BUG,
    httpx.StreamConsumed: Sent.OUR_BUG,
    httpx.StreamClosed: Sent.OUR_BUG,
    httpx.ResponseNotRead: Sent.OUR_BUG,
    httpx.RequestNotRead: Sent.OUR_BUG,
}

#: everything an attempt catches: httpx's roots, plus aiohttp's for what httpx-aiohttp
#: lets through unmapped
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    httpx.HTTPError, httpx.InvalidURL, httpx.CookieConflict, httpx.StreamError,
    aiohttp.ClientError,
)

_AIOHTTP_NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
_AIOHTTP_OUR_BUG = (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError)


def sent(exc: Exception) -> Sent:
    """What ``exc`` (one of ``TRANSPORT_ERRORS``) says about the request."""
    cause = exc if isinstance(exc, aiohttp.ClientError) else exc.__cause__
    if isinstance(cause, aiohttp.ClientError):
        if isinstance(cause, _AIOHTTP_NOT_SENT):
            return Sent.NOT_SENT
        if isinstance(cause, _AIOHTTP_OUR_BUG):
            return Sent.OUR_BUG
        return Sent.UNKNOWN
    for cls in type(exc).__mro__:
        found = HTTPX_ERRORS.get(cls)
        if found is not None:
            return found
    return Sent.UNKNOWN


def transport_outcome(exc: Exception, *, elapsed: float = 0.0) -> Outcome:
    """The outcome of an attempt that raised ``exc`` instead of answering."""
    detail = type(exc).__name__
    cause = exc.__cause__
    if cause is not None and not isinstance(exc, aiohttp.ClientError):
        detail = f"{detail} ({type(cause).__name__})"
    verdict = sent(exc)
    if verdict is Sent.NOT_SENT:
        return connection_error(detail, elapsed=elapsed)
    if verdict is Sent.OUR_BUG:
        return Outcome(Kind.CLIENT, None, None, detail=detail, elapsed=elapsed)
    return timed_out(f"{detail}: outcome unknown", elapsed=elapsed)


def transport_outcome_of_bug(exc: Exception, *, elapsed: float = 0.0) -> Outcome:
    """The outcome of an attempt that the HTTP stack itself failed with ``exc``, an error
    outside ``TRANSPORT_ERRORS`` raised after our request was built: it may have left, so
    the outcome is unknown."""
    return timed_out(f"HTTP layer error {type(exc).__name__}: outcome unknown",
                     elapsed=elapsed)
