"""Alert thresholds for ``mydata-batch check``: sane defaults, per-provider overrides.

A thresholds file is TOML; every key is optional and an unknown key is refused::

    [defaults]
    retry_ratio = 0.10             # retried calls / attempted calls, in the last run
    max_attempt_ratio = 0.02       # calls that used every attempt / attempted calls
    p99_latency_seconds = 5.0      # the worst minute's p99 end-to-end call latency
    timeout_rate = 0.02            # calls with an unknown outcome / attempted calls
    breaker_open_minutes = 5.0     # minutes the breaker was open in the last run
    dead_letter_age_hours = 24.0   # age of the oldest open dead letter
    consents_overdue = 0           # active consents past their week (more is a breach)
    min_calls = 20                 # ratios and p99 only once a provider has this many calls
    no_success_hours = 26.0        # no run finished done for this long (defaults only)
    [providers.BANK000001]         # the same keys but no_success_hours
    p99_latency_seconds = 10.0
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, fields, replace
from typing import Any

from batch.config import read_config_text
from batch.errors import ConfigError
from batch.institutions_check import did_you_mean


@dataclass(frozen=True, slots=True)
class Thresholds:
    retry_ratio: float = 0.10
    max_attempt_ratio: float = 0.02
    p99_latency_seconds: float = 5.0
    timeout_rate: float = 0.02
    breaker_open_minutes: float = 5.0
    dead_letter_age_hours: float = 24.0
    consents_overdue: int = 0
    min_calls: int = 20
    no_success_hours: float = 26.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise ValueError(f"{f.name} must be a number >= 0, got {v!r}")
        for name in ("retry_ratio", "max_attempt_ratio", "timeout_rate"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name} is a ratio: between 0 and 1")


RUN_LEVEL = frozenset({"no_success_hours"})
KEYS = frozenset(f.name for f in fields(Thresholds))


@dataclass(frozen=True, slots=True)
class ThresholdSet:
    defaults: Thresholds = Thresholds()
    providers: tuple[tuple[str, Thresholds], ...] = ()

    def for_provider(self, org_code: str) -> Thresholds:
        return dict(self.providers).get(org_code, self.defaults)


def _apply(base: Thresholds, raw: object, where: str, *, allow: frozenset[str],
           source: str, table: str, lines: list[str]) -> Thresholds:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = sorted(set(raw) - allow)
    if unknown:
        key = unknown[0]
        why = ("a threshold of the whole run, not of one provider: set it in [defaults]"
               if key in KEYS else f"unknown key{did_you_mean(key, allow)}")
        raise ConfigError(why, file=source, line=_line_of(lines, table, key),
                          field=f"{table}.{key}")
    try:
        return replace(base, **raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _line_of(lines: list[str], table: str, key: str) -> int | None:
    """The line of ``key =`` inside ``[table]`` (best effort; None if not found)."""
    head = re.compile(r"^\[\s*" + r"\s*\.\s*".join(map(re.escape, table.split("."))) +
                      r"\s*\]")
    want = re.compile(rf"^{re.escape(key)}\s*=")
    inside = False
    for i, raw in enumerate(lines, start=1):
        t = raw.strip()
        if t.startswith("["):
            inside = head.match(t) is not None
        elif inside and want.match(t):
            return i
    return None


def parse_thresholds(text: str, *, source: str = "<thresholds>") -> ThresholdSet:
    try:
        doc: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", file=source) from None
    unknown = sorted(set(doc) - {"defaults", "providers"})
    if unknown:
        raise ConfigError(f"{source}: unknown table(s) {', '.join(unknown)}; known: defaults, "
                          "providers")
    lines = text.splitlines()
    defaults = _apply(Thresholds(), doc.get("defaults", {}), f"{source} [defaults]",
                      allow=KEYS, source=source, table="defaults", lines=lines)
    raw_providers = doc.get("providers", {})
    if not isinstance(raw_providers, dict):
        raise ConfigError(f"{source}: providers must be a table of [providers.ORG_CODE]")
    providers = {org: _apply(defaults, raw, f"{source} [providers.{org}]",
                             allow=KEYS - RUN_LEVEL, source=source, table=f"providers.{org}",
                             lines=lines)
                 for org, raw in raw_providers.items()}
    return ThresholdSet(defaults, tuple(sorted(providers.items())))


def load_thresholds(path: str | None) -> ThresholdSet:
    """The file's thresholds, or the defaults when ``path`` is None."""
    if path is None:
        return ThresholdSet()
    return parse_thresholds(read_config_text(path), source=str(path))
