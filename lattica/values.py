"""The common Python values a call passes, as codec extensions, and the user's own value classes.

Sets and frozensets, ``datetime`` / ``date`` / ``time`` / ``timedelta``, ``uuid.UUID``,
``decimal.Decimal`` and ``pathlib`` paths travel as themselves; a dataclass or an ``Enum`` travels
once registered on both ends (``lattica.values.register(MyConfig)``, or as a decorator). Each is
rebuilt from plain data with checked types: nothing is imported by name and nothing is unpickled.
The codec loads this module (and registers ``EXTENSIONS``) the first time it meets one of these
types or extension codes: a starting node does not.

Datetimes travel as ISO text with their UTC offset: an aware datetime keeps its instant and
offset, not its ``zoneinfo`` name.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import pathlib
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from lattica._code.tickets import NAMESPACE_PREFIX
from lattica.errors import CodecError

__all__ = ["register", "name_of", "EXTENSIONS", "REGISTERED_CODE"]

T = TypeVar("T", bound=type)

MAX_DECIMAL = 4096  # characters of a Decimal's text
MAX_NAME = 256
_REGISTERED: dict[str, type] = {}  # name -> class (dataclasses and enums)
_NAMES: dict[type, str] = {}


def register(cls: T, name: str | None = None) -> T:
    """Let instances of the dataclass or Enum ``cls`` travel in calls (register it on every node
    that decodes them: at import of the module that defines it, which code that travels does).
    ``name`` defaults to ``module.QualName``. Usable as a decorator."""
    if not isinstance(cls, type) or not (dataclasses.is_dataclass(cls) or issubclass(cls, enum.Enum)):
        raise TypeError(f"lattica.values.register takes a dataclass or an Enum class, not {cls!r}")
    module = cls.__module__
    if module.startswith(NAMESPACE_PREFIX):
        module = module.partition(".")[2]  # (code that travels: the name its driver gave it)
    name = name or f"{module}.{cls.__qualname__}"
    if len(name) > MAX_NAME:
        raise ValueError(f"a registered value name is at most {MAX_NAME} characters")
    _REGISTERED[name] = cls
    _NAMES[cls] = name
    return cls


def name_of(cls: type) -> str | None:
    """The name a registered dataclass or enum travels under (None: not registered)."""
    return _NAMES.get(cls)


def value_to_obj(o: Any) -> list[Any]:
    cls = type(o)
    name = _NAMES[cls]
    if isinstance(o, enum.Enum):
        return [name, o.value]
    return [name, {f.name: getattr(o, f.name) for f in dataclasses.fields(o) if f.init}]


def _value_from_obj(data: Any) -> Any:
    if type(data) is not list or len(data) != 2 or type(data[0]) is not str:
        raise CodecError("malformed registered value")
    cls = _REGISTERED.get(data[0])
    if cls is None:
        raise CodecError(
            f"a value of class {data[0]!r} arrived, which this node has not registered (lattica.values.register)"
        )
    if issubclass(cls, enum.Enum):
        return cls(data[1])
    if type(data[1]) is not dict or not all(type(k) is str for k in data[1]):
        raise CodecError(f"malformed {data[0]} value")
    return cls(**data[1])


def _text(data: Any, limit: int = 64) -> str:
    if type(data) is not str or len(data) > limit:
        raise CodecError("malformed value text")
    return data


def _items(data: Any) -> list[Any]:
    if type(data) is not list:
        raise CodecError("malformed set")
    return data


def _path_from(data: Any) -> pathlib.PurePath:
    if (
        type(data) is not list
        or len(data) != 2
        or data[0] not in (0, 1, 2, 3)
        or type(data[1]) is not str
        or len(data[1]) > 4096
    ):
        raise CodecError("malformed path")
    kind = data[0]
    if kind == 0:
        return pathlib.Path(data[1])
    return pathlib.PurePosixPath(data[1]) if kind == 1 else pathlib.PureWindowsPath(data[1])


def _timedelta_from(data: Any) -> dt.timedelta:
    if type(data) is not list or len(data) != 3 or not all(type(v) is int for v in data):
        raise CodecError("malformed timedelta")
    return dt.timedelta(days=data[0], seconds=data[1], microseconds=data[2])


def _uuid_from(data: Any) -> uuid.UUID:
    if not isinstance(data, (bytes, memoryview)) or len(data) != 16:
        raise CodecError("malformed UUID")
    return uuid.UUID(bytes=bytes(data))


class RegisteredValue:
    """The extension a registered dataclass or enum travels as (its name says which class)."""


REGISTERED_CODE = 49
_PATHS: list[type] = [pathlib.PosixPath, pathlib.PurePosixPath, pathlib.PureWindowsPath, pathlib.WindowsPath]

#: (code, class, to_obj, from_obj) for the codec to register; several classes may share a code
#: (the paths): the first one's decoder reads them all
EXTENSIONS: list[tuple[int, type, Callable[[Any], Any], Callable[[Any], Any]]] = [
    (40, set, list, lambda d: set(_items(d))),
    (41, frozenset, list, lambda d: frozenset(_items(d))),
    (42, dt.datetime, dt.datetime.isoformat, lambda d: dt.datetime.fromisoformat(_text(d))),
    (43, dt.date, dt.date.isoformat, lambda d: dt.date.fromisoformat(_text(d))),
    (44, dt.time, dt.time.isoformat, lambda d: dt.time.fromisoformat(_text(d))),
    (45, dt.timedelta, lambda t: [t.days, t.seconds, t.microseconds], _timedelta_from),
    (46, uuid.UUID, lambda u: u.bytes, _uuid_from),
    (47, decimal.Decimal, str, lambda d: decimal.Decimal(_text(d, MAX_DECIMAL))),
    *[(48, cls, lambda p, k=kind: [k, str(p)], _path_from) for kind, cls in enumerate(_PATHS)],
    (REGISTERED_CODE, RegisteredValue, value_to_obj, _value_from_obj),
]
