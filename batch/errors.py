"""The one exception root of mydata-batch.

    MydataError
    ├── InputError        bad user input: a file, a row, a field (CLI: one line, exit 2)
    │   └── ConfigError   bad settings or institutions file
    ├── DatabaseError     the database is unreachable or refused a statement (exit 2)
    ├── ProviderError     a provider answered in a way the caller must see
    └── ShutdownRequested the run was asked to stop (SIGTERM/SIGINT)
"""

from __future__ import annotations


def describe(exc: BaseException, *, limit: int = 300) -> str:
    """``TypeName: first line of the message`` for logs and one-line errors; safe on an
    empty message (``TimeoutError()``) and on a message that is only whitespace."""
    name = type(exc).__name__
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = f"{name}: {lines[0]}" if lines else name
    return text[:limit]


class MydataError(Exception):
    """Root of every error this package raises on purpose."""


class InputError(MydataError):
    """Bad input a user can fix; ``str()`` is one line naming where and what."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.reason = message
        where = ""
        if file is not None:
            where = file
            if line is not None:
                where += f":{line}"
            where += ": "
        if field is not None:
            where += f"field {field!r}: "
        super().__init__(f"{where}{message}")


class ConfigError(InputError):
    """Bad settings, institutions file or option value."""


class DatabaseError(MydataError):
    """The database could not be reached or refused what we asked."""


class ProviderError(MydataError):
    """A provider answered in a way the caller must see."""


class ShutdownRequested(MydataError):
    """The run was asked to stop; finish in-flight work and exit."""
