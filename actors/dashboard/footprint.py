"""What an actor holds in memory, estimated: Python has no heap per actor (tracemalloc on every
allocation would cost more than the actors), so the dashboard walks what the instance's
attributes reach — containers, numpy arrays, torch tensors, bytes — counting each object once,
up to ``MAX_OBJECTS`` objects. Asked on demand (an open actor panel), never sampled for all."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["footprint", "MAX_OBJECTS"]

MAX_OBJECTS = 20_000  # objects visited per estimate (a bound on the loop time it takes: a few ms)
_ATOMS = (int, float, complex, bool, str, bytes, bytearray, type(None))


def footprint(instance: Any) -> dict[str, Any]:
    """``{"bytes": estimate, "objects": visited, "complete": whether the walk ended before the
    bound}``; arrays and tensors count their data once (a view counts its base's), other objects
    ``sys.getsizeof``. The walk may race the actor's own thread: what changes meanwhile is
    skipped, not an error."""
    seen: set[int] = set()
    storages: set[int] = set()  # torch storages counted (tensors sharing one count it once)
    todo = [instance]
    total = 0
    while todo and len(seen) < MAX_OBJECTS:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            total += sys.getsizeof(obj, 0)
            t = type(obj)
            if isinstance(obj, _ATOMS):
                continue
            if t.__module__ == "numpy" and t.__name__ == "ndarray":
                if obj.base is not None:  # (an array owning its data counts it in its size; a view, its base's once)
                    todo.append(obj.base)
                continue
            if t.__module__.startswith("torch") and t.__name__ in ("Tensor", "Parameter"):
                storage = obj.untyped_storage()
                if storage.data_ptr() not in storages:
                    storages.add(storage.data_ptr())
                    total += int(storage.nbytes())
                continue
            if isinstance(obj, dict):
                todo.extend(list(obj.values()))
                todo.extend(k for k in list(obj) if not isinstance(k, _ATOMS))
            elif isinstance(obj, (list, tuple, set, frozenset)):
                todo.extend(list(obj))
            elif isinstance(obj, memoryview):
                todo.append(obj.obj)
            elif not isinstance(obj, type):
                d = getattr(obj, "__dict__", None)
                if isinstance(d, dict):
                    todo.append(d)
                for slot in getattr(t, "__slots__", ()):
                    if isinstance(slot, str) and hasattr(obj, slot):
                        todo.append(getattr(obj, slot))
        except Exception:  # (changed while we looked, or an object that refuses to be looked at)
            continue
    return {"bytes": total, "objects": len(seen), "complete": not todo}
