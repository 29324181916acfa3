"""Code packages imported in namespaces of their own, so two drivers' ``myapp`` never collide.

A package's modules live under a private top-level name (``_lattica_code_<hash>.myapp``). Inside
them, an import of a name the package provides (``import myapp``, ``from train import Shard``)
resolves within the package, through an ``__import__`` of their own builtins; every other import
(``numpy``, ``lattica``) is the node's. The driver's script is loaded by the rule of
``lattica._code.script``. Tracebacks show the package's source lines. A namespace is removed from
``sys.modules`` when ``unload`` is called (the spawner does when no actor uses it any more).
"""

from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import traceback
import types
from typing import Any

from lattica._code.package import CodePackage
from lattica._code.script import filter_script
from lattica._code.tickets import LOADED, NAMESPACE_PREFIX, Ticket
from lattica.errors import CodeError, SpawnError

__all__ = ["Namespace"]

_real_import = builtins.__import__
_LOCK = threading.Lock()  # imports run on actor threads too


class Namespace(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    """One loaded package: a finder and loader for the modules under its private prefix."""

    def __init__(self, ticket: Ticket, package: CodePackage) -> None:
        self.ticket = ticket
        self.package = package
        self.prefix = NAMESPACE_PREFIX + "".join(c for c in ticket.cid if c.isalnum())[-24:]  # (a CID ends in its hash)
        self.tops = package.modules()
        self.label = f"lattica-code/{ticket.cid[-12:]}"
        self.users = 0
        self._builtins = dict(vars(builtins), __import__=self._import)

    # -- life -------------------------------------------------------------------------------------

    def install(self) -> None:
        with _LOCK:
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)
            LOADED[self.prefix] = self.ticket
            if self.prefix not in sys.modules:
                root = types.ModuleType(self.prefix, f"code package {self.ticket.cid}")
                root.__path__ = []
                root.__spec__ = importlib.machinery.ModuleSpec(self.prefix, self, is_package=True)
                sys.modules[self.prefix] = root

    def unload(self) -> None:
        with _LOCK:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            LOADED.pop(self.prefix, None)
            for name in [n for n in sys.modules if n == self.prefix or n.startswith(self.prefix + ".")]:
                del sys.modules[name]

    def actor_class(self, path: str) -> type:
        """The ``@lattica.actor`` class at ``module.Class`` in this package (CodeError with the
        package's traceback if importing its module raises)."""
        module, _, name = path.rpartition(".")
        if module.partition(".")[0] not in self.tops:
            raise SpawnError(
                f"the code package {self.ticket.cid} has no module {module!r} (it holds {sorted(self.tops)})"
            )
        try:
            obj = getattr(importlib.import_module(f"{self.prefix}.{module}"), name)
        except AttributeError:
            raise SpawnError(
                f"{module} in the code package {self.ticket.cid} defines no {name!r} (or the rule left it out: {self.package.main})"
            ) from None
        except CodeError:
            raise
        except Exception as e:  # the package's own code raised on import: the caller gets its traceback
            tb = "".join(traceback.format_exception(e)[1:])
            raise CodeError(
                f"importing {module} from the code package {self.ticket.cid} raised {type(e).__name__}: {e}\n{tb}".rstrip()
            ) from None
        cls = getattr(obj, "_lattica_cls", None)
        if not isinstance(cls, type) or type(obj).__name__ != "ActorClass":
            raise SpawnError(f"{path!r} is not a @lattica.actor class")
        return cls

    # -- importlib -----------------------------------------------------------------------------

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self.prefix + "."):
            return None
        found = self._file(fullname)
        if found is None:
            return None
        rel, is_package = found
        spec = importlib.machinery.ModuleSpec(
            fullname, self, origin=f"{self.label}/{rel}" if rel else None, is_package=is_package
        )
        spec.has_location = rel is not None
        return spec

    def _file(self, fullname: str) -> tuple[str | None, bool] | None:
        """(package path of the module's source, whether it is a package) or None."""
        rel = fullname[len(self.prefix) + 1 :].replace(".", "/")
        files = self.package.files
        if rel + ".py" in files:
            return rel + ".py", False
        if rel + "/__init__.py" in files:
            return rel + "/__init__.py", True
        if any(p.startswith(rel + "/") for p in files):
            return None, True  # a directory without __init__.py: a namespace package
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__["__builtins__"] = self._builtins
        code = self.get_code(module.__name__)
        if code is not None:
            module.__file__ = module.__spec__.origin if module.__spec__ is not None else None
            exec(code, module.__dict__)

    def get_source(self, fullname: str) -> str | None:
        found = self._file(fullname)
        if found is None or found[0] is None:
            return None
        return self.package.files[found[0]].decode("utf-8", "replace")

    def get_code(self, fullname: str) -> types.CodeType | None:
        found = self._file(fullname)
        if found is None or found[0] is None:
            return None
        rel = found[0]
        source = self.package.files[rel].decode("utf-8", "replace")
        filename = f"{self.label}/{rel}"
        if rel == self.package.main:
            tree: Any = filter_script(source, filename).kept  # the driver's script: its definitions only
        else:
            tree = source
        return compile(tree, filename, "exec", dont_inherit=True)

    def is_package(self, fullname: str) -> bool:
        found = self._file(fullname)
        return found is not None and found[1]

    def _import(self, name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        """``__import__`` for the package's modules: its own top-level names resolve inside it."""
        if level == 0:
            top = name.partition(".")[0]
            if top in self.tops:
                module = _real_import(f"{self.prefix}.{name}", globals, locals, fromlist, 0)
                return module if fromlist else sys.modules[f"{self.prefix}.{top}"]
        return _real_import(name, globals, locals, fromlist, level)
