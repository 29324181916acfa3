"""A code package: the Python source files a driver sends with its actors, packed deterministically.

Packing (``pack``) walks the roots the driver ships (its script's directory by default, like Ray's
``working_dir``; packages and modules by name, like ``py_modules``) and keeps ``.py`` files only,
skipping hidden entries, ``__pycache__``, virtual environments and the driver's excludes. The
package is a msgpack array ``[1, main, [[path, source], ...]]`` with the paths sorted, so the same
files give the same bytes and the same CID on every run. ``unpack`` reads one from a peer: bounded
sizes, relative POSIX paths only, nothing executed.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
from collections.abc import Iterable
from dataclasses import dataclass

import msgpack

from lattica._code.tickets import MAX_BYTES
from lattica.errors import CodeError

__all__ = ["CodePackage", "pack", "unpack", "MAX_BYTES", "MAX_FILES"]

FORMAT = 1
MAX_FILES = 10_000
MAX_PATH = 512
SKIP_DIRS = frozenset({"__pycache__", "site-packages", "node_modules"})


@dataclass(frozen=True)
class CodePackage:
    """Source files by relative POSIX path; ``main`` is the driver's script among them, if any
    (other nodes run only its imports and definitions: ``lattica._code.script``)."""

    files: dict[str, bytes]
    main: str | None = None

    def encode(self) -> bytes:
        return msgpack.packb([FORMAT, self.main, [[p, self.files[p]] for p in sorted(self.files)]], use_bin_type=True)

    @property
    def size(self) -> int:
        return sum(len(s) for s in self.files.values())

    def modules(self) -> set[str]:
        """The top-level names the package provides (``train`` for ``train.py``, ``myapp`` for
        ``myapp/...``): imports of these names inside the package resolve to it."""
        return {p.split("/")[0].removesuffix(".py") for p in self.files}


def unpack(data: bytes, max_bytes: int = MAX_BYTES) -> CodePackage:
    """Read a package a peer sent (CodeError if it is malformed or over ``max_bytes``)."""
    if len(data) > max_bytes + 64 * MAX_FILES:
        raise CodeError(f"the code package is {len(data)} bytes, over this node's cap of {max_bytes}")
    try:
        doc = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_bytes,
            max_str_len=MAX_PATH,
            max_array_len=MAX_FILES,
            max_map_len=0,
        )
    except Exception as e:  # msgpack raises several types for malformed input
        raise CodeError(f"malformed code package, or one over this node's cap of {max_bytes} bytes: {e}") from None
    if type(doc) is not list or len(doc) != 3 or doc[0] != FORMAT or type(doc[2]) is not list:
        raise CodeError("malformed code package (not [1, main, files])")
    main = doc[1]
    files: dict[str, bytes] = {}
    for entry in doc[2]:
        if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not str or type(entry[1]) is not bytes:
            raise CodeError("malformed code package entry (not [path, bytes])")
        path, source = entry
        _check_path(path)
        if path in files:
            raise CodeError(f"the code package holds {path!r} twice")
        files[path] = source
    if main is not None and (type(main) is not str or main not in files):
        raise CodeError("the code package names a main script it does not hold")
    pkg = CodePackage(files, main)
    if pkg.size > max_bytes:
        raise CodeError(f"the code package holds {pkg.size} bytes of source, over this node's cap of {max_bytes}")
    return pkg


def _check_path(path: str) -> None:
    parts = path.split("/")
    if (
        not path
        or len(path) > MAX_PATH
        or not path.endswith(".py")
        or any(not p or not p.removesuffix(".py").isidentifier() for p in parts)
    ):
        raise CodeError(f"the code package holds a path that is not a relative module path: {path!r}")


# -- packing (the driver's side) ------------------------------------------------------------------


def pack(
    roots: Iterable[str], main: tuple[str, str] | None = None, excludes: Iterable[str] = (), max_bytes: int = MAX_BYTES
) -> CodePackage:
    """Collect the source files under ``roots``: directories (their contents at the top of the
    package) or importable module names (kept under their name). ``main``: the driver's script
    (as :func:`script_root` gives it) if one of the roots holds it. ``excludes``: fnmatch
    patterns on package paths (``tests/*``, ``*_scratch.py``). CodeError over ``max_bytes``."""
    patterns = list(excludes)
    files: dict[str, bytes] = {}
    total = 0
    main_path: str | None = None
    for root in roots:
        for path, disk in _sources(root):
            if any(fnmatch.fnmatchcase(path, pat) for pat in patterns) or path in files:
                continue
            with open(disk, "rb") as f:
                source = f.read(max_bytes + 1)
            total += len(source)
            if total > max_bytes or len(files) >= MAX_FILES:
                raise CodeError(
                    f"the code under {root} is over the cap of {max_bytes} bytes or {MAX_FILES} files: "
                    "choose what travels with lattica.init(code=[...]) and code_excludes=[...]"
                )
            files[path] = source
            if main is not None and os.path.realpath(disk) == os.path.realpath(os.path.join(*main)):
                main_path = path
    return CodePackage(files, main_path)


def _sources(root: str) -> Iterable[tuple[str, str]]:
    """(package path, file on disk) of every module file under one root."""
    if os.path.isdir(root):
        yield from _walk(root, "")
        return
    spec = importlib.util.find_spec(root) if root.replace(".", "").replace("_", "").isalnum() else None
    if spec is None or not spec.origin and not spec.submodule_search_locations:
        raise CodeError(f"code={root!r} is neither a directory nor an importable module")
    if "." in root:
        raise CodeError(f"code={root!r}: ship a top-level package or module, not a submodule")
    if spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            yield from _walk(location, root + "/")
    elif spec.origin and spec.origin.endswith(".py"):
        yield f"{root}.py", spec.origin
    else:
        raise CodeError(f"code={root!r} is not Python source ({spec.origin}): install it on the nodes instead")


def _walk(directory: str, prefix: str) -> Iterable[tuple[str, str]]:
    for dirpath, dirnames, filenames in os.walk(directory):
        rel = os.path.relpath(dirpath, directory)
        rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        dirnames[:] = sorted(d for d in dirnames if _wanted_dir(os.path.join(dirpath, d), d))
        for name in sorted(filenames):
            if name.endswith(".py") and name[:-3].isidentifier() and not os.path.islink(os.path.join(dirpath, name)):
                yield prefix + rel + name, os.path.join(dirpath, name)


def _wanted_dir(path: str, name: str) -> bool:
    return (
        name.isidentifier()
        and name not in SKIP_DIRS
        and not os.path.islink(path)
        and not os.path.exists(os.path.join(path, "pyvenv.cfg"))
    )
