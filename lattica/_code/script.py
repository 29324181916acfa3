"""The rule for a driver's script on other nodes: its imports and definitions run, nothing else.

``python train.py`` defines actor classes beside the statements that drive the job (``init``,
``.remote()``, ``get``). A node that runs one of those classes loads the script as a module of
its code package with only these top-level statements kept:

- ``import`` and ``from ... import``;
- ``def``, ``async def`` and ``class`` (with their decorators, defaults and bodies);
- assignments to the script's own names whose value (and annotation) calls nothing (``HIDDEN =
  64``, ``SIZES = (1, 2)``, ``Alias = Base``; not ``os.environ[k] = v``), docstrings, ``pass``;
- ``if`` and ``try`` blocks made only of such statements (``if TYPE_CHECKING:``, ``try: import
  x / except ImportError: x = None``).

Every other statement is left out (calls, loops, ``with``, ``if __name__ == "__main__":`` blocks),
and so is a kept kind that uses a name only a left-out statement binds. A definition runs as it
does on the driver: its decorators, default values and class body are evaluated (that is what
defining it means), so a decorator with side effects (``@atexit.register``) has them there too. ``check_class`` tells the
driver, before anything is sent, when a class uses such a name, naming the line.
"""

from __future__ import annotations

import ast
import symtable
from dataclasses import dataclass

from lattica.errors import CodeError

__all__ = ["Filtered", "filter_script", "check_class", "RULE"]

RULE = "other nodes run only a script's imports, definitions and assignments that call nothing (docs/api.md, 'Code that travels')"


@dataclass
class Filtered:
    """A script with its driving statements left out: ``kept`` runs on other nodes; ``left_out``
    maps each name that only a left-out statement binds to (line, source of that statement)."""

    kept: ast.Module
    left_out: dict[str, tuple[int, str]]
    source: str
    future_annotations: bool


def filter_script(source: str, filename: str) -> Filtered:
    """Split a script by the rule (CodeError if it does not parse)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as e:
        raise CodeError(f"{filename} line {e.lineno}: {e.msg}") from None
    future = any(
        isinstance(s, ast.ImportFrom) and s.module == "__future__" and any(a.name == "annotations" for a in s.names)
        for s in tree.body
    )
    left_out: dict[str, tuple[int, str]] = {}
    kept: list[ast.stmt] = []
    for stmt in tree.body:
        if _runs(stmt, left_out, future):
            kept.append(stmt)
            for name in _binds(stmt):
                left_out.pop(name, None)
        else:
            where = (stmt.lineno, _excerpt(source, stmt))
            for name in _binds(stmt):
                left_out[name] = where
    return Filtered(ast.Module(body=kept, type_ignores=[]), left_out, source, future)


def check_class(filtered: Filtered, qualname: str, filename: str) -> None:
    """CodeError naming the line, when the top-level class of ``qualname`` (or a function or class
    of the script it uses) needs a name that only a left-out statement binds, or when the class
    itself is defined where other nodes do not run it."""
    top = qualname.split(".")[0]
    defs = {
        s.name: s for s in filtered.kept.body if isinstance(s, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    }
    if top not in defs:
        where = filtered.left_out.get(top)
        at = f" (line {where[0]}: {where[1]})" if where else ""
        raise CodeError(
            f"{filename}: class {qualname} is defined where other nodes do not run it{at}; {RULE}. "
            "Define it at the top level of the script, or in a module the script imports."
        )
    tables = {t.get_name(): t for t in symtable.symtable(filtered.source, filename, "exec").get_children()}
    seen: set[str] = set()
    todo = [top]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        table = tables.get(name)
        uses = _globals_used(table) if table is not None else set()
        for used in sorted(uses):
            if used in filtered.left_out:
                line, text = filtered.left_out[used]
                via = "" if name == top else f" (through {name})"
                raise CodeError(
                    f"{filename} line {line} ({text}) is left out on other nodes, and {qualname} uses {used!r}{via}: {RULE}. "
                    f"Move it into the class (for example into __init__), or into a module the script imports."
                )
            if used in defs:
                todo.append(used)


def _globals_used(table: symtable.SymbolTable) -> set[str]:
    names = {s.get_name() for s in table.get_symbols() if s.is_referenced() and s.is_global()}
    for child in table.get_children():
        names |= _globals_used(child)
    return names


def _runs(stmt: ast.stmt, left_out: dict[str, tuple[int, str]], future: bool) -> bool:
    """Whether the rule keeps ``stmt`` (given the names left out before it)."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
        return True
    if isinstance(stmt, ast.Expr):
        return isinstance(stmt.value, ast.Constant)  # a docstring; any other expression is a call or idle
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return not (_load_time_names(stmt, future) & left_out.keys())
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) or type(stmt).__name__ == "TypeAlias":
        targets = getattr(stmt, "targets", None) or [getattr(stmt, "target", None)]
        if not all(_plain(t) for t in targets):
            return False  # (``os.environ[k] = v``, ``sys.path[:0] = ...``, ``mod.X = 1``: they change what is not the script's)
        parts = [p for p in (getattr(stmt, "value", None), getattr(stmt, "annotation", None)) if p is not None]
        return not any(_calls(p) for p in parts) and not (_names(parts + targets) & left_out.keys())
    if isinstance(stmt, ast.If):
        if _calls(stmt.test) or _names([stmt.test]) & left_out.keys():
            return False
        return _all_run(stmt.body + stmt.orelse, left_out, future)
    if isinstance(stmt, ast.Try):
        if any(h.type is not None and (_calls(h.type) or _names([h.type]) & left_out.keys()) for h in stmt.handlers):
            return False
        return _all_run(
            stmt.body + [s for h in stmt.handlers for s in h.body] + stmt.orelse + stmt.finalbody, left_out, future
        )
    return False


