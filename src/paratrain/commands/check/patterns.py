"""What the rules know about one parsed script: names, values, functions and who calls them.

    facts = module_facts(tree)
    facts.qualname(call.func)   # "torch.nn.parallel.DistributedDataParallel" for DDP(...)
    facts.values(node)          # the expressions `node` may hold, followed through names
    facts.function_of(call)     # the FunctionDef a call runs (this file or a sibling module)
    facts.references(func)      # every place that calls or names that function
    facts.calls_within(loop)    # the calls of `loop` and of the functions it calls

Every assignment, walrus, loop target, tuple unpacking, ``setattr`` or parameter of a name is
one of its *origins*. A function's own variables take only the origins inside that function;
globals and attributes (``self.rank``, ``args.rank``, ``cfg.backend``: then a class field's
default) take those of the whole module. :meth:`ModuleFacts.values` follows origins through
aliases (``m = model``), parameters (to what every caller in the file passes), the file's own
functions and methods (to what they return), tuple returns by position and ``d["key"]`` items;
each question has a budget, past which the value is unknown. Rules flag a value only when all
of its origins agree, which keeps false positives rare at the price of missing some mistakes.

When a folder is checked, the scripts in one folder are *siblings*: ``from engine import
train_one_epoch`` or ``utils.is_main_process()`` resolve to the sibling's function.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from paratrain.commands.check.syntax import (
    dotted,
    env_key,
    has_star_kwargs,
    is_const,
    keyword,
    last_name,
    method,
    own_nodes,
)

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
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
SETUP_HELPERS = {
    "init_distributed_mode", "init_distributed", "setup_distributed", "ddp_setup", "setup_ddp",
    "init_dist", "setup_for_distributed",
}  # fmt: skip
__all__ = [
    "FUNCTIONS", "Element", "LoopTarget", "ModuleFacts", "Opaque", "Param", "dotted", "env_key",
    "has_star_kwargs", "is_const", "keyword", "last_name", "method", "module_facts", "own_nodes",
]  # fmt: skip
Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True, slots=True)
class LoopTarget:
    """The name is bound by ``for ... in iterable`` (``unpacked``: as part of a tuple the item
    is unpacked into; ``for i, (x, y) in enumerate(it)`` unpacks the item, ``for i, b in ...``
    does not; ``items``: the values of ``for k, v in d.items()``)."""

    iterable: ast.expr
    unpacked: bool
    items: bool = False


@dataclass(frozen=True, slots=True)
class Opaque:
    """The name is bound in a way the rules do not follow (``with``, ``+=``, unpacking)."""


@dataclass(frozen=True, slots=True)
class Param:
    """The name is a parameter of ``function``: its values are the arguments callers pass."""

    function: Function
    name: str
    index: int
    """Position among the positional parameters (``self`` counts), -1 for keyword-only."""


@dataclass(frozen=True, slots=True)
class Element:
    """The name is part ``index`` of ``source`` unpacked: ``image, target = batch``
    (``index`` -1: a starred part)."""

    source: ast.expr
    index: int = -1


Origin = ast.expr | LoopTarget | Opaque | Param | Element


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
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.ImportFrom) and node.level:  # `from . import dist_util`
            for a in node.names:
                aliases[a.asname or a.name] = a.name
    return aliases


class ModuleFacts:
    """Imports, parents, name origins and functions of one module, computed once per tree."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self._scopes: dict[int, ast.AST] = {}
        self.aliases = _imports(tree)
        self.siblings: dict[str, ModuleFacts] = {}
        """Modules of the same folder by name (``engine`` for engine.py), set by the engine."""
        self.nodes: list[ast.AST] = [tree]
        """Every node, in ``ast.walk`` order (walked once, shared by the rules)."""
        self.parents: dict[ast.AST, ast.AST] = {}
        self.origins: dict[str, list[Origin]] = defaultdict(list)
        self.fields: dict[str, list[Origin]] = defaultdict(list)
        """Class-level defaults by field name (dataclass configs: ``backend: str = "nccl"``)."""
        self.sites: dict[str, list[ast.AST]] = defaultdict(list)
        """The statements (or loops, parameters) that bind each name, in origin order."""
        self._site: ast.AST = tree
        self.functions: dict[str, list[Function]] = defaultdict(list)
        """Functions and methods of this module by name."""
        self._calls: list[tuple[ast.Call, str]] = []
        self._mentions: dict[str, list[ast.AST]] = defaultdict(list)
        for node in self.nodes:  # grows as it goes: breadth first, as ast.walk
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
                self.nodes.append(child)
            self._collect(node)
            if isinstance(node, ast.Call):
                self._calls.append((node, self.qualname(node.func)))
            elif isinstance(node, ast.Name):
                self._mentions[node.id].append(node)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                self._mentions["." + node.attr].append(node)
        self.memo: dict[object, object] = {}
        """What rules compute once per module and share (keyed by the rule's own names)."""
        self._values: dict[str, list[Origin]] = {}
        self._returns: dict[int, list[ast.expr | None]] = {}
        self._called: dict[int, list[Origin]] = {}
        self._resolving: set[str] = set()
        self._arguments: dict[tuple[int, str], list[ast.expr] | None] = {}
        self._budget = 0
        self._cuts = 0  # how many times following a value stopped short (results not cached)

    # -- bindings ------------------------------------------------------------------------
    def _bind(self, target: ast.AST, origin: Origin) -> None:
        key = dotted(target)
        if key is not None:
            self.origins[key].append(origin)
            self.sites[key].append(self._site)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._bind(element, origin)
        elif isinstance(target, ast.Starred):
            self._bind(target.value, Opaque())

    def _collect(self, node: ast.AST) -> None:
        self._site = node
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                if pairs and len(target.elts) == len(node.value.elts):  # type: ignore[attr-defined]
                    for t, v in zip(target.elts, node.value.elts, strict=True):  # type: ignore[attr-defined]
                        self._bind(t, v if dotted(t) else Opaque())
                elif isinstance(target, (ast.Tuple, ast.List)):
                    starred = any(isinstance(t, ast.Starred) for t in target.elts)
                    for i, t in enumerate(target.elts):
                        self._bind(t, Element(node.value, -1 if starred else i))
                else:
                    self._bind(target, node.value if dotted(target) else Opaque())
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            self._bind(node.target, node.value)
            if isinstance(self.parents.get(node), ast.ClassDef) and isinstance(
                node.target, ast.Name
            ):
                self.fields[node.target.id].append(node.value)
        elif isinstance(node, ast.AugAssign):
            self._bind(node.target, Opaque())
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            self._bind_loop(node)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) == 3
            and dotted(node.args[0]) is not None
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):  # `setattr(args, "rank", node_rank * ngpus + gpu)`
            owner = ast.Attribute(value=node.args[0], attr=node.args[1].value)
            self._bind(owner, node.args[2])
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            self._bind(node.optional_vars, Opaque())
        elif isinstance(node, FUNCTIONS):
            self.functions[node.name].append(node)
            self._bind_params(node)
        elif isinstance(node, ast.Lambda):
            for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
                self._bind_name(a.arg, Opaque())

    def _bind_loop(self, node: ast.For | ast.AsyncFor | ast.comprehension) -> None:
        target = node.target
        counted = isinstance(node.iter, ast.Call) and self.qualname(node.iter.func) == "enumerate"
        if counted and isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == 2:
            # `for i, batch in enumerate(loader)`: a counter, then the whole item
            self._bind(target.elts[0], Opaque())
            target = target.elts[1]
        if method(node.iter) == "items" and isinstance(target, (ast.Tuple, ast.List)):
            # `for k, v in batch.items()`: the values of a batch dict
            owner = node.iter.func.value  # type: ignore[attr-defined]
            if len(target.elts) == 2:
                self._bind(target.elts[0], Opaque())
                self._bind(target.elts[1], LoopTarget(owner, unpacked=True, items=True))
                return
        unpacked = isinstance(target, (ast.Tuple, ast.List))
        self._bind(target, LoopTarget(node.iter, unpacked))

    def _bind_params(self, func: Function) -> None:
        args = func.args
        positional = [*args.posonlyargs, *args.args]
        for i, a in enumerate(positional):
            self._bind_name(a.arg, Param(func, a.arg, i))
        for a in args.kwonlyargs:
            self._bind_name(a.arg, Param(func, a.arg, -1))
        for star in (args.vararg, args.kwarg):
            if star is not None:
                self._bind_name(star.arg, Opaque())

    def _bind_name(self, name: str, origin: Origin) -> None:
        """A parameter: bound in the function itself (its site is the function)."""
        self.origins[name].append(origin)
        self.sites[name].append(self._site)

    # -- names and calls -----------------------------------------------------------------
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
        known = self._scopes.get(id(node))
        if known is not None:
            return known
        found: ast.AST = self.tree
        for _, parent in self.ancestors(node):
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                found = parent
                break
        self._scopes[id(node)] = found  # nodes of this tree live as long as the facts
        return found

    def uses_distributed(self) -> bool:
        """The script imports torch.distributed or starts a process group (``pt.Run``, which
        joins the one ``paratrain run`` or torchrun set up, counts)."""
        imported = any(q.startswith("torch.distributed") for q in self.aliases.values())
        return imported or self.starts_group()

    @functools.cached_property
    def _starts_group(self) -> bool:
        return any(q.endswith("init_process_group") or q in PARATRAIN_RUNS for _, q in self.calls())

    def starts_group(self) -> bool:
        """``init_process_group`` is called in this script (or by a sibling's helper it calls,
        e.g. ``utils.init_distributed_mode(args)``)."""
        if self._starts_group:
            return True
        for call, _ in self.calls():
            found = self.function_of(call)
            if found is not None and found[0] is not self and found[0]._starts_group:
                return True
        return False

    @functools.cached_property
    def distributed(self) -> bool:
        """Several processes train: the script starts a process group, itself, through a
        sibling's helper, or through a helper of another module named for it
        (``utils.init_distributed_mode(args)``)."""
        if self.starts_group():
            return True
        return any(
            last_name(call.func) in SETUP_HELPERS and self.function_of(call) is None
            for call, _ in self.calls()
        )

    # -- functions -----------------------------------------------------------------------
    def function_of(self, call: ast.Call) -> tuple[ModuleFacts, Function] | None:
        """The function ``call`` runs, when this module or a sibling defines it: ``f(...)``,
        ``self.f(...)``, ``utils.f(...)`` or ``f`` imported from a sibling."""
        func = call.func
        if isinstance(func, ast.Name):
            own = self.functions.get(func.id)
            if own:
                return self, own[-1]
            imported = self.aliases.get(func.id, "")
            return self._sibling_function(imported)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id in ("self", "cls"):
                own = self.functions.get(func.attr)
                return (self, own[-1]) if own else None
            method_of = self._method_of_instance(func.value, func.attr)
            if method_of is not None:
                return self, method_of
            module = self.aliases.get(func.value.id)
            if module is not None:
                return self._sibling_function(f"{module}.{func.attr}")
        return None

    def _method_of_instance(self, owner: ast.expr, name: str) -> Function | None:
        """``trainer.fit`` with ``trainer = Trainer(...)``: the method of this module's class."""
        if not any(
            isinstance(self.parents.get(f), ast.ClassDef) for f in self.functions.get(name, [])
        ):
            return None  # no class here has such a method: nothing to follow
        classes = {
            v.func.id
            for v in self.values(owner)
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name)
        }
        for candidate in self.functions.get(name, []):
            parent = self.parents.get(candidate)
            if isinstance(parent, ast.ClassDef) and parent.name in classes:
                return candidate
        return None

    def _sibling_function(self, qualified: str) -> tuple[ModuleFacts, Function] | None:
        module, _, name = qualified.rpartition(".")
        sibling = self.siblings.get(module.rsplit(".", 1)[-1]) if module else None
        if sibling is None or sibling is self:
            return None
        found = sibling.functions.get(name)
        return (sibling, found[-1]) if found else None

    def calls_within(
        self, scope: ast.AST, depth: int = 2
    ) -> Iterator[tuple[ModuleFacts, ast.Call]]:
        """Every call in ``scope`` and in the functions of this module (or a sibling) it
        calls, ``depth`` calls deep, with the module each call is in."""
        seen: set[int] = set()
        stack: list[tuple[ModuleFacts, ast.AST, int]] = [(self, scope, 0)]
        while stack:
            owner, node, level = stack.pop()
            for call in ast.walk(node):
                if not isinstance(call, ast.Call) or id(call) in seen:
                    continue
                seen.add(id(call))
                yield owner, call
                found = owner.function_of(call) if level < depth else None
                if found is not None and id(found[1]) not in seen:
                    seen.add(id(found[1]))
                    stack.append((found[0], found[1], level + 1))

    def references(self, func: Function) -> list[ast.AST]:
        """Every ``f`` / ``self.f`` in this module naming ``func`` other than its definition:
        calls, and references passed on (``mp.spawn(f)``, ``Thread(target=f)``)."""
        owner = self.parents.get(func)
        if func.name == "__init__" and isinstance(owner, ast.ClassDef):  # Trainer(...)
            return [n for n in self._mentions.get(owner.name, []) if isinstance(n.ctx, ast.Load)]  # type: ignore[attr-defined]
        named = [n for n in self._mentions.get(func.name, []) if isinstance(n.ctx, ast.Load)]  # type: ignore[attr-defined]
        if isinstance(owner, ast.ClassDef):  # a method: self.f, trainer.f
            named += self._mentions.get("." + func.name, [])
        return named

    def returns(self, func: Function) -> list[ast.expr | None]:
        """The values ``func`` returns (None for a bare ``return`` or falling off the end)."""
        cached = self._returns.get(id(func))
        if cached is None:
            cached = [n.value for n in own_nodes(func) if isinstance(n, ast.Return)]
            last = func.body[-1] if func.body else None
            if not isinstance(last, (ast.Return, ast.Raise)):
                cached.append(None)
            self._returns[id(func)] = cached
        return cached

    def arguments(self, param: Param) -> list[ast.expr] | None:
        """What callers in this module pass for ``param``; None when a caller cannot be read
        (``f(*args)``, ``f(**kw)``, or ``f`` passed on as a value) or nobody calls it."""
        memo = self._arguments.get((id(param.function), param.name), False)
        if memo is not False:
            return memo  # type: ignore[return-value]
        found = self._arguments[(id(param.function), param.name)] = self._find_arguments(param)
        return found

    def _find_arguments(self, param: Param) -> list[ast.expr] | None:
        passed: list[ast.expr] = []
        func = param.function
        bound_method = isinstance(self.parents.get(func), ast.ClassDef)
        for ref in self.references(func):
            call = self.parents.get(ref)
            if not (isinstance(call, ast.Call) and call.func is ref):
                return None
            if any(isinstance(a, ast.Starred) for a in call.args) or has_star_kwargs(call):
                return None
            value = keyword(call, param.name)
            bound = isinstance(ref, ast.Attribute) or func.name == "__init__"
            index = param.index - (1 if bound_method and bound else 0)
            if value is None and 0 <= index < len(call.args):
                value = call.args[index]
            if value is None:
                defaults = _default(func, param)
                if defaults is None:
                    return None
                value = defaults
            passed.append(value)
        return passed or None

    # -- values --------------------------------------------------------------------------
    def values(self, node: ast.AST, depth: int = 0) -> list[Origin]:
        """What ``node`` may hold: itself when it is not a plain name; else its origins, each
        followed through aliases (``m = model``), parameters (to the callers' arguments) and
        calls of this module's functions (to their return values). An empty list: unknown."""
        key = dotted(node)
        if key is None:
            if isinstance(node, ast.Call) and depth < 4:
                if id(node) in self._called and node in self.parents:
                    return list(self._called[id(node)])  # a call of the tree (not a made-up one)
                found = self.function_of(node)
                if found is not None and found[0] is self:
                    rets = self.returns(found[1])
                    if rets and all(r is not None for r in rets):
                        cuts = self._cuts
                        returned = _capped(
                            [v for r in rets if r is not None for v in self.values(r, depth + 1)]
                        )
                        if cuts == self._cuts and node in self.parents:
                            self._called[id(node)] = list(returned)
                        return returned
            if isinstance(node, ast.Subscript) and depth < 4:
                items = self._items(node, depth)
                if items:
                    return items
            return [node] if isinstance(node, ast.expr) else []
        origins = self.origins.get(key) or (
            self.fields.get(key.rsplit(".", 1)[-1], []) if "." in key else []
        )  # `cfg.backend` never set here: the class field's default (`backend: str = "nccl"`)
        scope = self._local_scope(node, key)
        memo = key if scope is None else f"{key}@{id(scope)}"
        if scope is not None:  # a function's own variable: only what that function binds
            origins = [
                o for o, site in zip(origins, self.sites[key], strict=True)
                if self._site_scope(site, o) is scope
            ]  # fmt: skip
        if key in self.origins and isinstance(node, ast.Name) and node in self.parents:
            reaching = self._reaching(node, key)
            if len(reaching) < len(self.origins[key]):  # some are bound only after this use
                origins = [o for o in origins if any(o is r for r in reaching)]
                memo = f"{memo}@{node.lineno}:{node.col_offset}"
        cached = self._values.get(memo)
        if cached is not None:
            return list(cached)  # a copy: callers may extend what they get
        if memo in self._resolving:  # `x = f(x)`, or a method found through x's own value
            self._cuts += 1
            return []
        outermost = not self._resolving
        if outermost:
            self._budget = BUDGET  # each question asked from outside gets its own budget
        self._resolving.add(memo)
        cuts = self._cuts
        result: list[Origin] = []
        try:
            for origin in origins:
                result += self._follow(origin, depth)
        finally:
            self._resolving.discard(memo)
        result = _capped([r for r in result if not (isinstance(r, ast.expr) and dotted(r) == key)])
        if cuts == self._cuts or outermost:  # complete, or the answer to a question from outside
            self._values[memo] = list(result)
        return result

    def _reaching(self, node: ast.Name, key: str) -> list[Origin]:
        """The bindings of ``key`` that can reach the use ``node``: all but those made later in
        the same function (or at module level) with no loop around both, and the one whose own
        value holds the use (``model = DDP(model)``: the argument is the model before). So
        ``model_without_ddp = model`` before ``model = DDP(model)`` is the plain model. When
        none would be left, all of them (a use before any binding is left to the others)."""
        scope = self.scope_of(node)
        where = (node.lineno, node.col_offset)
        loops = {
            id(parent)
            for _, parent in self.ancestors(node)
            if isinstance(parent, (ast.For, ast.AsyncFor, ast.While))
        }
        kept: list[Origin] = []
        for origin, site in zip(self.origins[key], self.sites[key], strict=True):
            if isinstance(origin, Param) or self._site_scope(site, origin) is not scope:
                kept.append(origin)
                continue
            if isinstance(site, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                value = site.value
                if value is not None and any(n is node for n in ast.walk(value)):
                    continue  # the use is in the binding's own value: it sees the one before
            later = (getattr(site, "lineno", 0), getattr(site, "col_offset", 0)) > where
            if later and not any(id(p) in loops for _, p in self.ancestors(site)):
                continue
            kept.append(origin)
        return kept or list(self.origins[key])

    def _local_scope(self, node: ast.AST, key: str) -> ast.AST | None:
        """The function ``node`` (a plain name) is a local variable of, or None (a global,
        an attribute, a name asked about from outside the tree)."""
        if not isinstance(node, ast.Name) or node not in self.parents:
            return None
        scope = self.scope_of(node)
        if scope is self.tree:
            return None
        for origin, site in zip(self.origins.get(key, []), self.sites[key], strict=True):
            if self._site_scope(site, origin) is scope:
                return scope
        return None

    def _site_scope(self, site: ast.AST, origin: Origin) -> ast.AST:
        """The function a binding belongs to (a parameter's is its own function)."""
        if isinstance(origin, (Param, Opaque)) and isinstance(
            site, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        ):
            return site
        return self.scope_of(site)

    def _items(self, node: ast.Subscript, depth: int) -> list[Origin]:
        """``d["acc"]`` with ``d = {"acc": correct / total}`` (or a comprehension's item:
        ``{k: torch.tensor(v) for ...}[key]``)."""
        found: list[Origin] = []
        for whole in self.values(node.value, depth + 1):
            if isinstance(whole, ast.Dict) and isinstance(node.slice, ast.Constant):
                matched = [
                    v
                    for k, v in zip(whole.keys, whole.values, strict=True)
                    if isinstance(k, ast.Constant) and k.value == node.slice.value
                ]
                if not matched:
                    return []
                found += [x for v in matched for x in self.values(v, depth + 1)]
            elif isinstance(whole, ast.DictComp):
                found += self.values(whole.value, depth + 1)
            elif isinstance(whole, (ast.ListComp, ast.GeneratorExp)):
                found += self.values(whole.elt, depth + 1)
            else:
                return []
        return found

    def _follow(self, origin: Origin, depth: int) -> list[Origin]:
        self._budget -= 1
        if self._budget < 0:  # a name with too many ways to be set: unknown
            self._cuts += 1
            return [Opaque()]
        if depth >= 4:
            self._cuts += 1
            return [origin]
        if isinstance(origin, Param):
            passed = self.arguments(origin)
            if passed is None:
                return [Opaque()]
            return [v for a in passed for v in self.values(a, depth + 1) or [a]]
        if isinstance(origin, Element) and origin.index >= 0:
            # `rank, world = get_dist_info()` with `return dist.get_rank(), ...`
            parts: list[Origin] = []
            for whole in self.values(origin.source, depth + 1) or [origin.source]:
                if isinstance(whole, (ast.Tuple, ast.List)) and origin.index < len(whole.elts):
                    part = whole.elts[origin.index]
                    parts += self.values(part, depth + 1) or [part]
                else:
                    return [origin]
            return parts
        if isinstance(origin, ast.expr) and (
            dotted(origin) is not None or isinstance(origin, ast.Call)
        ):
            followed = self.values(origin, depth + 1)
            return followed or [origin]
        return [origin]

    def values_of(self, key: str) -> list[Origin]:
        """:meth:`values` of the name ``key`` (``"model"``, ``"self.model"``)."""
        node = ast.parse(key, mode="eval").body
        return self.values(node)


FALLBACK_ERRORS = {"AttributeError", "ImportError", "ModuleNotFoundError", "TypeError"}


def old_torch_branch(facts: ModuleFacts, node: ast.AST) -> bool:
    """``node`` runs only where the new API is missing: in ``except AttributeError:`` (or
    ImportError, TypeError) after a try of it, in the ``else`` of an ``if hasattr(...)``, or in
    a branch of a torch version test."""
    for child, parent in facts.ancestors(node):
        if isinstance(parent, ast.ExceptHandler):
            caught = parent.type
            errors = caught.elts if isinstance(caught, ast.Tuple) else [caught] if caught else []
            names = [dotted(e) for e in errors]
            if any((n or "").rsplit(".", 1)[-1] in FALLBACK_ERRORS for n in names):
                return True
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
            in_else = (
                child in parent.orelse if isinstance(parent, ast.If) else child is parent.orelse
            )
            names = [
                n.id if isinstance(n, ast.Name) else n.attr
                for n in ast.walk(parent.test)
                if isinstance(n, (ast.Name, ast.Attribute))
            ]
            words = {w for name in names for w in (name or "").lower().split("_")}
            if "version" in words or (in_else and "hasattr" in names):
                return True  # `torch.__version__`, `TORCH_VERSION`; not `force_conversion`
    return False


PARATRAIN_RUNS = {"paratrain.Run", "paratrain.launch", "paratrain.runtime.run.Run"}
"""A paratrain script: ``paratrain run --nproc N`` starts it on N ranks, like torchrun."""

BUDGET = 2000
"""Origins followed at most for one question: beyond that a value is unknown."""


def _capped(values: list[Origin], most: int = 128) -> list[Origin]:
    """At most ``most`` values; beyond that the value is unknown (a rule needs all of them)."""
    return values if len(values) <= most else [*values[:most], Opaque()]


def _default(func: Function, param: Param) -> ast.expr | None:
    args = func.args
    if param.index < 0:
        names = [a.arg for a in args.kwonlyargs]
        at = names.index(param.name) if param.name in names else -1
        return args.kw_defaults[at] if at >= 0 else None
    positional = [*args.posonlyargs, *args.args]
    first_default = len(positional) - len(args.defaults)
    if param.index >= first_default:
        return args.defaults[param.index - first_default]
    return None


@functools.lru_cache(maxsize=1024)
def module_facts(tree: ast.Module) -> ModuleFacts:
    """The facts of ``tree``, shared by every rule that checks it."""
    return ModuleFacts(tree)
