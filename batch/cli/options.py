"""Click option types shared by commands."""

from __future__ import annotations

import os
from datetime import date
from typing import Any

import click

from batch.clock import Clock, ScaledClock, clock_from_spec
from batch.crypto import TokenCipher
from planning.windows import Window, WindowError, parse_window


class WindowParam(click.ParamType[Window]):
    """``HHMM:HHMM``, any minute (overrides are not held to 30-minute steps)."""

    name = "HHMM:HHMM"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Window:
        if isinstance(value, Window):
            return value
        try:
            return parse_window(str(value), step=1)
        except WindowError as exc:
            self.fail(str(exc), param, ctx)


class DateParam(click.ParamType[date]):
    name = "YYYY-MM-DD"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> date:
        if isinstance(value, date):
            return value
        try:
            return date.fromisoformat(str(value))
        except ValueError:
            self.fail(f"{value!r} is not a date like 2026-11-30", param, ctx)


WINDOW = WindowParam()
DATE = DateParam()


def clock_from_env() -> Clock:
    """The system clock, unless MYDATA_CLOCK asks for a scaled one (demos, tests).

    A scaled clock's full spec (with its anchor) is written back to the environment, so
    child processes (the demo's simulator) keep the very same time.
    """
    try:
        clock = clock_from_spec(os.environ.get("MYDATA_CLOCK"))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if isinstance(clock, ScaledClock):
        os.environ["MYDATA_CLOCK"] = clock.spec()
    return clock


def token_cipher() -> TokenCipher:
    """The token cipher the environment configures (MYDATA_TOKEN_KEYS or
    MYDATA_TOKEN_KEY_FILE), built once here at the CLI edge by every command that reads or
    writes tokens; a missing or malformed key is a TokenKeyError (one line, exit 2)."""
    return TokenCipher.from_env()