def _all_run(stmts: list[ast.stmt], left_out: dict[str, tuple[int, str]], future: bool) -> bool:
    return all(_runs(s, left_out, future) for s in stmts)


def _plain(target: ast.AST | None) -> bool:
    """A target that binds names of the script only (``X``, ``a, b``)."""
    if isinstance(target, ast.Name):
        return True
    return isinstance(target, (ast.Tuple, ast.List)) and all(_plain(t) for t in target.elts)


def _calls(node: ast.AST) -> bool:
    return any(isinstance(n, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom)) for n in ast.walk(node))


def _names(nodes: list[ast.AST]) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _load_time_names(stmt: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, future: bool) -> set[str]:
    """Names a definition evaluates when it runs: decorators, defaults, bases, annotations (unless
    postponed), and a class body's own statements (not its methods' bodies)."""
    parts: list[ast.AST] = list(stmt.decorator_list)
    if isinstance(stmt, ast.ClassDef):
        parts += stmt.bases + [k.value for k in stmt.keywords]
        for inner in stmt.body:
            if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                parts += [ast.Name(id=n, ctx=ast.Load()) for n in _load_time_names(inner, future)]
            else:
                parts.append(inner)
    else:
        parts += [d for d in stmt.args.defaults + stmt.args.kw_defaults if d is not None]
        if not future:
            args = (
                stmt.args.posonlyargs
                + stmt.args.args
                + stmt.args.kwonlyargs
                + [a for a in (stmt.args.vararg, stmt.args.kwarg) if a]
            )
            parts += [a.annotation for a in args if a.annotation is not None]
            if stmt.returns is not None:
                parts.append(stmt.returns)
    return _names(parts)


def _binds(stmt: ast.stmt) -> set[str]:
    """Top-level names a statement binds (the targets of its assignments, imports and defs)."""
    names: set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}  # (what a body binds inside is local to it)
    return names


def _excerpt(source: str, stmt: ast.stmt) -> str:
    text = (ast.get_source_segment(source, stmt) or "").splitlines()[0] if source else ""
    return text if len(text) <= 60 else text[:57] + "..."
