"""What the rules recognise in one parsed script: torch call names, rank variables, rank guards.

    facts = module_facts(tree)
    facts.qualname(call.func)   # "torch.nn.parallel.DistributedDataParallel" for DDP(...)
    facts.is_global_rank(expr)  # dist.get_rank(), int(os.environ["RANK"]) or a name set from them
    facts.main_only(node)       # True under `if rank == 0:` or after `if rank != 0: return`

Only one module is read: every simple assignment of a name anywhere in it counts as one of the
name's origins; calls into other files are not followed. Rules flag a name only when all of its
origins agree, which keeps false positives rare at the price of missing some mistakes.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

# Names tutorials use without showing the import; used only when the script binds none of them.
USUAL_ALIASES = {
    "torch": "torch",
    "dist": "torch.distributed",
    "nn": "torch.nn",
    "DDP": "torch.nn.parallel.DistributedDataParallel",
    "DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "DistributedSampler": "torch.utils.data.distributed.DistributedSampler",
    "DataLoader": "torch.utils.data.DataLoader",
    "SummaryWriter": "torch.utils.tensorboard.SummaryWriter",
}
MAIN_NAMES = {
    "is_main", "is_main_process", "main_process", "is_master", "master_process", "master",
    "is_master_process", "is_rank_zero", "is_rank0", "rank_zero", "rank0", "is_global_zero",
    "is_local_main_process", "is_world_process_zero", "is_local_process_zero",
}  # fmt: skip
RANK_ENV = {"RANK", "LOCAL_RANK"}
READ_ENV = ("os.environ.get", "os.getenv")


@dataclass(frozen=True, slots=True)
class LoopTarget:
    """The name is bound by ``for ... in iterable`` (``unpacked``: as part of a tuple the item
    is unpacked into; ``for i, (x, y) in enumerate(it)`` unpacks the item, ``for i, b in ...``
    does not)."""

    iterable: ast.expr
    unpacked: bool


@dataclass(frozen=True, slots=True)
class Opaque:
    """The name is bound in a way the rules do not follow (parameter, ``with``, unpacking)."""


Origin = ast.expr | LoopTarget | Opaque


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


def own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``scope`` without descending into nested functions, classes or lambdas."""
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, nested):
            stack.extend(ast.iter_child_nodes(node))


def _imports(tree: ast.Module) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


