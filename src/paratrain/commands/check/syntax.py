"""Small readers of Python syntax shared by the rules: dotted names, keywords, literals.

dotted(node)          # "self.model.module" for that chain of attributes, else None
keyword(call, "dim")  # the value passed as dim=..., or None
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import Protocol


class Qualifies(Protocol):
    def qualname(self, node: ast.AST) -> str: ...


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def last_name(node: ast.AST) -> str:
    """The last component of a dotted name (``rank`` for ``self.rank``), or ``""``."""
    text = dotted(node)
    return text.rsplit(".", 1)[-1] if text else ""


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    """The value of keyword argument ``name`` of ``call``, or None."""
    return next((k.value for k in call.keywords if k.arg == name), None)


def has_star_kwargs(call: ast.Call) -> bool:
    """``f(**options)``: any keyword may be inside."""
    return any(k.arg is None for k in call.keywords)


def is_const(node: ast.AST | None, value: object) -> bool:
    """``node`` is the literal ``value`` (``True`` is not ``1``)."""
    return (
        isinstance(node, ast.Constant) and type(node.value) is type(value) and node.value == value
    )


def method(call: ast.AST) -> str:
    """``"step"`` for ``opt.step()``; ``""`` for a call of a plain name (or not a call)."""
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
        return call.func.attr
    return ""


def own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``scope`` without descending into nested functions, classes or lambdas."""
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, nested):
            stack.extend(ast.iter_child_nodes(node))


def env_key(facts: Qualifies, node: ast.AST) -> str | None:
    """``"RANK"`` for ``os.environ["RANK"]``, ``os.environ.get("RANK")``, ``os.getenv("RANK")``."""
    key: ast.AST | None = None
    if isinstance(node, ast.Subscript) and facts.qualname(node.value) == "os.environ":
        key = node.slice
    elif (
        isinstance(node, ast.Call)
        and node.args
        and facts.qualname(node.func) in ("os.environ.get", "os.getenv")
    ):
        key = node.args[0]
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
