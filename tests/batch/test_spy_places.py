"""The sampled profile's places (tests/bench/spy_dispatch.py): a sample's stack decides
whether its CPU is the HTTP layer's, which (a3) runs too, or ours."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.spy_dispatch import (
    CHAIN,
    DB,
    DISPATCH,
    HTTP,
    LOOP,
    METRICS,
    classify,
    report,
)

LOOP_TOP = ["<module> (x.py:1)", "BaseEventLoop._run_once (asyncio/base_events.py:1922)",
            "Handle._run (asyncio/events.py:80)"]
REFRESH = [*LOOP_TOP, "ProviderDispatcher._one (batch/dispatch/provider.py:501)",
           "MydataClient.refresh (batch/client.py:475)",
           "MydataClient._call (batch/client.py:354)",
           "ProviderChain.call (batch/resilience/chain.py:193)"]


@pytest.mark.parametrize(("frames", "place"), [
    ([*REFRESH, "MydataClient._attempt (batch/client.py:245)",
      "ClientSession._request (aiohttp/client.py:819)"], HTTP),
    ([*REFRESH, "MydataClient._attempt (batch/client.py:245)"], HTTP),
    ([*REFRESH, "CircuitBreaker.record (batch/resilience/breaker.py:140)"], CHAIN),
    (REFRESH, CHAIN),  # the chain's own line
    ([*REFRESH[:-2], "MydataClient._result (batch/client.py:547)"], HTTP),
    ([*LOOP_TOP, "ResponseHandler.data_received (aiohttp/client_proto.py:316)"], HTTP),
    (["Thread._bootstrap (threading.py:1002)",
      "_connection_worker_thread (aiosqlite/core.py:63)"], DB),
    ([*LOOP_TOP, "ProviderDispatcher._consume (batch/dispatch/provider.py:380)"], DISPATCH),
    ([*LOOP_TOP, "ChainRecorder._call (batch/observe/recorder.py:135)"], METRICS),
    ([*LOOP_TOP, "EpollSelector.select (selectors.py:468)"], LOOP),
])
def test_a_sample_goes_to_the_place_its_stack_names(frames: list[str], place: str) -> None:
    assert classify(frames) == place


def test_the_report_shares_the_process_cpu_by_samples(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        ";".join([*REFRESH, "MydataClient._attempt (batch/client.py:245)"]) + " 6\n"
        + ";".join(REFRESH) + " 3\n"
        + ";".join([*LOOP_TOP, "EpollSelector.select (selectors.py:468)"]) + " 1\n")
    text = report(raw, cpu=1.0, calls=1000)  # 1,000 us a call
    assert "10 samples" in text and "1000 us a call" in text
    assert " 60.0%     600 us a call  HTTP layer" in text
    assert " 30.0%     300 us a call  ours: chain" in text
    assert " 10.0%     100 us a call  event loop" in text
    assert "chain  ProviderChain.call (batch/resilience/chain.py:193)" in text
