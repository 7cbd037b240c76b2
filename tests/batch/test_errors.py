from __future__ import annotations

import pytest

from batch.errors import describe


@pytest.mark.parametrize(("exc", "expected"), [
    (TimeoutError(), "TimeoutError"),
    (ValueError("   \n  "), "ValueError"),
    (ConnectionError("refused\nsecond line"), "ConnectionError: refused"),
    (OSError("\n\nlate first line"), "OSError: late first line"),
])
def test_describe_is_one_line_even_for_an_empty_message(exc: BaseException,
                                                        expected: str) -> None:
    assert describe(exc) == expected


def test_describe_truncates_to_the_limit() -> None:
    assert len(describe(RuntimeError("x" * 1000), limit=50)) == 50
