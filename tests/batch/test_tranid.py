from __future__ import annotations

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
