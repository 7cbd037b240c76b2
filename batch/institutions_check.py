"""The institutions file checked in full at load, so nothing a user typed fails at night.

:func:`parse_checked` adds to :func:`batch.config.parse_institutions` two checks:

* every key at every level is known (top level, each ``[[providers]]`` table, each chain
  section such as ``[providers.breaker]``); an unknown key is one line with the file, the
  line, the key and the closest known key. The known keys are derived from the dataclasses
  that use them (``Institutions``, ``Provider``, ``ChainSettings`` and its sections,
  ``ProviderLimits``), never listed here;
* the objects the run and the planner build from each provider (``ChainSettings``,
  ``ProviderLimits``) are built now, and their errors point at the file and line.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, fields
from typing import Any

from batch.config import Institutions, Provider, key_line, parse_institutions
from batch.errors import ConfigError
from batch.planner import ProviderLimits
from batch.resilience.settings import ChainSettings


def _chain_sections() -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for f in fields(ChainSettings):
        default = f.default if f.default is not MISSING else None
        if default is None:
            continue
        out[f.name] = frozenset(g.name for g in fields(default))
    return out


#: ``[providers.<section>]`` tables and their keys.
SECTIONS = _chain_sections()
TOP_LEVEL = frozenset(f.name for f in fields(Institutions))
PROVIDER_KEYS = (frozenset(f.name for f in fields(Provider) if f.name != "extra")
                 | frozenset(f.name for f in fields(ProviderLimits))
                 | frozenset(SECTIONS))


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """``; did you mean 'x'?`` for the closest known key, or the list of known keys."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f" (known: {', '.join(known)})"


def _unknown(source: str, field: str, key: str, known: Iterable[str],
             line: int | None) -> ConfigError:
    return ConfigError(f"unknown key{did_you_mean(key, known)}", file=source, line=line,
                       field=field)


def check_keys(doc: Mapping[str, Any], text: str, *, source: str) -> None:
    """Raise ConfigError at the first key that no setting reads."""
    lines = text.splitlines()
    for key in doc:
        if key not in TOP_LEVEL:
            raise _unknown(source, key, key, TOP_LEVEL, key_line(lines, None, key))
    providers = doc.get("providers")
    if not isinstance(providers, list):
        return
    for i, raw in enumerate(providers):
        if not isinstance(raw, Mapping):
            continue
        for key, value in raw.items():
            if key not in PROVIDER_KEYS:
                raise _unknown(source, f"providers[{i}].{key}", key, PROVIDER_KEYS,
                               key_line(lines, i, key))
            if key in SECTIONS and isinstance(value, Mapping):
                for sub in value:
                    if sub not in SECTIONS[key]:
                        raise _unknown(source, f"providers[{i}].{key}.{sub}", sub,
                                       SECTIONS[key], key_line(lines, i, sub, section=key))


def check_settings(insts: Institutions, text: str, *, source: str) -> None:
    """Build what the run and the planner will build from each provider; an error names
    the file, the line and the field."""
    lines = text.splitlines()
    for i, p in enumerate(insts.providers):
        for build in (ChainSettings.from_provider, ProviderLimits.from_provider):
            try:
                build(p)
            except (ConfigError, ValueError) as exc:
                field = exc.field if isinstance(exc, ConfigError) else None
                reason = exc.reason if isinstance(exc, ConfigError) else str(exc)
                section, _, key = (field or "").rpartition(".")
                line = key_line(lines, i, key or None, section=section or None)
                raise ConfigError(reason, file=source, line=line,
                                  field=f"providers[{i}].{field}" if field else None) from None


def parse_checked(text: str, *, source: str = "<institutions>") -> Institutions:
    """:func:`parse_institutions` plus :func:`check_keys` and :func:`check_settings`."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return parse_institutions(text, source=source)  # raises with the line
    check_keys(doc, text, source=source)  # a typo first: "did you mean" beats "required"
    insts = parse_institutions(text, source=source)
    check_settings(insts, text, source=source)
    return insts
