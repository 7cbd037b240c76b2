"""Edge 12: the run saves a refreshed token through the store before the retried call."""

from __future__ import annotations

from datetime import UTC, date, datetime

import httpx

from batch.db.memory import MemoryWorkStore
from batch.dispatch.runner import _refresher
from batch.resilience.outcomes import Kind
from tests.batch.test_client import client

WEEK = date(2026, 11, 29)
NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)


async def test_a_refreshed_token_is_in_the_store_before_the_retried_call_goes_out() -> None:
    store = MemoryWorkStore()
    store.add("BANK000001", 1, week=WEEK, not_before=NOW)
    consent = store.consents[1]
    consent.access_token, consent.refresh_token = "tok-OLD", "r1"
    stored_at_retry: list[tuple[str, str | None]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/oauth/2.0/token":
            return httpx.Response(200, json={"access_token": "tok-NEW", "refresh_token": "r2"})
        if request.headers["authorization"] == "Bearer tok-OLD":
            return httpx.Response(401, json={"rsp_code": "40101"})
        stored_at_retry.append((consent.access_token, consent.refresh_token))
        return httpx.Response(200, json={"rsp_code": "00000", "account_list": []})

    c, http = client(handle)
    (claim,) = await store.claim("BANK000001", worker="w1", week=WEEK, now=NOW, limit=1)
    res = await _refresher(c, store)(claim, None)
    await http.aclose()
    assert res.outcome.kind is Kind.SUCCESS
    assert stored_at_retry == [("tok-NEW", "r2")]
    assert res.new_access_token is None  # nothing left over for the outcome write


async def test_a_token_that_does_not_open_fails_its_own_consent_only_uncalled() -> None:
    """A sealed token moved onto another row (or sealed with a key not given) does not
    open: that consent is dead-lettered, for the operator, with no call made; the others of
    its claim are refreshed as usual."""
    from batch.crypto import TokenKeyError
    from batch.dispatch.policy import RetryPolicy
    from batch.lifecycle import DeadLetter, WeekResult, decide

    class Sealed(MemoryWorkStore):
        def open_access(self, claim):  # type: ignore[no-untyped-def]
            if claim.id == 1:
                raise TokenKeyError(f"consent {claim.id}: the stored access_token of a "
                                    "consent at BANK000001 does not open")
            return super().open_access(claim)

    store = Sealed()
    store.add("BANK000001", 2, week=WEEK, not_before=NOW)
    calls: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request.headers["authorization"])
        return httpx.Response(200, json={"rsp_code": "00000", "account_list": []})

    c, http = client(handle)
    bad, good = await store.claim("BANK000001", worker="w1", week=WEEK, now=NOW, limit=2)
    refresh = _refresher(c, store)
    failed, ok = await refresh(bad, None), await refresh(good, None)
    await http.aclose()
    assert (failed.calls, failed.outcome.kind) == (0, Kind.CLIENT)
    assert ok.outcome.kind is Kind.SUCCESS and calls == ["Bearer token-2"]
    t = decide(bad, failed, week=WEEK, now=NOW, policy=RetryPolicy())
    assert isinstance(t, DeadLetter) and t.why is WeekResult.FAILED
    assert "does not open" in t.error and "consent 1" in t.error


async def test_a_refresh_token_is_opened_only_when_a_40101_needs_it() -> None:
    """The refresh token stays sealed unless the provider refuses the access token: a
    refresh that never meets a 40101 never opens it (nor fails on one that would not open);
    one that does and finds it unopenable ends as our own error, dead-lettered for the
    operator, with no token request sent and nothing saved."""
    from batch.crypto import TokenKeyError
    from batch.dispatch.policy import RetryPolicy
    from batch.lifecycle import DeadLetter, WeekResult, decide

    opened: list[int] = []

    class Sealed(MemoryWorkStore):
        def open_refresh(self, claim):  # type: ignore[no-untyped-def]
            opened.append(claim.id)
            raise TokenKeyError(f"consent {claim.id}: the stored refresh_token of a "
                                "consent at BANK000001 does not open")

    store = Sealed()
    store.add("BANK000001", 2, week=WEEK, not_before=NOW)
    store.consents[1].access_token, store.consents[1].refresh_token = "tok-EXPIRED", "r1"
    store.consents[2].access_token, store.consents[2].refresh_token = "tok-GOOD", "r2"
    paths: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.headers["authorization"] == "Bearer tok-EXPIRED":
            return httpx.Response(401, json={"rsp_code": "40101"})
        return httpx.Response(200, json={"rsp_code": "00000", "account_list": []})

    c, http = client(handle)
    expired, good = await store.claim("BANK000001", worker="w1", week=WEEK, now=NOW, limit=2)
    refresh = _refresher(c, store)
    ok = await refresh(good, None)
    assert ok.outcome.kind is Kind.SUCCESS and opened == []  # never needed, never opened
    failed = await refresh(expired, None)
    await http.aclose()
    assert opened == [1] and "/oauth/2.0/token" not in paths
    assert (failed.calls, failed.outcome.kind) == (1, Kind.CLIENT)
    assert failed.new_access_token is None and failed.new_refresh_token is None
    assert store.consents[1].access_token == "tok-EXPIRED"  # nothing saved
    t = decide(expired, failed, week=WEEK, now=NOW, policy=RetryPolicy())
    assert isinstance(t, DeadLetter) and t.why is WeekResult.FAILED
    assert "refresh_token" in t.error and "does not open" in t.error
    assert "\n" not in t.error and "consent 1" in t.error
