"""Simulator scenario: how each provider behaves (latency, faults, rules) and a timeline.

A scenario file is TOML (or JSON, by extension ``.json``)::

    [defaults]                      # every provider, unless overridden
    latency_median_ms = 2
    latency_p99_ms = 10
    faults = { "50001" = 0.01, "reset" = 0.001 }
    [providers.BANK000001]          # per-provider overrides of the same keys
    latency_median_ms = 200
    [[timeline]]                    # t in seconds after the simulator starts (its clock)
    provider = "BANK000001"         # or "*" for every provider
    start = 30
    end = 90
    kind = "down"                   # down | slow | error
    mode = "503"                    # down: "503" (503 50005), "reset" (connection reset) or
                                    # "refuse" (port closed: connection refused; needs the
                                    # event to cover every provider on that host:port)

Every error is one line naming the file and the field.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from batch.config import read_config_text
from batch.errors import ConfigError

#: Fault kinds a provider may answer at random: response codes, or a connection reset.
FAULT_KINDS = ("50001", "50002", "50003", "50005", "reset")
EVENT_KINDS = ("down", "slow", "error")
DOWN_MODES = ("503", "reset", "refuse")
_AT_LINE = re.compile(r"\(at line (\d+), column \d+\)")
_CODE_STATUS = {"400": 400, "401": 401, "403": 403, "404": 404, "429": 429, "500": 500}


def http_status(code: str) -> int:
    """The HTTP status that carries ``rsp_code`` (MYDATA.md's table; 50005 rides on 503)."""
    if code == "50005":
        return 503
    return _CODE_STATUS.get(code[:3], 500)


def _check_code(code: object, name: str) -> None:
    if not (isinstance(code, str) and len(code) == 5 and code.isdigit() and code[:3]
            in _CODE_STATUS):
        raise ValueError(f"{name} must be a 5-digit rsp_code like '50005', got {code!r}")


@dataclass(frozen=True, slots=True)
class Behaviour:
    """How one provider behaves; every field can be set in ``[defaults]`` or per provider."""

    latency_median_ms: float = 2.0
    latency_p99_ms: float = 10.0
    items_min: int = 1
    items_max: int = 3
    #: token-bucket burst; None means max(2, 0.2 * calls_per_second)
    burst: float | None = None
    #: refuse calls past this many in flight with 429 42902; True means max_concurrency
    concurrency_cap: int | bool = False
    expired_token_fraction: float = 0.0
    expired_tokens: frozenset[str] = frozenset()
    dead_asset_fraction: float = 0.0
    dead_assets: frozenset[str] = frozenset()
    window_reject_code: str = "40301"
    reject_duplicate_tran_id: bool = False
    #: a 50003 on a first page still counts the transfer (the provider processed it)
    timeout_counts_as_transfer: bool = False
    faults: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.latency_median_ms >= 0:
            raise ValueError("latency_median_ms must be >= 0")
        if self.latency_median_ms > 0 and not self.latency_p99_ms >= self.latency_median_ms:
            raise ValueError("latency_p99_ms must be >= latency_median_ms")
        if not 1 <= self.items_min <= self.items_max:
            raise ValueError("items_min must be >= 1 and <= items_max")
        if self.burst is not None and not self.burst >= 1:
            raise ValueError("burst must be >= 1")
        if not isinstance(self.concurrency_cap, bool) and self.concurrency_cap < 1:
            raise ValueError("concurrency_cap must be true, false or a positive integer")
        for name in ("expired_token_fraction", "dead_asset_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1")
        _check_code(self.window_reject_code, "window_reject_code")
        for kind, rate in self.faults.items():
            if kind not in FAULT_KINDS:
                raise ValueError(f"faults key {kind!r} is not one of {', '.join(FAULT_KINDS)}")
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"faults rate for {kind!r} must be between 0 and 1")
        if sum(self.faults.values()) > 1.0:
            raise ValueError("faults rates must sum to at most 1")


@dataclass(frozen=True, slots=True)
class Event:
    """From ``start`` to ``end`` seconds after start, ``provider`` ("*": all) is down/slow/error."""

    provider: str
    start: float
    end: float
    kind: Literal["down", "slow", "error"]
    mode: str = "503"
    factor: float = 10.0
    code: str = "50005"
    rate: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError("start must be >= 0 and before end")
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"kind must be one of {', '.join(EVENT_KINDS)}")
        if self.mode not in DOWN_MODES:
            raise ValueError(f"mode must be one of {', '.join(DOWN_MODES)}")
        if not self.factor > 0:
            raise ValueError("factor must be positive")
        _check_code(self.code, "code")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError("rate must be between 0 and 1")

    def active(self, t: float) -> bool:
        return self.start <= t < self.end

    def applies_to(self, org_code: str) -> bool:
        return self.provider in ("*", org_code)


@dataclass(frozen=True, slots=True)
class Scenario:
    """Default behaviour, per-provider overrides and the timeline."""

    defaults: Behaviour = field(default_factory=Behaviour)
    overrides: Mapping[str, Behaviour] = field(default_factory=dict)
    timeline: tuple[Event, ...] = ()

    def behaviour(self, org_code: str) -> Behaviour:
        return self.overrides.get(org_code, self.defaults)

    def events_for(self, org_code: str) -> tuple[Event, ...]:
        return tuple(e for e in self.timeline if e.applies_to(org_code))


