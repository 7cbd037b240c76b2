"""The MyData client: one consent's scheduled refresh, every call through the provider's chain.

A refresh is the industry's list call, its pages one after another (never in parallel), then
one detail call per item. Every HTTP attempt carries ``Authorization``, a fresh
``x-api-tran-id`` and ``x-api-type: scheduled``. A 40101 refreshes the token once and retries
once. A refresh that stops part way (a later list page or a detail failed, or was refused
by us) comes back with its :class:`Progress`: the next list page's cursor and the item ids
already read, or the item ids still to fetch once the list is complete. The next attempt
resumes from there and never repeats page 1 (all pages of a list call are one transfer; a
second transfer in the week is what providers refuse with 42901). Items known dead are
never called. A refreshed token is handed to ``on_token`` before the retried call.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import httpx
import yarl
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import map_aiohttp_exceptions

from batch.clock import Clock
from batch.config import Provider
from batch.crypto import TokenKeyError
from batch.errors import describe
from batch.fastinit import direct_call, fast_init
from batch.http_errors import TRANSPORT_ERRORS, transport_outcome, transport_outcome_of_bug
from batch.resilience.outcomes import (
    DEAD_ASSET_CODES,
    TOKEN_CODES,
    Kind,
    Layer,
    Outcome,
    classify,
    rejected,
)
from batch.routes import MAX_PAGE_LIMIT, ROUTES, TOKEN_PATH, IndustryRoutes

log = logging.getLogger("mydata.client")

API_TYPE = "scheduled"
MAX_PAGES = 1000
_URL_CACHE = 256  # URLs a client keeps parsed
_TIMEOUT_CACHE = 64  # aiohttp.ClientTimeouts a transport keeps made
#: aiohttp URLs a transport keeps made: every provider's clients' (256 each) would be more
#: than a run needs; the list pages' cursors churn through it
_YARL_CACHE = 4096
_WINDOW_CLOSED = rejected(Layer.WINDOW, "provider window closed")
#: a refresh's outcome before any call (a consent resumed with nothing left to call)
_NOTHING_YET = Outcome(Kind.SUCCESS, "00000", 200, attempts=0)
_CONSENT = Kind.CONSENT  # a module name: ``Kind.CONSENT`` is a 100 ns lookup, every call
_THROTTLED = Kind.THROTTLED
_API_TYPE = API_TYPE.encode("ascii")
_JSON_TYPE = (b"Content-Type", b"application/json")


async def _window_closed() -> Outcome:
    return _WINDOW_CLOSED


def _json_body(value: Any) -> bytes:
    """A JSON body exactly as httpx encodes one (httpx._content.encode_json)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode("utf-8")


class CallChain(Protocol):
    """What the client needs from the resilience chain."""

    async def call(
        self, attempt: Callable[[float], Awaitable[Outcome]], *, deadline: float | None = None
    ) -> Outcome: ...


@fast_init
@dataclass(frozen=True, slots=True)
class Progress:
    """How far this week's transfer got.

    ``next_page`` set: the list is not complete; resume it at that cursor, ``items`` are the
    ids read so far. ``next_page`` None: the list is complete; ``items`` are still to fetch.
    """

    items: tuple[str, ...]
    next_page: str | None = None

    def to_json(self) -> str:
        return json.dumps({"next_page": self.next_page, "items": list(self.items)})

    @classmethod
    def from_json(cls, raw: str) -> Progress:
        """Read :meth:`to_json`'s form, or the older plain list of item ids still to fetch."""
        data = json.loads(raw)
        if isinstance(data, list):
            return cls(tuple(str(x) for x in data))
        nxt = data.get("next_page")
        return cls(tuple(str(x) for x in data.get("items") or ()),
                   None if nxt is None else str(nxt))


#: on_token(access_token, refresh_token): store a refreshed token pair now; False means the
#: consent is no longer to be called (revoked while its refresh ran): nothing was stored
#: and no call goes out for it again (None or True: stored)
TokenSaver = Callable[[str, str | None], Awaitable[bool | None]]

#: the detail added to the 40101 a refresh ends on when its consent was revoked meanwhile
REVOKED_MEANWHILE = "consent revoked during its refresh: not called again"
#: a refresh token, or how to open it from its sealed form when it is first needed (only a
#: 40101 needs it: most refreshes never do, and opening costs an AES-GCM decryption)
RefreshToken = str | Callable[[], str | None] | None


