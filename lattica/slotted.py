"""A base for the small internal value classes on a starting node's import path.

A subclass lists its fields in ``__slots__`` and writes its own ``__init__``; equality and repr
come from those fields. Defining one costs what any class costs, where a dataclass compiles
its methods when its module is imported (about 0.35 ms each here: forty of them were a sixth of
``import lattica``, docs/benchmarks.md). Public configuration and event types stay dataclasses.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Slotted"]


class Slotted:
    """Fields in ``__slots__``; compared and shown by them (unhashable, as a mutable dataclass)."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: Any) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self.__slots__)

    def __repr__(self) -> str:
        fields = ", ".join(f"{f}={getattr(self, f, '<unset>')!r}" for f in self.__slots__)
        return f"{type(self).__qualname__}({fields})"