_BEHAVIOUR_FIELDS = {f.name for f in fields(Behaviour)}
_EVENT_FIELDS = {f.name for f in fields(Event)}
_SETS = ("expired_tokens", "dead_assets")
_FLOATS = ("latency_median_ms", "latency_p99_ms", "burst", "expired_token_fraction",
           "dead_asset_fraction")
_INTS = ("items_min", "items_max")
_BOOLS = ("reject_duplicate_tran_id", "timeout_counts_as_transfer")


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number")
    return float(value)


def _behaviour_kwargs(raw: object, where: str) -> dict[str, Any]:
    """Check types of one behaviour table; raises ConfigError(field=where.key)."""
    if not isinstance(raw, Mapping):
        raise ConfigError("must be a table", field=where)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = f"{where}.{key}"
        try:
            if key not in _BEHAVIOUR_FIELDS:
                raise ValueError(f"unknown key (known: {', '.join(sorted(_BEHAVIOUR_FIELDS))})")
            if key in _FLOATS:
                out[key] = _number(value, key)
            elif key in _INTS:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError("must be an integer")
                out[key] = value
            elif key in _BOOLS:
                if not isinstance(value, bool):
                    raise ValueError("must be true or false")
                out[key] = value
            elif key in _SETS:
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError("must be a list of strings")
                out[key] = frozenset(value)
            elif key == "concurrency_cap":
                if not isinstance(value, bool | int):
                    raise ValueError("must be true, false or a positive integer")
                out[key] = value
            elif key == "window_reject_code":
                out[key] = str(value)
            elif key == "faults":
                if not isinstance(value, Mapping):
                    raise ValueError("must be a table like { \"50001\" = 0.01 }")
                out[key] = {str(k): _number(v, f"faults.{k}") for k, v in value.items()}
        except ValueError as exc:
            raise ConfigError(str(exc), field=name) from None
    return out


def _build_behaviour(base: Behaviour, kwargs: dict[str, Any], where: str) -> Behaviour:
    try:
        return replace(base, **kwargs)
    except ValueError as exc:
        msg = str(exc)
        key = msg.split(" ", 1)[0]
        fld = f"{where}.{key}" if key in _BEHAVIOUR_FIELDS else where
        raise ConfigError(msg, field=fld) from None


def _event(raw: object, where: str) -> Event:
    if not isinstance(raw, Mapping):
        raise ConfigError("must be a table", field=where)
    for key in raw:
        if key not in _EVENT_FIELDS:
            raise ConfigError(f"unknown key (known: {', '.join(sorted(_EVENT_FIELDS))})",
                              field=f"{where}.{key}")
    for key in ("provider", "start", "end", "kind"):
        if key not in raw:
            raise ConfigError("is required", field=f"{where}.{key}")
    kwargs: dict[str, Any] = {}
    try:
        for key, value in raw.items():
            if key in ("start", "end", "factor", "rate"):
                kwargs[key] = _number(value, key)
            elif isinstance(value, str):
                kwargs[key] = value
            else:
                raise ValueError(f"{key} must be a string")
        return Event(**kwargs)
    except ValueError as exc:
        key = str(exc).split(" ", 1)[0]
        fld = f"{where}.{key}" if key in _EVENT_FIELDS else where
        raise ConfigError(str(exc), field=fld) from None


def scenario_from_mapping(doc: Mapping[str, Any]) -> Scenario:
    """Build a scenario from a parsed document; raises ConfigError(field=...)."""
    for key in doc:
        if key not in ("defaults", "providers", "timeline"):
            raise ConfigError("unknown key (known: defaults, providers, timeline)", field=key)
    defaults = _build_behaviour(Behaviour(), _behaviour_kwargs(doc.get("defaults", {}),
                                                               "defaults"), "defaults")
    raw_providers = doc.get("providers", {})
    if not isinstance(raw_providers, Mapping):
        raise ConfigError("must be a table of org_code tables", field="providers")
    overrides: dict[str, Behaviour] = {}
    for org, raw in raw_providers.items():
        where = f"providers.{org}"
        overrides[org] = _build_behaviour(defaults, _behaviour_kwargs(raw, where), where)
    raw_timeline = doc.get("timeline", [])
    if not isinstance(raw_timeline, list):
        raise ConfigError("must be a list of [[timeline]] tables", field="timeline")
    timeline = tuple(_event(raw, f"timeline[{i}]") for i, raw in enumerate(raw_timeline))
    return Scenario(defaults=defaults, overrides=overrides, timeline=timeline)


def parse_scenario(text: str, *, source: str = "<scenario>", fmt: str = "toml") -> Scenario:
    """Parse a TOML (``fmt="toml"``) or JSON scenario; errors name ``source`` and the field."""
    try:
        doc: Any = json.loads(text) if fmt == "json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        line = getattr(exc, "lineno", None)
        msg = getattr(exc, "msg", str(exc))
        m = _AT_LINE.search(msg)
        if m is not None:  # tomllib puts the position in the message
            line, msg = int(m.group(1)), msg[:m.start()].rstrip()
        raise ConfigError(f"not valid {fmt.upper()}: {msg}", file=source, line=line) from None
    if not isinstance(doc, Mapping):
        raise ConfigError("must be a table/object at the top level", file=source)
    try:
        return scenario_from_mapping(doc)
    except ConfigError as exc:
        raise ConfigError(exc.reason, file=source, field=exc.field) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file (``.json`` is JSON, anything else TOML)."""
    p = Path(path)
    return parse_scenario(read_config_text(p), source=str(p),
                          fmt="json" if p.suffix == ".json" else "toml")