@fast_init
@dataclass(frozen=True, slots=True)
class RefreshResult:
    """How one consent's refresh ended.

    ``new_access_token``/``new_refresh_token`` are set only when a refreshed pair could not
    be saved through ``on_token`` (or no saver was given): the caller must store them.
    """

    outcome: Outcome
    calls: int
    items: int = 0
    #: item ids the provider reported dead (40305/40404) on their detail call
    dead_items: tuple[str, ...] = ()
    progress: Progress | None = None
    new_access_token: str | None = field(default=None, repr=False)
    new_refresh_token: str | None = field(default=None, repr=False)


class _Tokens:
    """One refresh's credentials and the time after which no call may start. The refresh
    token is opened when first read (:data:`RefreshToken`); one that does not open raises
    :class:`~batch.crypto.TokenKeyError` there."""

    __slots__ = ("_refresh", "access", "changed", "not_after", "refreshed")

    def __init__(self, access: str, refresh: RefreshToken, not_after: float | None) -> None:
        self.not_after = not_after
        self.access = access
        self._refresh = refresh
        self.refreshed = False  # a refresh was tried (only once per consent)
        self.changed = False  # a refresh succeeded: the new tokens must be stored

    @property
    def refresh(self) -> str | None:
        r = self._refresh
        if callable(r):
            r = self._refresh = r()
        return r

    @refresh.setter
    def refresh(self, value: str | None) -> None:
        self._refresh = value


