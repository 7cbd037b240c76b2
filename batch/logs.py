"""Structured logs: one JSON object a line under cron, a readable line on a terminal.

Every line carries ``run_id``, ``worker_id``, ``org_code``, ``action`` (null when the record
has none) and, when the record concerns one call, its ``x-api-tran-id`` (given as the
``tran_id`` extra). Never a token: fields whose name says token or secret are masked, and
anything that looks like a bearer credential is masked in every text.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
# Belt and braces: anything that looks like a bearer credential is masked.
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',]+")
_SECRET_KEY = re.compile(r"(?i)token|secret|password|authorization")
#: the fields every line has, in this order
CONTEXT = ("run_id", "worker_id", "org_code", "action")
TRAN_ID = "x-api-tran-id"
#: the loggers of this package (the chain's own logger is ``batch.resilience``)
LOGGERS = ("mydata", "batch")


def scrub(text: str) -> str:
    return _BEARER.sub(r"\1***", text)


def _fields(record: logging.LogRecord, static: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: static.get(k) for k in CONTEXT}
    out.update(static)
    for k, v in vars(record).items():
        if k in _STANDARD or k.startswith("_"):
            continue
        if k == "tran_id":
            if v is not None:
                out[TRAN_ID] = v
            continue
        if v is None and k in out and out[k] is not None:
            continue  # a record's None never hides the run's own id
        out[k] = "***" if _SECRET_KEY.search(k) else (scrub(v) if isinstance(v, str) else v)
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per record with the context and the extra fields merged in."""

    def __init__(self, **static: Any) -> None:
        super().__init__()
        self.static = static

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": scrub(record.getMessage()),
            **_fields(record, self.static),
        }
        if record.exc_info:
            out["exc"] = scrub(self.formatException(record.exc_info))
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``HH:MM:SS level action org_code message key=value ...`` for a person at a terminal."""

    def __init__(self, **static: Any) -> None:
        super().__init__()
        self.static = static

    def format(self, record: logging.LogRecord) -> str:
        f = _fields(record, self.static)
        when = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S")
        head = [when, f"{record.levelname.lower():<7}", str(f.pop("action", None) or "-"),
                str(f.pop("org_code", None) or "-"), scrub(record.getMessage())]
        for k in ("run_id", "worker_id"):
            f.pop(k, None)  # the same on every line of a run: noise on a terminal
        tail = " ".join(f"{k}={v}" for k, v in f.items() if v is not None)
        line = " ".join(head) + (f"  {tail}" if tail else "")
        if record.exc_info:
            line += "\n" + scrub(self.formatException(record.exc_info))
        return line


def setup_logging(*, level: str = "INFO", stream: TextIO | None = None,
                  tty: bool | None = None, **static: Any) -> None:
    """Route the package's logs to ``stream`` (stderr): JSON lines, or readable lines when
    ``tty`` (default: when the stream is a terminal). ``static`` fields go on every line."""
    out = stream or sys.stderr
    if tty is None:
        isatty = getattr(out, "isatty", None)
        tty = bool(isatty()) if callable(isatty) else False
    handler = logging.StreamHandler(out)
    handler.setFormatter(TextFormatter(**static) if tty else JsonFormatter(**static))
    for name in LOGGERS:
        root = logging.getLogger(name)
        root.handlers[:] = [handler]
        root.setLevel(level.upper())
        root.propagate = False
