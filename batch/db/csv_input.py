"""CSV input files: open, read the header row, stream rows with their line numbers.

Every problem becomes one :class:`InputError` naming the file, the line and the field, so
a user can fix the file from the message alone. Values of secret columns are never echoed.
"""

from __future__ import annotations

import csv
import operator
import os
from collections.abc import Callable, Iterator, Sequence
from datetime import date
from pathlib import Path
from types import TracebackType

from batch.errors import InputError

TIMESTAMP_EXAMPLE = "2026-11-29T09:00:00+09:00"
#: rows between two calls of a CsvInput's ``progress``
PROGRESS_EVERY = 10_000

#: ``progress(rows read, fraction of the file read)``, every PROGRESS_EVERY rows and at the end
Progress = Callable[[int, float], None]


class CsvInput:
    """One CSV file read by its header: the ``required`` columns and any of ``optional``, in
    any order. A column of neither kind is an error unless ``ignore_extra`` (then skipped).

    Use as a context manager; iterate :meth:`rows` for ``(line, fields)`` pairs, the fields
    in the order of :attr:`columns` (``required``, then the ``optional`` ones present). Blank
    lines are skipped; a row with a wrong number of fields is an error naming the field.
    """

    def __init__(self, path: str | Path, required: Sequence[str],
                 optional: Sequence[str] = (), *, ignore_extra: bool = False,
                 progress: Progress | None = None) -> None:
        self.path = Path(path)
        self._progress = progress
        self.name = str(path)
        self.required = tuple(required)
        self.optional = tuple(optional)
        self.ignore_extra = ignore_extra
        #: the columns rows are given in; ``_file_columns``: the header as written
        self.columns: tuple[str, ...] = ()
        self._file_columns: tuple[str, ...] = ()
        self._pick: Callable[[list[str]], list[str]] | None = None
        try:
            self._file = open(self.path, encoding="utf-8-sig", newline="")  # noqa: SIM115
        except FileNotFoundError:
            raise InputError("no such file", file=self.name) from None
        except IsADirectoryError:
            raise InputError("is a directory, not a CSV file", file=self.name) from None
        except OSError as exc:
            raise InputError(f"cannot open: {exc.strerror or exc}", file=self.name) from None
        self._reader = csv.reader(self._file, strict=True)
        try:
            self._read_header()
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> CsvInput:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._file.close()

    @property
    def width(self) -> int:
        """How many fields each row of :meth:`rows` has."""
        return len(self.columns)

    def error(self, line: int | None, field: str | None, message: str) -> InputError:
        return InputError(message, file=self.name, line=line, field=field)

    def _expected(self) -> str:
        text = ",".join(self.required)
        if self.optional:
            text += f" (optionally ,{','.join(self.optional)})"
        return text + ", in any order"

    def _read_header(self) -> None:
        header = self._next_row()
        while header is not None and not header:
            header = self._next_row()
        if header is None:
            raise self.error(None, None, f"is empty; the first line must be the header row "
                                         f"{self._expected()}")
        names = [h.strip() for h in header]
        line = self._reader.line_num
        position: dict[str, int] = {}
        for i, name in enumerate(names):
            if name in position:
                raise self.error(line, name, f"header column {i + 1} repeats column "
                                             f"{position[name] + 1}")
            position[name] = i
        for want in self.required:
            if want not in position:
                raise self.error(line, want, f"header column {want!r} is missing; the header "
                                             f"row must name {self._expected()}")
        known = self.required + self.optional
        extra = [(i, n) for i, n in enumerate(names) if n not in known]
        if extra and not self.ignore_extra:
            i, name = extra[0]
            raise self.error(line, name or f"column {i + 1}",
                             f"unexpected header column {i + 1}; the columns are "
                             f"{self._expected()} (or pass --ignore-extra-columns to skip "
                             f"the others)")
        self.columns = self.required + tuple(n for n in self.optional if n in position)
        self._file_columns = tuple(names)
        order = [position[c] for c in self.columns]
        if order != list(range(len(names))):
            getter = operator.itemgetter(*order)
            if len(order) == 1:
                self._pick = lambda row: [getter(row)]
            else:
                self._pick = lambda row: list(getter(row))

    def _next_row(self) -> list[str] | None:
        try:
            return next(self._reader)
        except StopIteration:
            return None
        except UnicodeDecodeError as exc:
            raise self._not_utf8(exc) from None
        except csv.Error as exc:
            raise self.error(self._reader.line_num, None, f"not valid CSV: {exc}") from None

    def _not_utf8(self, exc: UnicodeDecodeError) -> InputError:
        # The decoder runs ahead of the CSV reader; find the exact line from the bytes.
        try:
            data = self.path.read_bytes()
            data.decode("utf-8-sig")
        except UnicodeDecodeError as bad:
            offset = bad.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
            line = data.count(b"\n", 0, offset) + 1
            return self.error(line, None, f"is not UTF-8 text (byte 0x{data[offset]:02x}); "
                                          f"save the file as UTF-8")
        except OSError:
            pass
        return self.error(None, None, f"is not UTF-8 text ({exc.reason}); save it as UTF-8")

    def rows(self) -> Iterator[tuple[int, list[str]]]:
        """``(line, fields)`` for every non-blank row after the header, width checked,
        fields in the order of :attr:`columns`."""
        width = len(self._file_columns)
        reader = self._reader
        pick = self._pick
        progress = self._progress
        n = 0
        while True:
            try:
                for row in reader:
                    if len(row) != width:
                        if not row:
                            continue
                        raise self._width_error(reader.line_num, row)
                    yield reader.line_num, (row if pick is None else pick(row))
                    if progress is not None:
                        n += 1
                        if n % PROGRESS_EVERY == 0:
                            progress(n, self._fraction_read())
                if progress is not None:
                    progress(n, 1.0)
                return
            except UnicodeDecodeError as exc:
                raise self._not_utf8(exc) from None
            except csv.Error as exc:
                raise self.error(reader.line_num, None, f"not valid CSV: {exc}") from None

    def _fraction_read(self) -> float:
        """How much of the file the reader has taken in: the descriptor's offset (its buffer
        runs a few KiB ahead; the text layer's tell() is off while a csv reader iterates)."""
        try:
            fd = self._file.fileno()
            size = os.fstat(fd).st_size
            return min(1.0, os.lseek(fd, 0, os.SEEK_CUR) / size) if size else 1.0
        except (OSError, ValueError):
            return 0.0

    def _width_error(self, line: int, row: list[str]) -> InputError:
        width = len(self._file_columns)
        if len(row) < width:
            return self.error(line, self._file_columns[len(row)],
                              f"is missing (the row has {len(row)} fields, the header "
                              f"{width})")
        return self.error(line, f"column {width + 1}",
                          f"unexpected extra field (the row has {len(row)} fields, the header "
                          f"{width}); quote values that contain commas")


def bad_timestamp(text: str) -> str:
    return f"{text!r} is not an ISO 8601 timestamp like {TIMESTAMP_EXAMPLE}"


def parse_day(text: str) -> date:
    """An ISO 8601 calendar date ``YYYY-MM-DD``. Raises ValueError."""
    if len(text) != 10:
        raise ValueError(text)
    return date.fromisoformat(text)


def parse_count(text: str) -> int:
    """A non-negative integer written in ASCII digits. Raises ValueError."""
    if not (text.isascii() and text.isdigit()):
        raise ValueError(text)
    return int(text)
