"""batch.fastinit: the faster ``__init__`` makes the same objects as the dataclass's own."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import FrozenInstanceError, InitVar, dataclass, field
from typing import ClassVar

import pytest

from batch.fastinit import fast_init
from batch.lifecycle import Done, RetryLater, Unknown
from batch.resilience.events import CallFinished
from batch.resilience.outcomes import Kind, Outcome


def _pair(**kw: object) -> tuple[type, type]:
    """The same class twice: the dataclass's own ``__init__``, and fast_init's."""

    def make() -> type:
        @dataclass(frozen=True, slots=True, **kw)  # type: ignore[call-overload]
        class Row:
            a: int
            b: str = "b"
            c: list[int] = field(default_factory=list)
            d: float = field(default=1.5, repr=False)
            kind: ClassVar[str] = "row"

        return Row  # type: ignore[no-any-return]

    return make(), fast_init(make())


def _params(cls: type) -> list[tuple[str, object, object]]:
    """Each parameter's name, kind and default (a default factory's shown as such)."""
    return [(p.name, p.kind, "factory" if p.name == "c" else p.default)
            for p in inspect.signature(cls.__init__).parameters.values()]


@pytest.mark.parametrize("kw_only", [False, True])
def test_it_takes_the_same_parameters_and_makes_equal_objects(kw_only: bool) -> None:
    plain, fast = _pair(kw_only=kw_only)
    assert _params(fast) == _params(plain)
    for args, kwargs in (((), {"a": 1}), ((), {"a": 2, "b": "x", "c": [3], "d": 0.5})):
        got, want = fast(*args, **kwargs), plain(*args, **kwargs)
        assert dataclasses.astuple(got) == dataclasses.astuple(want)
        assert repr(got).replace("Row", "") == repr(want).replace("Row", "")
    if not kw_only:
        assert dataclasses.astuple(fast(4, "y")) == (4, "y", [], 1.5)
    with pytest.raises(TypeError):
        fast()  # a is required
    with pytest.raises(TypeError):
        fast(1, 2, 3, 4, 5)  # one too many


def test_a_default_factory_makes_a_new_default_each_time_and_the_class_stays_frozen() -> None:
    _, fast = _pair()
    one, two = fast(a=1), fast(a=1)
    assert one.c == [] and one.c is not two.c
    assert one == two and hash(fast(a=1, c=())) == hash(fast(a=1, c=()))
    with pytest.raises(FrozenInstanceError):
        one.a = 2
    assert dataclasses.replace(one, b="z") == fast(a=1, b="z")


def test_the_products_hot_objects_keep_their_fields_and_defaults() -> None:
    o = Outcome(Kind.SUCCESS, rsp_code="00000")
    assert (o.attempts, o.detail, o.payload, o.retryable) == (1, "", None, False)
    assert dataclasses.replace(o, attempts=3).attempts == 3
    e = CallFinished("BANK000001", None, o, 1, 0.25)
    assert e.slowest == 0.0 and e.outcome is o
    # inherited slots (the transitions' hierarchy) and keyword-only fields
    assert Done.__init__.__qualname__ == "Done.__init__"
    assert [p.name for p in inspect.signature(RetryLater.__init__).parameters.values()][:2] == [
        "self", "log"]
    assert "week_result" not in inspect.signature(Unknown.__init__).parameters  # a ClassVar


def test_it_refuses_what_it_cannot_serve() -> None:
    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(frozen=True, slots=True)
    class PostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class NotInInit:
        a: int
        b: int = field(default=0, init=False)

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        scale: InitVar[int] = 1

    for cls in (NoSlots, PostInit, NotInInit, WithInitVar):
        with pytest.raises(TypeError, match="fast_init"):
            fast_init(cls)


def test_direct_call_binds_an_objects_call_once_and_leaves_the_rest() -> None:
    import functools
    from types import MethodType

    from batch.fastinit import direct_call

    class Counter:
        def __init__(self) -> None:
            self.n = 0

        def __call__(self, k: int = 1) -> int:
            self.n += k
            return self.n

    c = Counter()
    f = direct_call(c)
    assert isinstance(f, MethodType) and f.__self__ is c
    assert f() == 1 and f(2) == 3 and c() == 4  # the same object's state

    def plain() -> int:
        return 7

    seen: list[int] = []
    partial = functools.partial(plain)
    assert direct_call(plain) is plain
    assert direct_call(seen.append) == seen.append  # a builtin method: as it is
    assert direct_call(partial) is partial  # a C type's call: nothing to gain, left as it is
    assert direct_call(c.__call__) == c.__call__
