"""Value classes that are genuine dataclasses without the per-class generated methods.

``@dataclass`` writes an ``__init__``, ``__repr__`` and ``__eq__`` (and for frozen classes
``__setattr__``, ``__delattr__`` and ``__hash__``) as source text and compiles each one when the
class is defined: ~0.3 ms a class here, paid by every process at ``import lattica`` for the
configuration and value classes a starting node uses. A subclass of :class:`ValueClass` is made a
dataclass without them (``dataclasses.fields``, ``replace``, ``asdict`` and ``is_dataclass`` work
as usual) and shares one ``__init__``, ``__repr__``, ``__eq__`` (and, with ``frozen=True``, the
frozen set of methods and a hash) written once here. They behave as the generated ones do for
what these classes use: defaults, ``default_factory``, ``field(init=False, repr=False,
compare=False)``, ``__post_init__``. Construction is a few microseconds slower, which is nothing
for objects built per node, per connection or per configuration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, FrozenInstanceError
from typing import Any

__all__ = ["ValueClass"]


class ValueClass:
    """Base of a value class; ``class C(ValueClass, frozen=True)`` for an immutable, hashable one."""

    __slots__ = ()
    _vc_init: tuple[tuple[str, Any, Any], ...] = ()  # (name, default, default_factory) of __init__'s fields
    _vc_rest: tuple[tuple[str, Any, Any], ...] = ()  # fields outside __init__ that have a default
    _vc_repr: tuple[str, ...] = ()
    _vc_compare: tuple[str, ...] = ()

    def __init_subclass__(cls, frozen: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
        fields = dataclasses.fields(cls)
        cls._vc_init = tuple((f.name, f.default, f.default_factory) for f in fields if f.init)
        cls._vc_rest = tuple(
            (f.name, f.default, f.default_factory)
            for f in fields
            if not f.init and (f.default is not MISSING or f.default_factory is not MISSING)
        )
        cls._vc_repr = tuple(f.name for f in fields if f.repr)
        cls._vc_compare = tuple(f.name for f in fields if f.compare)
        if frozen:
            cls.__setattr__ = _refuse_set  # type: ignore[method-assign,assignment]
            cls.__delattr__ = _refuse_delete  # type: ignore[method-assign,assignment]
            cls.__hash__ = _hash  # type: ignore[method-assign,assignment]
        else:
            cls.__hash__ = None  # type: ignore[assignment]  # (mutable and compared by value: as a dataclass)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        spec = cls._vc_init
        if len(args) > len(spec):
            raise TypeError(f"{cls.__qualname__}() takes {len(spec)} positional arguments but {len(args)} were given")
        put = object.__setattr__
        for i, (name, default, factory) in enumerate(spec):
            if i < len(args):
                if name in kwargs:
                    raise TypeError(f"{cls.__qualname__}() got multiple values for argument {name!r}")
                value = args[i]
            elif name in kwargs:
                value = kwargs.pop(name)
            elif default is not MISSING:
                value = default
            elif factory is not MISSING:
                value = factory()
            else:
                raise TypeError(f"{cls.__qualname__}() missing required argument: {name!r}")
            put(self, name, value)
        if kwargs:
            raise TypeError(f"{cls.__qualname__}() got an unexpected keyword argument {next(iter(kwargs))!r}")
        for name, default, factory in cls._vc_rest:
            put(self, name, default if default is not MISSING else factory())
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()

    def __repr__(self) -> str:
        return f"{type(self).__qualname__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self._vc_repr) + ")"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        names = self._vc_compare
        return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)


def _refuse_set(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _refuse_delete(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, n) for n in self._vc_compare))