class _NoCookies(httpx.Cookies):
    """A cookie store that keeps nothing: one client serves many users' consents, so a
    cookie a provider sets for one must never ride along with another's calls. Skipping
    httpx's per-response cookie parsing also saves a tenth of the client's CPU per call."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None

    def set_cookie_header(self, request: httpx.Request) -> None:
        return None


class _BatchHttpClient(httpx.AsyncClient):
    """httpx.AsyncClient that never stores or sends cookies, and offers its transport."""

    def __init__(self, *, transport: httpx.AsyncBaseTransport, **kwargs: Any) -> None:
        super().__init__(transport=transport, **kwargs)
        self.batch_transport = transport

    @property
    def cookies(self) -> httpx.Cookies:
        return _NoCookies()

    @cookies.setter
    def cookies(self, cookies: object) -> None:
        return None


class _NoResendTransport(AiohttpTransport):
    """httpx-aiohttp's transport with aiohttp's silent resend turned off: aiohttp sends a
    GET again, once, when the server closes or resets the connection after reading it;
    the provider may have processed the first and counted the week's transfer. Whether to
    call again is the chain's decision (batch/http_errors.py), never the transport's.
    Nor does it keep cookies (``get_client``)."""

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("uds") is not None or kwargs.get("client") is not None:
            # their session would be httpx-aiohttp's or the caller's: cookies kept, resends on
            raise ValueError("this transport makes its own session: no uds, no client")
        super().__init__(**kwargs)
        self._timeouts: dict[tuple[float | None, float | None, float | None],
                             aiohttp.ClientTimeout] = {}
        self._yarls: dict[int, tuple[httpx.URL, yarl.URL]] = {}

    def _yarl(self, url: httpx.URL) -> yarl.URL:
        """aiohttp's URL for ``url``, made once per httpx URL object: MydataClient keeps its
        request URLs parsed (``_url``), and aiohttp would parse each again from its string
        through yarl, whose own cache (a few hundred URLs) hundreds of providers' URLs
        overflow (300 providers, py-spy: 2 % of the process, 14 us a call; 4.4 us a parse
        uncached, timeit). Keyed by identity, the object held, so an id is never reused
        while its entry lives; the same URL aiohttp makes of the string."""
        hit = self._yarls.get(id(url))
        if hit is not None and hit[0] is url:
            return hit[1]
        made = yarl.URL(str(url))
        if len(self._yarls) >= _YARL_CACHE:
            self._yarls.clear()
        self._yarls[id(url)] = (url, made)
        return made

    def get_client(self) -> aiohttp.ClientSession:
        """httpx-aiohttp's session, the same connector, with no cookie jar: its own gives
        the session aiohttp's default jar, which keeps a cookie a provider's answer sets
        (from a host name; it ignores IP addresses) and sends it with every later call to
        that provider, whoever's consent it is for; httpx's cookies (``_NoCookies``) never
        see it. ``DummyCookieJar`` keeps nothing, and spares every call the jar's filtering
        and every answer its ``Set-Cookie`` parsing."""
        limit = self.limits.max_connections
        connector = aiohttp.TCPConnector(
            keepalive_timeout=self.limits.keepalive_expiry, ssl=self.ssl_context,
            local_addr=(self.local_address, 0) if self.local_address else None,
            limit=100 if limit is None else limit)  # None: aiohttp's default, as theirs
        session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
        # No public switch exists; aiohttp's own test client turns it off the same way.
        session._retry_connection = False
        return session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """The whole answer read here, in one ``read()``, and handed back as a response
        whose content is already there: httpx-aiohttp hands back a stream that httpx's
        ``aread`` then drains through an async generator, a chunker and the transport's
        exception mapping per chunk. The same request is sent (method, URL, headers, body,
        timeouts, no redirects, no decompression: httpx decodes the content as before), the
        same errors come out (aiohttp's, mapped to httpx's by httpx-aiohttp's own table), and
        a connection whose answer was not read to its end is closed, never reused. Measured
        in one process, the (a3) loop of tests/bench/test_dispatch_throughput.py alternated
        with httpx-aiohttp's own read, 10 rounds of 2 s, concurrency 50 (2026-12-06): median
        255 against 283 us of CPU a call, least 214 against 242 (a noisy machine: the paired
        rounds' median ratio 0.96). A request whose body is a stream
        not yet read (none of ours), or a proxy, goes through httpx-aiohttp's own path."""
        if self.proxy is not None:
            return await super().handle_async_request(request)
        try:
            data: bytes | None = request.content or None
        except httpx.RequestNotRead:
            return await super().handle_async_request(request)
        client = self.client
        if not isinstance(client, aiohttp.ClientSession):
            client = self.client = self.get_client()
        timeout = request.extensions.get("timeout", {})
        key = (timeout.get("connect"), timeout.get("read"), timeout.get("pool"))
        limits = self._timeouts.get(key)
        if limits is None:  # a provider's timeouts are few: each made once, not per call
            if len(self._timeouts) >= _TIMEOUT_CACHE:
                self._timeouts.clear()
            limits = self._timeouts[key] = aiohttp.ClientTimeout(
                sock_connect=key[0], sock_read=key[1], connect=key[2])
        with map_aiohttp_exceptions():
            response = await client.request(
                request.method, self._yarl(request.url), headers=_header_pairs(request.headers),
                data=data, allow_redirects=False, auto_decompress=False, compress=False,
                timeout=limits, server_hostname=request.extensions.get("sni_hostname"))
            try:
                body = await response.read()
            except BaseException:
                response.close()  # part of an answer on it: never handed to another call
                raise
            response.release()
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        answer = httpx.Response(response.status, headers=response.raw_headers,
                                stream=httpx.ByteStream(body), request=request,
                                extensions=extensions)
        if "Content-Encoding" in response.headers:
            answer.read()  # httpx's decoding of the content, as its aread would do it
        else:
            # Nothing to decode: the state httpx's read() leaves (the content, the stream
            # consumed and closed, the bytes counted) set at once, not through its two
            # generators, a chunker and an identity decoder (timeit: 25 -> 5 us an answer).
            # A test holds it to what httpx's own read gives.
            answer._content = body
            answer._num_bytes_downloaded = len(body)
            answer.is_stream_consumed = answer.is_closed = True
        return answer


def _header_pairs(headers: httpx.Headers) -> list[tuple[str, str]]:
    """``headers.multi_items()`` (names lowercased, as aiohttp was always given them), for
    ASCII headers (every call's: a token, a transaction id) without httpx's guess at the
    headers' encoding, which tries every name and value again on each request: 1.6 against
    6 us (timeit). Anything else goes through httpx's own."""
    try:
        return [(k.lower().decode("ascii"), v.decode("ascii")) for k, v in headers.raw]
    except UnicodeDecodeError:
        return headers.multi_items()


def make_http_client(*, max_connections: int = 200,
                     transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """httpx as the API, aiohttp underneath for throughput (DESIGN.md); TLS verification on;
    no cookies kept between calls. ``transport`` replaces aiohttp (tests)."""
    if transport is None:
        limits = httpx.Limits(max_connections=max_connections,
                              max_keepalive_connections=max_connections)
        transport = _NoResendTransport(limits=limits, verify=True)
    return _BatchHttpClient(transport=transport, verify=True, follow_redirects=False)


class MydataClient:
    """Scheduled refreshes for one provider."""

    def __init__(
        self,
        provider: Provider,
        *,
        http: httpx.AsyncClient,
        chain: CallChain,
        tran_ids: Callable[[], str],
        clock: Clock,
        page_limit: int = MAX_PAGE_LIMIT,
    ) -> None:
        if provider.industry not in ROUTES:
            raise ValueError(f"no routes known for industry {provider.industry!r}")
        if not 1 <= page_limit <= MAX_PAGE_LIMIT:
            raise ValueError(f"page_limit must be 1..{MAX_PAGE_LIMIT}")
        self.provider = provider
        self.routes: IndustryRoutes = ROUTES[provider.industry]
        self._http = http
        # Our own client (make_http_client) is sent to through its transport directly: it
        # has no auth, redirects, cookies or hooks to apply, and httpx's client layer costs
        # a third of the calls/s (measured: 0.29x vs 0.44x of a bare aiohttp loop).
        transport = getattr(http, "batch_transport", None)
        self._send: Callable[[httpx.Request], Awaitable[httpx.Response]] = (
            transport.handle_async_request if transport is not None else http.send)
        self._chain = chain
        self._tran_ids = direct_call(tran_ids)
        self._clock = clock
        self._page_limit = page_limit
        self._base = provider.base_url
        self._urls: dict[tuple[str, tuple[tuple[str, Any], ...] | None], httpx.URL] = {}

    # -- one HTTP attempt --------------------------------------------------------------

    async def _attempt(
        self,
        method: str,
        path: str,
        token: str,
        timeout: float,
        *,
        params: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Outcome:
        tran_id = self._tran_ids()
        t0 = self._clock.monotonic()
        answer = await self._exchange(self._request(method, path, token, tran_id, timeout,
                                                    params=params, json=body))
        if isinstance(answer, Outcome):
            return answer.with_(tran_id=tran_id)
        elapsed = self._clock.monotonic() - t0
        data: Any = None
        if answer.content:
            try:
                data = json.loads(answer.content)
            except ValueError:
                data = None
        code, unreadable = _rsp_code(data)
        out = classify(answer.status_code, code, payload=data, elapsed=elapsed, tran_id=tran_id)
        if out.kind is _THROTTLED:  # the one outcome that carries it: the others are spared
            # httpx's header lookup (it guesses the headers' encoding first), 7 us a call
            out = out.with_(retry_after=_retry_after(answer.headers.get("retry-after")))
        return out if unreadable is None else out.with_(
            detail=f"{out.detail or f'HTTP {answer.status_code}'}, {unreadable}")

    def _request(self, method: str, path: str, token: str, tran_id: str, timeout: float,
                 *, params: dict[str, Any] | None = None, json: Any = None,
                 data: dict[str, str] | None = None) -> httpx.Request:
        """One outbound request with the headers every call carries (MYDATA.md).

        A call with no body or a JSON body (every list and detail call) is built here with
        the headers, their order and the body httpx would give it (a test compares them
        with httpx's own): httpx.Request builds its headers twice and encodes the body
        through a generic path, 17.6 of a GET's and 29.4 of a POST's microseconds, against
        4.9 and 13.8 this way. A form (the token refresh) is left to httpx."""
        url = self._url(path, params)
        connect = min(self.provider.connect_timeout, timeout)
        extensions = {"timeout": {"connect": connect, "read": timeout, "write": timeout,
                                  "pool": timeout}}
        if data is not None:
            return httpx.Request(method, url, data=data, extensions=extensions, headers={
                "Authorization": f"Bearer {token}", "x-api-tran-id": tran_id,
                "x-api-type": API_TYPE})
        raw = [(b"Host", url.netloc), (b"Authorization", b"Bearer " + token.encode("ascii")),
               (b"x-api-tran-id", tran_id.encode("ascii")), (b"x-api-type", _API_TYPE)]
        body = b""
        if json is not None:
            body = _json_body(json)
            raw += [(b"Content-Length", str(len(body)).encode()), _JSON_TYPE]
        elif method in ("POST", "PUT", "PATCH"):
            raw.insert(1, (b"Content-Length", b"0"))  # httpx adds it beside Host
        request = httpx.Request(method, url, headers=raw, extensions=extensions,
                                stream=httpx.ByteStream(body))
        request.read()  # the body as content, as httpx has it for a body it encoded
        return request

    def _url(self, path: str, params: dict[str, Any] | None) -> httpx.URL:
        """The request URL, parsed once per (path, query): every consent's first list page
        and every POST detail call of a provider share one. httpx parses and validates a
        URL given as a string on every request (22 of the 32 us a list request took to
        build); an ``httpx.URL`` it takes as it is."""
        key = (path, None if params is None else tuple(params.items()))
        url = self._urls.get(key)
        if url is None:
            url = httpx.URL(self._base + path, params=params)
            if len(self._urls) >= _URL_CACHE:  # per-item paths and resumed pages churn
                self._urls.clear()
            self._urls[key] = url
        return url

    async def _exchange(self, request: httpx.Request) -> httpx.Response | Outcome:
        """Send ``request`` and read the whole answer, or the outcome of the error that
        came instead (batch/http_errors.py decides whether the request may have left)."""
        t0 = self._clock.monotonic()
        try:
            resp = await self._send(request)
            if not resp.is_closed:  # a transport that streams (ours reads it whole)
                try:
                    await resp.aread()
                finally:
                    await resp.aclose()
        except TRANSPORT_ERRORS as exc:
            return transport_outcome(exc, elapsed=self._clock.monotonic() - t0)
        except Exception as exc:
            # The HTTP stack's own bug, not a provider's answer and not our request (built
            # above, before the send). Seen: aiohttp 3.14's ClientResponse.start with no
            # headers, about once in 60,000 calls. The request may have left: the outcome
            # is unknown (a failure for the breaker), and the refresh keeps its progress,
            # where a crash would lose it and dead-letter the consent.
            log.error("HTTP layer error", exc_info=True, extra={
                "action": "http_layer_error", "org_code": self.provider.org_code,
                "error": describe(exc)})
            return transport_outcome_of_bug(exc, elapsed=self._clock.monotonic() - t0)
        return resp

    async def _call(
        self, tokens: _Tokens, method: str, path: str, *, deadline: float | None,
        params: dict[str, Any] | None = None, body: dict[str, Any] | None = None,
        on_token: TokenSaver | None = None,
    ) -> tuple[Outcome, int]:
        """One logical call through the chain; 40101 refreshes the token once, retries once.

        The refreshed pair is saved through ``on_token`` before the retried call: a crash
        after it must not strand the consent on a refresh token the provider rotated.
        """
        calls = 0

        def attempt(timeout: float) -> Awaitable[Outcome]:
            # not a coroutine itself: the chain awaits ``_attempt``'s own (one frame less
            # on every attempt's suspensions and resumptions)
            nonlocal calls
            if tokens.not_after is not None and self._clock.monotonic() >= tokens.not_after:
                return _window_closed()
            calls += 1
            return self._attempt(method, path, tokens.access, timeout, params=params,
                                 body=body)

        out = await self._chain.call(attempt, deadline=deadline)
        if out.kind is _CONSENT and out.rsp_code in TOKEN_CODES and not tokens.refreshed:
            tokens.refreshed = True
            refreshed = await self._refresh_token(tokens, deadline=deadline)
            calls += refreshed[1]
            if refreshed[0].ok:
                if not await _save(on_token, tokens):  # revoked meanwhile: no retried call
                    return out.with_(detail=REVOKED_MEANWHILE), calls
                out = await self._chain.call(attempt, deadline=deadline)
            else:
                out = refreshed[0]
        return out, calls

    async def _refresh_token(self, tokens: _Tokens, *, deadline: float | None
                             ) -> tuple[Outcome, int]:
        try:
            refresh_token = tokens.refresh
        except TokenKeyError as exc:  # as a stored access token that does not open: this
            return Outcome(Kind.CLIENT, detail=str(exc)), 0  # consent, for the operator
        if not refresh_token:
            return Outcome(Kind.CONSENT, "40101", 401, detail="token expired, no refresh token"
                           ), 0
        calls = 0
        expired_access = tokens.access

        async def attempt(timeout: float) -> Outcome:
            nonlocal calls
            if tokens.not_after is not None and self._clock.monotonic() >= tokens.not_after:
                return _WINDOW_CLOSED
            calls += 1
            tran_id = self._tran_ids()
            t0 = self._clock.monotonic()
            answer = await self._exchange(self._request(
                "POST", TOKEN_PATH, expired_access, tran_id, timeout,
                data={"grant_type": "refresh_token", "refresh_token": refresh_token}))
            if isinstance(answer, Outcome):
                return answer.with_(tran_id=tran_id)
            try:
                data = answer.json()
            except ValueError:
                data = None
            elapsed = self._clock.monotonic() - t0
            if answer.status_code == 200 and isinstance(data, dict) and data.get("access_token"):
                return Outcome(Kind.SUCCESS, "00000", 200, payload=data, elapsed=elapsed,
                               tran_id=tran_id)
            out = classify(answer.status_code, _rsp_code(data)[0],
                           elapsed=elapsed).with_(tran_id=tran_id)
            if out.kind is Kind.CLIENT:  # a refused refresh token is the consent's problem
                out = out.with_(kind=Kind.CONSENT, rsp_code="40101",
                                detail="token refresh refused")
            return out

        out = await self._chain.call(attempt, deadline=deadline)
        if out.ok:
            tokens.access = str(out.payload["access_token"])
            tokens.changed = True
            new_refresh = out.payload.get("refresh_token")
            if isinstance(new_refresh, str) and new_refresh:
                tokens.refresh = new_refresh
        return out, calls

    # -- one consent -------------------------------------------------------------------

    async def refresh(
        self,
        *,
        access_token: str,
        refresh_token: RefreshToken,
        progress: Progress | None = None,
        dead_items: frozenset[str] = frozenset(),
        deadline: float | None = None,
        not_after: float | None = None,
        on_token: TokenSaver | None = None,
    ) -> RefreshResult:
        """Fetch one consent's scheduled data: the list (or its rest), then the details.

        Resumes at ``progress`` when given; never calls an item in ``dead_items``. No HTTP
        call starts at or after ``not_after`` (clock.monotonic(); the end of the provider's
        window): such a call is refused by us and the rest stays due. ``refresh_token`` may
        be given as a function that opens it: it is called only if a 40101 needs it, and a
        token that does not open ends the refresh there as our own error (``Kind.CLIENT``).
        """
        tokens = _Tokens(access_token, refresh_token, not_after)
        calls = 0
        r = self.routes
        items = list(progress.items) if progress is not None else []
        next_page = progress.next_page if progress is not None else None
        last = _NOTHING_YET
        if progress is None or next_page is not None:
            for _ in range(MAX_PAGES):
                params: dict[str, Any] = {"org_code": self.provider.org_code,
                                          "search_timestamp": 0, "limit": self._page_limit}
                if next_page is not None:
                    params["next_page"] = next_page
                out, n = await self._call(tokens, "GET", r.list_path, deadline=deadline,
                                          params=params, on_token=on_token)
                calls += n
                if not out.ok:
                    # Page 1 failed: nothing to resume. A later page: the transfer is under
                    # way at the provider; the next attempt continues it at this cursor.
                    kept = None if next_page is None else Progress(tuple(items), next_page)
                    return self._result(out, calls, tokens, items=len(items), progress=kept)
                page = out.payload if isinstance(out.payload, dict) else {}
                read, nxt, broken = _read_page(page, r)
                if broken is not None:
                    # A 00000 page we cannot read is the provider's fault, and nothing of it
                    # is kept: the next attempt asks for this page again (page 1 again is a
                    # second transfer, which the provider may refuse with 42901).
                    out = Outcome(Kind.FAULT, out.rsp_code, out.http_status, detail=broken,
                                  elapsed=out.elapsed, attempts=out.attempts,
                                  tran_id=out.tran_id)
                    kept = None if next_page is None else Progress(tuple(items), next_page)
                    return self._result(out, calls, tokens, items=len(items), progress=kept)
                items.extend(read)
                last = out
                if nxt is None:
                    break
                next_page = nxt
        todo = [i for i in items if i not in dead_items]
        dead: list[str] = []
        for i, item_id in enumerate(todo):
            if r.detail_method == "POST":
                out, n = await self._call(
                    tokens, "POST", r.detail_path(item_id), deadline=deadline,
                    body={"org_code": self.provider.org_code, r.id_key: item_id,
                          "search_timestamp": 0}, on_token=on_token,
                )
            else:
                out, n = await self._call(
                    tokens, "GET", r.detail_path(item_id), deadline=deadline,
                    params={"org_code": self.provider.org_code, "search_timestamp": 0},
                    on_token=on_token,
                )
            calls += n
            if out.kind is _CONSENT and out.rsp_code in DEAD_ASSET_CODES:
                dead.append(item_id)  # this asset is gone; the consent's other assets count
                continue
            if not out.ok:
                return self._result(out, calls, tokens, items=len(items), dead=tuple(dead),
                                    progress=Progress(tuple(todo[i:])))
            last = out
        return self._result(last, calls, tokens, items=len(items), dead=tuple(dead))

    @staticmethod
    def _result(out: Outcome, calls: int, tokens: _Tokens, *, items: int,
                dead: tuple[str, ...] = (), progress: Progress | None = None) -> RefreshResult:
        return RefreshResult(
            outcome=out, calls=calls, items=items, dead_items=dead, progress=progress,
            new_access_token=tokens.access if tokens.changed else None,
            new_refresh_token=tokens.refresh if tokens.changed else None,
        )


async def _save(on_token: TokenSaver | None, tokens: _Tokens) -> bool:
    """Store a refreshed pair now; if that fails, the result carries it for the caller.
    False: the saver said the consent is not to be called again (nothing stored)."""
    if on_token is None:
        return True
    try:
        stored = await on_token(tokens.access, tokens.refresh)
    except Exception as exc:  # the database may be down: the outcome write retries it
        log.warning("token save failed; kept for the outcome write", extra={
            "action": "token_save_failed", "error": describe(exc)})
        return True
    tokens.changed = False
    return stored is not False


#: the longest response code taken as one (MYDATA.md's are five characters)
_MAX_CODE = 16


def _rsp_code(data: Any) -> tuple[str | None, str | None]:
    """The answer's ``rsp_code`` if it reads as a code (a short printable string), else
    None and why, in a form that can be stored and logged: the code is written to the
    outcome log, and a provider's NUL or a page of text in it would make the database
    refuse the whole batch of outcomes it rode in, again at every retry."""
    code = data.get("rsp_code") if isinstance(data, dict) else None
    if code is None or _short_text(code, _MAX_CODE):
        return code, None
    return None, f"unreadable rsp_code {ascii(code)[:40]}"


#: the longest item id and page cursor taken as one
_MAX_ID = 64
_MAX_CURSOR = 512


def _readable(value: Any, longest: int) -> str | None:
    """An item id or a page cursor as we keep it: an integer, or a printable string of at
    most ``longest`` characters; else None. Both go into the provider's URL and body and
    into our database (a NUL or a lone surrogate would make PostgreSQL refuse the batch
    they ride in)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value if _short_text(value, longest) else None


def _short_text(value: Any, longest: int) -> bool:
    """A string of 1 to ``longest`` printable characters (no NUL, no lone surrogate)."""
    return isinstance(value, str) and 0 < len(value) <= longest and value.isprintable()


def _read_page(page: dict[str, Any], r: IndustryRoutes
               ) -> tuple[list[str], str | None, str | None]:
    """One list page's item ids and its ``next_page`` cursor (None on the last page), or
    why the page cannot be read: its list is not a list, an entry is not an object with a
    readable ``id_key``, or the cursor is not readable."""
    entries = page.get(r.list_key)
    if entries is not None and not isinstance(entries, list):
        return [], None, f"list page: {r.list_key} is not a list"
    ids: list[str] = []
    for n, entry in enumerate(entries or ()):
        value = entry.get(r.id_key) if isinstance(entry, dict) else None
        item_id = _readable(value, _MAX_ID)
        if item_id is None:
            return [], None, (f"list page: entry {n} has no readable {r.id_key} "
                              f"({ascii(value)[:40]})")
        ids.append(item_id)
    raw = page.get("next_page")
    if not raw:
        return ids, None, None
    cursor = _readable(raw, _MAX_CURSOR)
    if cursor is None:
        return [], None, f"list page: unreadable next_page {ascii(raw)[:40]}"
    return ids, cursor, None


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
