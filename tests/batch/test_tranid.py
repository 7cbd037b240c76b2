from __future__ import annotations

import itertools

import pytest

from batch.tranid import TRAN_ID_RE, TranIdGenerator, base62


def test_tran_ids_are_25_letters_and_digits_with_operator_prefix_and_m() -> None:
    gen = TranIdGenerator("OPERATOR01", node_id=12345)
    ids = [gen() for _ in range(1000)]
    assert all(TRAN_ID_RE.match(i) for i in ids)
    assert all(i.startswith("OPERATOR01M") for i in ids)
    assert len(set(ids)) == 1000


def test_two_nodes_never_collide() -> None:
    a, b = TranIdGenerator("OPERATOR01", node_id=1), TranIdGenerator("OPERATOR01", node_id=2)
    assert not {a() for _ in range(500)} & {b() for _ in range(500)}


def test_base62_is_fixed_width_and_rejects_overflow() -> None:
    assert base62(0, 3) == "000"
    assert base62(61, 2) == "0z"
    with pytest.raises(ValueError):
        base62(62**2, 2)


def test_bad_operator_code_is_refused() -> None:
    with pytest.raises(ValueError):
        TranIdGenerator("SHORT")


def test_each_id_is_the_node_and_the_counter_in_base62_across_the_kept_head() -> None:
    """The generator keeps the counter's first seven characters between changes: its ids
    are still exactly prefix + node + base62(counter, 9), in order, across each change
    (every 3,844 ids) and at the last counter value that fits, after which it refuses."""
    gen = TranIdGenerator("OPERATOR01", node_id=62**5 + 7)  # the node wraps
    prefix = "OPERATOR01M" + base62(7, 5)
    got = [gen() for _ in range(3 * 3844 + 5)]
    assert got == [prefix + base62(n, 9) for n in range(len(got))]
    last = 62**9 - 1
    gen._counter = itertools.count(last - 3843 - 1)
    tail = [gen() for _ in range(3845)]
    assert tail == [prefix + base62(n, 9) for n in range(last - 3844, last + 1)]
    with pytest.raises(ValueError):
        gen()
