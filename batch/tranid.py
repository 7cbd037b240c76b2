"""``x-api-tran-id``: 25 letters and digits, unique across the cluster for the day.

Layout (MYDATA.md): the operator's 10-character org code, ``M`` (a MyData operator
originated it), then 14 characters: a 5-character node id and a 9-character per-node
counter, both base 62. A ``run`` takes its node number from the database's node registry
(batch/db/nodes.py: an autoincrement id, so no two processes share one, across hosts and
restarts; it wraps only after 62**5 = 916,132,832 registrations). Without a database (tests,
tools) the node number is random per process.
"""

from __future__ import annotations

import itertools
import re
import secrets

from batch.config import ORG_CODE_RE

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
NODE_CHARS = 5
COUNTER_CHARS = 9
TRAN_ID_RE = re.compile(r"^[A-Za-z0-9]{25}$")


def base62(value: int, width: int) -> str:
    """``value`` in base 62, left-padded with zeros to exactly ``width`` characters."""
    if value < 0 or value >= 62**width:
        raise ValueError(f"{value} does not fit in {width} base-62 characters")
    out = []
    for _ in range(width):
        value, rem = divmod(value, 62)
        out.append(ALPHABET[rem])
    return "".join(reversed(out))


def random_node_id() -> int:
    return secrets.randbelow(62**NODE_CHARS)


#: the counter's last two characters for every value below 62**2, in order
_PAIRS = tuple(a + b for a in ALPHABET for b in ALPHABET)


class TranIdGenerator:
    """Makes transaction ids for one process (one node).

    Every call takes one; the counter's first seven characters change once in 3,844 ids
    and are kept, so an id costs one divmod and a lookup (3.5 us -> under 1 us)."""

    __slots__ = ("_counter", "_head", "_high", "_prefix")

    def __init__(self, operator_org_code: str, node_id: int | None = None) -> None:
        if not ORG_CODE_RE.match(operator_org_code):
            raise ValueError("operator_org_code must be exactly 10 letters or digits")
        node = random_node_id() if node_id is None else node_id
        if node < 0:
            raise ValueError(f"node_id must be >= 0, got {node}")
        self._prefix = f"{operator_org_code}M{base62(node % 62**NODE_CHARS, NODE_CHARS)}"
        self._counter = itertools.count()
        self._high = -1
        self._head = ""

    def __call__(self) -> str:
        high, low = divmod(next(self._counter), len(_PAIRS))
        if high != self._high:  # raises once the counter no longer fits
            self._head = self._prefix + base62(high, COUNTER_CHARS - 2)
            self._high = high
        return self._head + _PAIRS[low]