class ModuleFacts:
    """Imports, parents and name origins of one module, computed once per tree."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.aliases = _imports(tree)
        self.nodes: list[ast.AST] = [tree]
        """Every node, in ``ast.walk`` order (walked once, shared by the rules)."""
        self.parents: dict[ast.AST, ast.AST] = {}
        self.origins: dict[str, list[Origin]] = defaultdict(list)
        self._calls: list[tuple[ast.Call, str]] = []
        for node in self.nodes:  # grows as it goes: breadth first, as ast.walk
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
                self.nodes.append(child)
            self._collect(node)
            if isinstance(node, ast.Call):
                self._calls.append((node, self.qualname(node.func)))

    def _bind(self, target: ast.AST, origin: Origin) -> None:
        key = dotted(target)
        if key is not None:
            self.origins[key].append(origin)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._bind(element, origin)
        elif isinstance(target, ast.Starred):
            self._bind(target.value, Opaque())

    def _collect(self, node: ast.AST) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                if pairs and len(target.elts) == len(node.value.elts):  # type: ignore[attr-defined]
                    for t, v in zip(target.elts, node.value.elts, strict=True):  # type: ignore[attr-defined]
                        self._bind(t, v if dotted(t) else Opaque())
                else:
                    self._bind(target, node.value if dotted(target) else Opaque())
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            self._bind(node.target, node.value)
        elif isinstance(node, ast.AugAssign):
            self._bind(node.target, Opaque())
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            target = node.target
            counted = (
                isinstance(node.iter, ast.Call) and self.qualname(node.iter.func) == "enumerate"
            )
            if counted and isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == 2:
                # `for i, batch in enumerate(loader)`: a counter, then the whole item
                self._bind(target.elts[0], Opaque())
                target = target.elts[1]
            unpacked = isinstance(target, (ast.Tuple, ast.List))
            self._bind(target, LoopTarget(node.iter, unpacked))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            self._bind(node.optional_vars, Opaque())
        elif isinstance(node, ast.arg):
            self.origins[node.arg].append(Opaque())

    def qualname(self, node: ast.AST) -> str:
        """The dotted name with its first part resolved through the imports, or ``""``."""
        text = dotted(node)
        if text is None:
            return ""
        head, _, rest = text.partition(".")
        full = self.aliases.get(head) or USUAL_ALIASES.get(head, head)
        return f"{full}.{rest}" if rest else full

    def calls(self) -> Iterator[tuple[ast.Call, str]]:
        """Every call in the module with the qualified name of what it calls."""
        yield from self._calls

    def ancestors(self, node: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
        """(child, parent) pairs from ``node`` up to the module."""
        while node in self.parents:
            parent = self.parents[node]
            yield node, parent
            node = parent

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The innermost function (or the module) that ``node`` belongs to."""
        for _, parent in self.ancestors(node):
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return parent
        return self.tree

    def uses_distributed(self) -> bool:
        """The script imports torch.distributed or starts a process group."""
        imported = any(q.startswith("torch.distributed") for q in self.aliases.values())
        return imported or any(q.endswith("init_process_group") for _, q in self.calls())

    def is_global_rank(self, node: ast.AST) -> bool:
        """``node`` is this process's global rank: wrong as a device index on several nodes."""
        if self._reads_global_rank(node):
            return True
        key = dotted(node)
        origins = self.origins.get(key, []) if key else []
        return bool(origins) and all(
            isinstance(o, ast.expr) and self._reads_global_rank(o) for o in origins
        )

    def _reads_global_rank(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Call) and self.qualname(node.func) == "int" and node.args:
            node = node.args[0]
        if isinstance(node, ast.Call):
            return (
                self.qualname(node.func) == "torch.distributed.get_rank"
                or _env_key(self, node) == "RANK"
            )
        return _env_key(self, node) == "RANK"

    def is_rank_like(self, node: ast.AST) -> bool:
        """A rank of some kind: a ``*rank*`` name, ``get_rank()``, ``$RANK``/``$LOCAL_RANK``."""
        if isinstance(node, ast.Call) and self.qualname(node.func) == "int" and node.args:
            node = node.args[0]
        if isinstance(node, ast.Call):
            name = last_name(node.func)
            return name in ("get_rank", "get_local_rank", "get_global_rank") or (
                _env_key(self, node) in RANK_ENV
            )
        return "rank" in last_name(node).lower() or _env_key(self, node) in RANK_ENV

    def main_test(self, test: ast.AST) -> bool | None:
        """True: the test holds only on the main process; False: only off it; None: unknown."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self.main_test(test.operand)
            return None if inner is None else not inner
        if isinstance(test, ast.BoolOp):
            wanted = isinstance(test.op, ast.And)  # `rank == 0 and x`: still main only
            if any(self.main_test(v) is wanted for v in test.values):
                return wanted
            return None
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            return self._rank_comparison(test.left, test.ops[0], test.comparators[0])
        if isinstance(test, ast.Call):
            test = test.func
        return True if last_name(test) in MAIN_NAMES else None

    def _rank_comparison(self, left: ast.expr, op: ast.cmpop, right: ast.expr) -> bool | None:
        if isinstance(op, ast.In) and isinstance(right, (ast.List, ast.Tuple, ast.Set)):
            # `local_rank in [-1, 0]`: the main process, or a run without distributed
            values = [ast.literal_eval(e) if _is_number(e) else None for e in right.elts]
            main = 0 in values and all(v in (0, -1) for v in values)
            return True if main and self.is_rank_like(left) else None
        if is_const(left, 0):
            left, right = right, left
            op = {ast.Lt: ast.Gt(), ast.Gt: ast.Lt()}.get(type(op), op)
        if not (is_const(right, 0) and self.is_rank_like(left)):
            return None
        if isinstance(op, (ast.Eq, ast.Is)):
            return True
        return False if isinstance(op, (ast.NotEq, ast.Gt, ast.IsNot)) else None

    def main_only(self, node: ast.AST) -> bool:
        """``node`` runs on the main process only (under a rank test or after an early exit)."""
        for child, parent in self.ancestors(node):
            if isinstance(parent, (ast.If, ast.IfExp)):
                main = self.main_test(parent.test)
                in_body = (
                    child in parent.body if isinstance(parent, ast.If) else (child is parent.body)
                )
                guarded = (main is True and in_body) or (main is False and not in_body)
                if guarded and child is not parent.test:
                    return True
            for block in ("body", "orelse", "finalbody"):
                siblings: list[ast.AST] = getattr(parent, block, None) or []
                earlier = siblings[: siblings.index(child)] if child in siblings else []
                if any(self._exits_off_main(s) for s in earlier):
                    return True
        return False

    def _exits_off_main(self, stmt: ast.AST) -> bool:
        """``if rank != 0: return`` (or continue, break, raise): what follows is main only."""
        exits = (ast.Return, ast.Continue, ast.Break, ast.Raise)
        return (
            isinstance(stmt, ast.If)
            and not stmt.orelse
            and isinstance(stmt.body[-1], exits)
            and self.main_test(stmt.test) is False
        )


def _is_number(node: ast.expr) -> bool:
    """``0`` or ``-1``: a literal int, negated or not."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def _env_key(facts: ModuleFacts, node: ast.AST) -> str | None:
    """``"RANK"`` for ``os.environ["RANK"]``, ``os.environ.get("RANK")``, ``os.getenv("RANK")``."""
    key: ast.AST | None = None
    if isinstance(node, ast.Subscript) and facts.qualname(node.value) == "os.environ":
        key = node.slice
    elif isinstance(node, ast.Call) and node.args and facts.qualname(node.func) in READ_ENV:
        key = node.args[0]
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


@functools.lru_cache(maxsize=8)
def module_facts(tree: ast.Module) -> ModuleFacts:
    """The facts of ``tree``, shared by every rule that checks it."""
    return ModuleFacts(tree)
