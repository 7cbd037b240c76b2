"""Institutions file (TOML): the operator's org code and each provider's windows and limits.

The keys are in docs/operator.md; optional per-provider tables tune the resilience chain.
Every error names the file, the line and the field.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batch.errors import ConfigError
from planning.windows import Window, WindowError, parse_windows

INDUSTRIES = (
    "bank", "card", "invest", "insu", "efin", "capital", "ginsu", "telecom", "p2p", "bond",
    "usury",
)
ORG_CODE_RE = re.compile(r"^[A-Za-z0-9]{10}$")
_URL_RE = re.compile(r"^https?://[^\s/]+(:\d+)?(/[^\s]*)?$")


@dataclass(frozen=True, slots=True)
class Provider:
    """One provider institution as registered: where it is and what it can take."""

    org_code: str
    industry: str
    base_url: str
    windows: tuple[Window, ...]
    calls_per_second: float
    max_concurrency: int
    #: optional tuning, seconds
    connect_timeout: float = 3.0
    read_timeout: float = 20.0
    call_deadline: float = 45.0
    max_attempts_per_week: int = 5
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not ORG_CODE_RE.match(self.org_code):
            raise ValueError("org_code must be exactly 10 letters or digits")
        if self.industry not in INDUSTRIES:
            raise ValueError(f"industry must be one of {', '.join(INDUSTRIES)}")
        if not _URL_RE.match(self.base_url):
            raise ValueError("base_url must be an http(s) URL like 'https://host:port'")
        if not self.calls_per_second > 0:
            raise ValueError("calls_per_second must be a positive number")
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be a positive integer")

    @property
    def window_strings(self) -> list[str]:
        return [str(w) for w in self.windows]

    @property
    def per_minute_cap(self) -> int:
        """The most scheduled calls a minute may carry at the registered rate."""
        return int(self.calls_per_second * 60)


@dataclass(frozen=True, slots=True)
class Institutions:
    """The whole institutions file."""

    operator_org_code: str
    providers: tuple[Provider, ...]

    def __post_init__(self) -> None:
        if not ORG_CODE_RE.match(self.operator_org_code):
            raise ValueError("operator_org_code must be exactly 10 letters or digits")

    def by_code(self) -> dict[str, Provider]:
        return {p.org_code: p for p in self.providers}


_REQUIRED = ("org_code", "industry", "base_url", "windows", "calls_per_second", "max_concurrency")
_OPTIONAL_FLOAT = ("connect_timeout", "read_timeout", "call_deadline")


def key_line(lines: list[str], table_index: int | None, key: str | None,
             section: str | None = None) -> int | None:
    """Best-effort line number of ``key`` (in ``[providers.<section>]`` when given) inside
    the ``table_index``-th ``[[providers]]``, or among the top-level keys when
    ``table_index`` is None; falls back to the table's own line."""
    start, end, count = 0, len(lines), -1
    if table_index is not None:
        start = end
        for i, raw in enumerate(lines):
            if raw.strip().startswith("[[providers]]"):
                count += 1
                if count == table_index:
                    start = i
                elif count > table_index:
                    end = i
                    break
    block = list(enumerate(lines[start:end], start=start + 1))
    if key is None:
        return start + 1 if table_index is not None else None
    k = re.escape(key)
    if section is not None:
        s = re.escape(section)
        inside = False
        for i, raw in block:
            t = raw.strip()
            if t.startswith("["):
                inside = re.match(rf"^\[\s*providers\s*\.\s*{s}\s*\]", t) is not None
            elif inside and re.match(rf"^{k}\s*=", t):
                return i
        patterns = [rf"^{s}\s*\.\s*{k}\s*=", rf"^{s}\s*=.*\b{k}\s*="]
    else:
        patterns = [rf"^{k}\s*=", rf"^\[\s*providers\s*\.\s*{k}\s*\]", rf"^{k}\s*\."]
    for i, raw in block:
        t = raw.strip()
        if table_index is None and t.startswith("["):
            break
        if any(re.match(p, t) for p in patterns):
            return i
    return start + 1 if table_index is not None else None


