"""ValueClass (lattica/valueclass.py): a subclass behaves as the same class under ``@dataclass``
does (construction, errors, repr, equality, hashing, freezing, the ``dataclasses`` helpers), each
checked against a real dataclass with the same fields."""

from __future__ import annotations

import dataclasses
from dataclasses import FrozenInstanceError, dataclass, field

import pytest

from lattica.config import DhtConfig
from lattica.valueclass import ValueClass


class Mine(ValueClass):
    a: int
    b: str = "x"
    c: list = field(default_factory=list)
    d: int = field(default=4, repr=False, compare=False)
    e: int = field(init=False, default=7)


@dataclass
class Theirs:
    a: int
    b: str = "x"
    c: list = field(default_factory=list)
    d: int = field(default=4, repr=False, compare=False)
    e: int = field(init=False, default=7)


class Frozen(ValueClass, frozen=True):
    a: int
    b: tuple = ()
    total: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a must be >= 0")
        object.__setattr__(self, "total", self.a + len(self.b))


@pytest.mark.parametrize(
    "args, kwargs", [((1,), {}), ((1, "y"), {}), ((), {"a": 1, "c": [2]}), ((1,), {"d": 9}), ((1, "y", [3], 5), {})]
)
def test_constructed_like_the_dataclass(args, kwargs):
    mine, theirs = Mine(*args, **kwargs), Theirs(*args, **kwargs)
    assert dataclasses.asdict(mine) == dataclasses.asdict(theirs)
    assert repr(mine) == repr(theirs).replace("Theirs", "Mine")


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((), {}, "missing required argument: 'a'"),
        ((1,), {"zz": 2}, "unexpected keyword argument 'zz'"),
        ((1, "y", [], 4, 5), {}, "takes 4 positional arguments but 5 were given"),
        ((1,), {"a": 2}, "multiple values for argument 'a'"),
        ((1,), {"e": 2}, "unexpected keyword argument 'e'"),  # (not an __init__ field)
    ],
)
def test_wrong_arguments_are_a_type_error_as_with_the_dataclass(args, kwargs, message):
    with pytest.raises(TypeError, match=message):
        Mine(*args, **kwargs)
    with pytest.raises(TypeError):
        Theirs(*args, **kwargs)


def test_each_instance_gets_its_own_default_from_the_factory():
    one, two = Mine(1), Mine(1)
    one.c.append(1)
    assert two.c == [] and one.c == [1]


def test_equality_uses_the_compared_fields_and_the_exact_class():
    assert Mine(1, d=1) == Mine(1, d=2)  # (d is not compared)
    assert Mine(1) != Mine(2) and Mine(1, "y") != Mine(1)
    assert Mine(1) != Theirs(1)
    with pytest.raises(TypeError):
        hash(Mine(1))  # mutable and compared by value: unhashable, as a dataclass


def test_a_frozen_one_is_immutable_hashable_and_runs_post_init():
    f = Frozen(2, (1, 2))
    assert f.total == 4 and f == Frozen(2, (1, 2)) and hash(f) == hash(Frozen(2, (1, 2)))
    assert len({f, Frozen(2, (1, 2)), Frozen(3)}) == 2
    with pytest.raises(FrozenInstanceError):
        f.a = 3
    with pytest.raises(FrozenInstanceError):
        del f.a
    with pytest.raises(ValueError, match="a must be"):
        Frozen(-1)
    assert repr(f) == "Frozen(a=2, b=(1, 2))"


def test_the_dataclasses_helpers_work():
    assert dataclasses.is_dataclass(Mine) and [f.name for f in dataclasses.fields(Mine)] == ["a", "b", "c", "d", "e"]
    assert dataclasses.replace(Mine(1, "y"), a=5) == Mine(5, "y")
    assert dataclasses.replace(Frozen(1), a=3).total == 3
    cfg = dataclasses.replace(DhtConfig(), k=8)
    assert cfg.k == 8 and cfg.limits == DhtConfig().limits and cfg != DhtConfig()
    assert dataclasses.asdict(cfg)["k"] == 8
