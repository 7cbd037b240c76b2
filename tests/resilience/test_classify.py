"""classify: every branch of MYDATA.md's response-code table, each carrying the call's
tran_id (the client passes it in rather than copying the outcome afterwards)."""

from __future__ import annotations

import pytest

from batch.resilience.outcomes import Kind, classify


@pytest.mark.parametrize(("status", "code", "kind", "retryable"), [
    (200, "00000", Kind.SUCCESS, False),
    (503, "50001", Kind.FAULT, True),
    (504, "50003", Kind.TIMEOUT, False),
    (429, "42902", Kind.THROTTLED, False),
    (404, "40404", Kind.CONSENT, False),
    (429, "42901", Kind.CONSENT, False),
    (401, "40101", Kind.CONSENT, False),
    (400, "40001", Kind.CLIENT, False),
    (502, None, Kind.FAULT, True),
    (429, None, Kind.THROTTLED, False),
    (401, None, Kind.CONSENT, False),
    (418, None, Kind.CLIENT, False),
])
def test_each_answer_is_classified_with_its_tran_id(status: int, code: str | None, kind: Kind,
                                                    retryable: bool) -> None:
    out = classify(status, code, retry_after=2.0, elapsed=0.25, tran_id="OPERATOR01M0000000001")
    assert (out.kind, out.retryable, out.http_status) == (kind, retryable, status)
    assert out.tran_id == "OPERATOR01M0000000001" and out.elapsed == 0.25
    assert classify(status, code).tran_id is None
