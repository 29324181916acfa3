"""The driver's side of code that travels: which classes go with their spawns, and their ticket.

A class travels when its module is one of the driver's: the script itself (``__main__``), a module
under a shipped directory (the script's own directory by default, Ray's ``working_dir``), a
shipped module by name (Ray's ``py_modules``), or a module of a package this node loaded from
someone else (a supervisor restarting a child passes the original ticket on). The package is
packed once per process, the first time a class needs it, stored in the content plane (pinned and
announced, so the nodes that fetch it serve it to each other) and named by a ticket signed with
this node's key. Classes of installed modules (``lattica``, site-packages) never travel.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from lattica._code.tickets import MAX_BYTES, SHIPPED, Ticket, ticket_of
from lattica._identity import KeyPair
from lattica.errors import CodeError

if TYPE_CHECKING:
    from lattica._code.package import CodePackage

__all__ = ["Shipper", "script_root"]


class Shipper:
    """One node's outgoing code: ``code`` is what ``Node(code=...)`` says (None: the script's
    directory; False: nothing; else directories and module names), ``excludes`` fnmatch patterns."""

    def __init__(
        self,
        keypair: KeyPair,
        certificates: Iterable[bytes],
        put: Callable[[bytes], str],
        code: Iterable[str] | bool | None = None,
        excludes: Iterable[str] = (),
        max_bytes: int = MAX_BYTES,
        admin: bool = False,
    ) -> None:
        self._keypair = keypair
        self.admin = admin  # this node administers its mesh (nodes that take administrators' code only take ours)
        self._certificates = tuple(certificates)
        self._put = put
        self._main = script_root()
        if code is None:
            self.roots = [self._main[0]] if self._main is not None else []
        elif code is False or code is True:
            self.roots = [self._main[0]] if code and self._main is not None else []
        else:
            self.roots = [os.path.realpath(r) if os.path.isdir(r) else r for r in code]
        self.excludes = list(excludes)
        self.max_bytes = max_bytes
        self._made: Ticket | None = None  # the package's ticket, made at the first class that travels
        self._making = threading.Lock()  # (made from the loop's executor, or while a call is encoded)
        self._package: CodePackage | None = None
        self._checked: set[str] = set()

    def travels(self, cls: type) -> bool:
        """Whether spawns of ``cls`` on other nodes carry this node's package (or the one it came in)."""
        module = cls.__module__
        if ticket_of(module) is not None:
            return True
        if module == "__main__":
            return self._main is not None and any(_under(os.path.join(*self._main), r) for r in self.roots)
        if module.partition(".")[0] in self.roots:
            return True
        file = getattr(sys.modules.get(module), "__file__", None)
        return file is not None and any(_under(os.path.realpath(file), r) for r in self.roots if os.path.isabs(r))

    async def ticket(self, cls: type) -> Ticket | None:
        """The ticket a spawn of ``cls`` carries (None: the class does not travel; the target must
        have it installed). CodeError if it should travel and cannot (the script rule, the cap).
        The first one packs and stores the package, off the loop."""
        known = ticket_of(cls.__module__) or (self._made if cls.__module__ in SHIPPED else None)
        if known is not None and (cls.__module__ != "__main__" or cls.__qualname__ in self._checked):
            return known  # (each class of the script is checked against the rule once)
        if cls.__module__ != "__main__" and not self.travels(cls):
            return None  # (installed: nothing to make, no thread to wait for)
        return await asyncio.get_running_loop().run_in_executor(None, self.ticket_now, cls)

    def ticket_now(self, cls: type) -> Ticket | None:
        """``ticket`` for a caller that cannot wait (the codec writing an actor class into a call):
        the first one packs and stores the package on this thread."""
        loaded = ticket_of(cls.__module__)
        if loaded is not None:
            return loaded
        if not self.travels(cls):
            if cls.__module__ == "__main__":
                raise CodeError(
                    f"{cls.__qualname__} is defined in {'the script' if self._main else 'an interactive session or -c'}, "
                    "which is not shipped (lattica.init(code=...)): define it in a file the driver ships, "
                    "or install its module on the nodes and allow it there"
                )
            return None
        with self._making:
            if self._made is None:
                from lattica._code.package import pack  # (packing loads with the first class that travels)

                self._package = pack(self.roots, self._main, self.excludes, self.max_bytes)
                self._made = Ticket.issue(self._put(self._package.encode()), self._keypair, self._certificates)
            if cls.__module__ == "__main__":
                self._check_script_class(cls)
            SHIPPED[cls.__module__] = self._made
        return self._made

    def _check_script_class(self, cls: type) -> None:
        """CodeError (naming the line) if other nodes cannot define ``cls`` from the script."""
        if cls.__qualname__ in self._checked or self._package is None or self._package.main is None:
            return
        from lattica._code.script import check_class, filter_script  # (the parser loads with the first script class)

        main = self._package.main
        filtered = filter_script(self._package.files[main].decode("utf-8", "replace"), main)
        check_class(filtered, cls.__qualname__, main)
        self._checked.add(cls.__qualname__)


def script_root() -> tuple[str, str] | None:
    """``(directory, script path relative to it)`` for the script this process runs (``python
    train.py`` -> its directory; ``python -m pkg.train`` -> the directory ``pkg`` is in); None
    when there is no user script (an interactive session, ``-c``, or an installed command such as
    pytest, whose files live in the interpreter's prefix)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not path.endswith(".py"):
        return None
    path = os.path.realpath(path)
    spec = getattr(main, "__spec__", None)
    depth = spec.name.count(".") if spec is not None and spec.name and spec.name != "__main__" else 0
    root = os.path.dirname(path)
    for _ in range(depth):
        root = os.path.dirname(root)
    if _installed(root):
        return None
    return root, os.path.relpath(path, root).replace(os.sep, "/")


def _installed(path: str) -> bool:
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return any(path == p or path.startswith(p + os.sep) for p in prefixes) or "site-packages" in path.split(os.sep)


def _under(path: str, root: str) -> bool:
    return os.path.isabs(root) and (path == root or path.startswith(root.rstrip(os.sep) + os.sep))
