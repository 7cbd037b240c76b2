"""Structured logs: one JSON object a line with run_id, org_code, action; never a token."""

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


def scrub(text: str) -> str:
    return _BEARER.sub(r"\1***", text)


class JsonFormatter(logging.Formatter):
    """One JSON object per record with the extra fields merged in."""

    def __init__(self, **static: Any) -> None:
        super().__init__()
        self.static = static

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": scrub(record.getMessage()),
            **self.static,
        }
        for k, v in vars(record).items():
            if k not in _STANDARD and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = scrub(self.formatException(record.exc_info))
        return json.dumps(out, default=str, ensure_ascii=False)


def setup_logging(*, level: str = "INFO", stream: TextIO | None = None, **static: Any) -> None:
    """Route the package's logs to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(**static))
    root = logging.getLogger("mydata")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
