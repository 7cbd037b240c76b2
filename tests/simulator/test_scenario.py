"""Scenario files: TOML or JSON, validated with one-line errors naming file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch.config import parse_institutions
from batch.errors import ConfigError
from batch.simulator import Scenario, Simulator, load_scenario, parse_scenario
from batch.simulator.bucket import TokenBucket
from batch.simulator.scenario import Behaviour, Event
from batch.simulator.stats import ProviderStats
from tests.simulator.conftest import institutions_toml

GOOD = """
[defaults]
latency_median_ms = 5
latency_p99_ms = 50
faults = { "50001" = 0.01, "reset" = 0.001 }
[providers.BANK000001]
latency_median_ms = 200
latency_p99_ms = 900
dead_assets = ["acc-9"]
[[timeline]]
provider = "BANK000001"
start = 30
end = 90
kind = "down"
"""


def test_toml_scenario_sets_defaults_overrides_and_timeline(tmp_path: Path) -> None:
    p = tmp_path / "s.toml"
    p.write_text(GOOD)
    s = load_scenario(p)
    assert s.behaviour("CARD000001").latency_median_ms == 5
    bank = s.behaviour("BANK000001")
    assert (bank.latency_median_ms, bank.dead_assets) == (200, frozenset({"acc-9"}))
    assert bank.faults == {"50001": 0.01, "reset": 0.001}  # inherited from defaults
    assert s.timeline == (Event("BANK000001", 30, 90, "down"),)
    assert s.events_for("CARD000001") == ()


def test_json_scenario_is_accepted(tmp_path: Path) -> None:
    p = tmp_path / "s.json"
    p.write_text('{"defaults": {"burst": 3}, "timeline": [{"provider": "*", "start": 0, '
                 '"end": 1, "kind": "slow", "factor": 3}]}')
    s = load_scenario(p)
    assert s.defaults.burst == 3
    assert s.timeline[0].factor == 3


@pytest.mark.parametrize(("text", "field", "words"), [
    ("[defaults]\nlatency_median_ms = 'x'", "defaults.latency_median_ms", "number"),
    ("[defaults]\nlatency_median_ms = 10\nlatency_p99_ms = 5", "defaults.latency_p99_ms",
     ">="),
    ("[defaults]\nfaults = { '40001' = 0.1 }", "defaults.faults", "not one of"),
    ("[defaults]\nfaults = { '50001' = 0.7, '50002' = 0.7 }", "defaults.faults", "sum"),
    ("[defaults]\nwindow_reject_code = 'abc'", "defaults.window_reject_code", "5-digit"),
    ("[defaults]\nlatncy = 1", "defaults.latncy", "unknown key"),
    ("[providers.BANK000001]\nitems_min = 0", "providers.BANK000001.items_min", ">= 1"),
    ("[[timeline]]\nprovider = '*'\nstart = 5\nkind = 'down'", "timeline[0].end",
     "required"),
    ("[[timeline]]\nprovider = '*'\nstart = 5\nend = 1\nkind = 'down'",
     "timeline[0].start", "before end"),
    ("[[timeline]]\nprovider = '*'\nstart = 0\nend = 1\nkind = 'boom'", "timeline[0].kind",
     "one of"),
    ("extra = 1", "extra", "unknown key"),
])
def test_bad_scenario_is_one_line_naming_file_and_field(text: str, field: str,
                                                        words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_scenario(text, source="scen.toml")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("scen.toml: ")
    assert err.value.field == field
    assert words in msg


def test_invalid_toml_names_the_line() -> None:
    with pytest.raises(ConfigError, match=r"^scen.toml:2: not valid TOML"):
        parse_scenario("[defaults]\nlatency = = 1", source="scen.toml")


def test_missing_scenario_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_scenario(tmp_path / "nope.toml")


async def test_scenario_naming_an_unknown_provider_is_refused() -> None:
    inst = parse_institutions(institutions_toml())
    for scen, field in (
            (Scenario(overrides={"NOPE000001": Behaviour()}), "providers.NOPE000001"),
            (Scenario(timeline=(Event("NOPE000001", 0, 1, "down"),)), "timeline[0].provider")):
        sim = Simulator(inst, scen)
        with pytest.raises(ConfigError) as err:
            await sim.start()
        assert err.value.field == field


def test_base_urls_off_loopback_or_ambiguous_are_refused() -> None:
    text = institutions_toml().replace("http://127.0.0.1", "http://10.0.0.1", 1)
    with pytest.raises(ConfigError, match=r"only 127\.0\.0\.1"):
        Simulator(parse_institutions(text))
    text = institutions_toml().replace("/INVEST0001", "/CARD000001")
    with pytest.raises(ConfigError, match="path prefix"):
        Simulator(parse_institutions(text))


def test_token_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    b = TokenBucket(rate=10, burst=2)
    assert [b.take(0.0) for _ in range(3)] == [True, True, False]
    assert b.take(0.05) is False
    assert b.take(0.1) is True
    assert [b.take(100.0) for _ in range(3)] == [True, True, False]


def test_peaks_use_a_sliding_second_of_100ms_buckets() -> None:
    s = ProviderStats()
    for t in (0.0, 0.6, 0.7, 1.1, 1.2, 2.5, 2.55):
        s.begin(t, "r", "scheduled")
        s.end("00000", 1.0)
    assert s.peak_100ms == 2  # 2.5 and 2.55
    # aligned seconds would hold 3 and 2 calls; the sliding second 0.3-1.3 holds 4
    assert s.peak_1s == 4
    snap = s.snapshot()
    assert snap["calls"] == 7
    assert snap["peak_concurrency"] == 1


def test_latency_percentiles_are_within_five_percent() -> None:
    s = ProviderStats()
    for ms in range(1, 101):
        s.begin(0.0, "r", "scheduled")
        s.end("00000", float(ms))
    lat = s.snapshot()["latency_ms"]
    assert lat["p50"] == pytest.approx(50, rel=0.06)
    assert lat["p90"] == pytest.approx(90, rel=0.06)
    assert lat["p99"] == pytest.approx(99, rel=0.06)
    assert lat["max"] == 100