def provider_from_mapping(raw: Mapping[str, Any]) -> Provider:
    """Build a provider from one ``[[providers]]`` table; raises ConfigError(field=...)."""
    for key in _REQUIRED:
        if key not in raw:
            raise ConfigError("is required", field=key)
    if not isinstance(raw["org_code"], str):
        raise ConfigError("must be a string of 10 letters or digits", field="org_code")
    if not isinstance(raw["windows"], list):
        raise ConfigError("must be a list like [\"0030:0530\"]", field="windows")
    try:
        windows = parse_windows(raw["windows"])
    except WindowError as exc:
        raise ConfigError(str(exc), field="windows") from None
    cps = raw["calls_per_second"]
    if isinstance(cps, bool) or not isinstance(cps, int | float) or cps <= 0:
        raise ConfigError("must be a positive number", field="calls_per_second")
    mc = raw["max_concurrency"]
    if isinstance(mc, bool) or not isinstance(mc, int) or mc < 1:
        raise ConfigError("must be a positive integer", field="max_concurrency")
    kwargs: dict[str, Any] = {}
    for key in _OPTIONAL_FLOAT:
        if key in raw:
            v = raw[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                raise ConfigError("must be a positive number of seconds", field=key)
            kwargs[key] = float(v)
    if "max_attempts_per_week" in raw:
        v = raw["max_attempts_per_week"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError("must be a positive integer", field="max_attempts_per_week")
        kwargs["max_attempts_per_week"] = v
    known = set(_REQUIRED) | set(_OPTIONAL_FLOAT) | {"max_attempts_per_week"}
    extra = {k: v for k, v in raw.items() if k not in known}
    for key in ("industry", "base_url"):
        if not isinstance(raw[key], str):
            raise ConfigError("must be a string", field=key)
    try:
        return Provider(
            org_code=raw["org_code"],
            industry=raw["industry"],
            base_url=raw["base_url"].rstrip("/"),
            windows=windows,
            calls_per_second=float(cps),
            max_concurrency=mc,
            extra=extra,
            **kwargs,
        )
    except ValueError as exc:
        msg = str(exc)
        fld = msg.split(" ", 1)[0]
        raise ConfigError(msg.split(" ", 1)[1] if fld in raw else msg, field=fld) from None


def parse_institutions(text: str, *, source: str = "<institutions>") -> Institutions:
    """Parse an institutions TOML document; errors name ``source``, the line and the field."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = getattr(exc, "lineno", None)
        msg = getattr(exc, "msg", str(exc))
        raise ConfigError(f"not valid TOML: {msg}", file=source, line=line) from None
    lines = text.splitlines()
    op = doc.get("operator_org_code")
    if not isinstance(op, str) or not ORG_CODE_RE.match(op):
        raise ConfigError(
            "must be exactly 10 letters or digits (our org code)",
            file=source, line=key_line(lines, None, "operator_org_code"),
            field="operator_org_code",
        )
    raw_providers = doc.get("providers")
    if not isinstance(raw_providers, list) or not raw_providers:
        raise ConfigError("at least one [[providers]] table is required", file=source,
                          field="providers")
    providers: list[Provider] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(raw_providers):
        try:
            p = provider_from_mapping(raw)
        except ConfigError as exc:
            raise ConfigError(
                exc.reason, file=source, line=key_line(lines, i, exc.field),
                field=f"providers[{i}].{exc.field}" if exc.field else None,
            ) from None
        if p.org_code in seen:
            raise ConfigError(
                f"duplicate org_code {p.org_code!r} (first at providers[{seen[p.org_code]}])",
                file=source, line=key_line(lines, i, "org_code"),
                field=f"providers[{i}].org_code",
            )
        seen[p.org_code] = i
        providers.append(p)
    return Institutions(operator_org_code=op, providers=tuple(providers))


def read_config_text(path: str | Path) -> str:
    """A settings file's UTF-8 text; a missing or unreadable file is one ConfigError line."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("no such file", file=str(p)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", file=str(p)) from None


def load_institutions(path: str | Path) -> Institutions:
    """Read and validate an institutions file in full: its syntax and values, no unknown
    key at any level, and every setting the run will use (``batch.institutions_check``)."""
    from batch.institutions_check import parse_checked

    return parse_checked(read_config_text(path), source=str(path))
