"""Rules about saving and loading: files that load back anywhere, onto the right device.

PT006 the state dict of a DDP/DataParallel wrapper (``module.`` keys); PT007 a whole pickled
module; PT008 ``torch.load`` without ``weights_only=True``; PT009 ``torch.load`` without
``map_location`` in a distributed script.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from paratrain.commands.check.findings import Finding, rule
from paratrain.commands.check.guards import guards_of
from paratrain.commands.check.patterns import (
    LoopTarget,
    ModuleFacts,
    dotted,
    has_star_kwargs,
    is_const,
    keyword,
    last_name,
    module_facts,
    old_torch_branch,
)

WRAPPERS = ("DistributedDataParallel", ".DataParallel", "FullyShardedDataParallel")
SELF_RETURNING = {"to", "cuda", "cpu", "train", "eval", "half", "float", "double", "bfloat16"}
NOT_MODULES = {"Parameter", "Buffer"}
DDP_DP = ("DistributedDataParallel", ".DataParallel")  # FSDP's full state dict has plain keys
MODULE_METHODS = {"parameters", "named_parameters", "train", "eval", "modules", "children"}
TYPE_TESTS = ("isinstance", "hasattr")


SAVE_HELPERS = ("save_on_master", "save_on_main", "save_on_rank0", "save_on_rank_zero")
"""DeiT/DINO/MAE/DETR's ``utils.save_on_master(obj, path)``: torch.save on the main process."""


def _forwards_to_save(facts: ModuleFacts, call: ast.Call) -> bool:
    """``call`` runs a save helper: one named so, or a function of this module or a sibling
    that hands its own arguments on to ``torch.save`` (``torch.save(*args, **kwargs)``)."""
    name = last_name(call.func)
    if name in SAVE_HELPERS:
        return True
    if name not in _forwarders(facts):
        return False
    found = facts.function_of(call)
    if found is None:
        return False
    owner, func = found
    params = {a.arg for a in [*func.args.posonlyargs, *func.args.args]}
    star = func.args.vararg.arg if func.args.vararg else None
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and owner.qualname(node.func) == "torch.save" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Starred) and dotted(first.value) == star:
                return True
            if isinstance(first, ast.Name) and first.id in params - {"self"}:
                return True
    return False


def _forwarders(facts: ModuleFacts) -> set[str]:
    """Names of the functions of this module and its siblings that call ``torch.save`` with
    a name as their first argument (candidates for :func:`_forwards_to_save`)."""
    return set().union(*(_own_forwarders(owner) for owner in (facts, *facts.siblings.values())))


def _own_forwarders(owner: ModuleFacts) -> set[str]:
    cached = owner.memo.get("save forwarders")
    if cached is None:
        names: set[str] = set()
        for call, qual in owner.calls():
            first = call.args[0] if call.args else None
            if qual == "torch.save" and isinstance(first, (ast.Name, ast.Starred)):
                scope = owner.scope_of(call)
                if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(scope.name)
        owner.memo["save forwarders"] = cached = names
    return cached  # type: ignore[return-value]


def _saves(facts: ModuleFacts) -> Iterator[ast.Call]:
    """``torch.save(obj, f)`` calls, written with ``obj`` first (``obj=`` moved there), and
    calls of helpers that hand their arguments on to it (``utils.save_on_master(obj, f)``)."""
    for call, qual in facts.calls():
        if qual != "torch.save":
            plain = call.args and not isinstance(call.args[0], ast.Starred)
            if plain and _forwards_to_save(facts, call):
                yield call
            continue
        if call.args:
            yield call
        elif (obj := keyword(call, "obj")) is not None:
            rest = [k for k in call.keywords if k.arg != "obj"]
            yield ast.copy_location(ast.Call(func=call.func, args=[obj], keywords=rest), call)


def _is_wrapper(facts: ModuleFacts, origin: object, wrappers: tuple[str, ...] = WRAPPERS) -> bool:
    return isinstance(origin, ast.Call) and facts.qualname(origin.func).endswith(wrappers)


def _type_tested(facts: ModuleFacts, node: ast.AST, key: str) -> bool:
    """Under ``if isinstance(model, ...)`` / ``hasattr(model, "module")``: the author checked."""
    for _, parent in facts.ancestors(node):
        if isinstance(parent, (ast.If, ast.IfExp)):
            for call in ast.walk(parent.test):
                if not (isinstance(call, ast.Call) and call.args):
                    continue
                if dotted(call.func) in TYPE_TESTS and dotted(call.args[0]) == key:
                    return True
    return False


@rule("PT006", "wrapped-state-dict", "the state dict of a DDP/DataParallel wrapper is saved")
def wrapped_state_dict(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``torch.save(model.state_dict(), path)`` where ``model = DDP(model)``.

    Every key then starts with ``module.``; loading the file into the plain model fails with
    "Unexpected key(s) in state_dict: module.…".
    """
    facts = module_facts(tree)
    reported: set[int] = set()
    for save in _saves(facts):
        for node in _saved_parts(facts, save.args[0]):
            func = node.func if isinstance(node, ast.Call) else None
            if not (isinstance(func, ast.Attribute) and func.attr == "state_dict"):
                continue
            key = dotted(func.value)
            owners = _owners(facts, func.value)
            wrapped = key is not None and any(_is_wrapper(facts, o, DDP_DP) for o in owners)
            if not wrapped or id(node) in reported or _type_tested(facts, save, key or ""):
                continue
            reported.add(id(node))
            yield Finding.at(
                "PT006",
                node,
                message=f"`{key}` is a DDP/DataParallel wrapper: every saved key starts "
                "with `module.` and load_state_dict on the plain model fails "
                "(Unexpected key(s) in state_dict)",
                fix=f"save the wrapped model's own weights, {key}.module.state_dict(), and load "
                f"such files into the plain model ({key}.module.load_state_dict(...)): change the "
                "script's resume together with the save",
                api="run.save_weights(model, path)",
            )


def _owners(facts: ModuleFacts, node: ast.expr) -> list[object]:
    """What ``node`` may be, also as an item of a collection: ``obj`` of
    ``for name, obj in components.items()`` with ``components = {"G": netG, ...}``."""
    found: list[object] = []
    for value in facts.values(node):
        if isinstance(value, LoopTarget):
            for whole in facts.values(value.iterable) or [value.iterable]:
                items = whole.values if isinstance(whole, ast.Dict) else (
                    whole.elts if isinstance(whole, (ast.List, ast.Tuple)) else []
                )  # fmt: skip
                for item in items:
                    found += facts.values(item) or [item]
        else:
            found.append(value)
    return found


def _saved_parts(facts: ModuleFacts, saved: ast.expr) -> Iterator[ast.AST]:
    """Every node of what is saved, following names to what they were set from, three names
    deep (``sd = model.state_dict(); torch.save(sd, p)``, ``ckpt = {"model": sd}``); each
    expression once."""
    seen: set[int] = set()
    todo: list[tuple[ast.expr, int]] = [(saved, 0)]
    while todo:
        expr, depth = todo.pop()
        if id(expr) in seen:
            continue
        seen.add(id(expr))
        for node in ast.walk(expr):
            yield node
            if depth >= 3 or not isinstance(node, (ast.Name, ast.Attribute)) or not dotted(node):
                continue
            parent = facts.parents.get(node)
            if isinstance(parent, ast.Attribute) or (
                isinstance(parent, ast.Call) and parent.func is node
            ):
                continue
            for value in facts.values(node):
                if isinstance(value, ast.expr) and value is not node:
                    todo.append((value, depth + 1))


def _module_classes(facts: ModuleFacts) -> set[str]:
    """Classes of this file that derive from nn.Module (directly or through each other)."""
    found: set[str] = set()
    classes = [n for n in facts.nodes if isinstance(n, ast.ClassDef)]
    grew = True
    while grew:
        grew = False
        for cls in classes:
            bases = {facts.qualname(b) for b in cls.bases}
            if cls.name not in found and (
                "torch.nn.Module" in bases or "torch.nn.modules.module.Module" in bases
                or bases & found
            ):  # fmt: skip
                found.add(cls.name)
                grew = True
    return found


def _unchained(call: ast.Call) -> ast.Call:
    """``Net().to(device).train()`` -> ``Net()``: these methods return the module itself."""
    func = call.func
    while isinstance(func, ast.Attribute) and func.attr in SELF_RETURNING:
        if not isinstance(func.value, ast.Call):
            break
        call = func.value
        func = call.func
    return call


def _makes_module(facts: ModuleFacts, call: ast.Call, classes: set[str]) -> bool:
    call = _unchained(call)
    qual = facts.qualname(call.func)
    last = qual.rsplit(".", 1)[-1]
    if qual in classes or qual.startswith("torchvision.models."):
        return True
    layer = qual.startswith("torch.nn.") and not qual.startswith("torch.nn.functional")
    return layer and last[:1].isupper() and last not in NOT_MODULES


def _module_like(facts: ModuleFacts, origin: object, key: str | None, classes: set[str]) -> bool:
    """``origin`` gives a module: a constructor, a wrapper, or ``key.to(...)`` of itself."""
    if not isinstance(origin, ast.Call):
        return False
    origin = _unchained(origin)
    func = origin.func
    if isinstance(func, ast.Attribute) and func.attr in SELF_RETURNING:
        return dotted(func.value) == key
    return _makes_module(facts, origin, classes) or _is_wrapper(facts, origin)


def _wrapped_module(facts: ModuleFacts, node: ast.expr) -> bool:
    """``ddp_model.module`` (or a name set to it): the model inside a DDP/DataParallel
    wrapper."""
    node = _copied(_unchained_expr(node))
    candidates = [node, *facts.values(node)] if dotted(node) else [node]
    for c in candidates:
        if (
            isinstance(c, ast.Call)
            and dotted(c.func) == "getattr"
            and len(c.args) >= 2
            and is_const(c.args[1], "module")
        ):
            c = ast.Attribute(value=c.args[0], attr="module")  # getattr(model, "module", model)
        if (
            isinstance(c, ast.Attribute)
            and c.attr == "module"
            and any(_is_wrapper(facts, o) for o in facts.values(c.value))
        ):
            return True
    return False


def _unchained_expr(node: ast.expr) -> ast.expr:
    """``net.module.cpu().eval()`` -> ``net.module`` (these methods return the module)."""
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in SELF_RETURNING
    ):
        node = node.func.value
    return node


def _copied(node: ast.expr) -> ast.expr:
    """``copy.deepcopy(x)`` -> ``x`` (a copy of a module is a module)."""
    if isinstance(node, ast.Call) and last_name(node.func) == "deepcopy" and node.args:
        return _unchained_expr(node.args[0])
    return node


def _used_as_module(facts: ModuleFacts, key: str) -> bool:
    """``key.parameters()``, ``key.train()``, ``DDP(key)``: only a module is used so."""
    for call, qual in facts.calls():
        owner = call.func.value if isinstance(call.func, ast.Attribute) else None
        if owner is not None and call.func.attr in MODULE_METHODS and dotted(owner) == key:  # type: ignore[attr-defined]
            return True
        if qual.endswith(WRAPPERS) and call.args and dotted(call.args[0]) == key:
            return True
    return False


def _built_elsewhere(facts: ModuleFacts, origin: object) -> bool:
    """``Net(...)`` / ``GPT.from_pretrained(...)`` of a class imported from outside torch (the
    project's own ``models`` module, a model library)."""
    if not isinstance(origin, ast.Call):
        return False
    func = _unchained(origin).func
    if isinstance(func, ast.Attribute) and func.attr.startswith("from_"):
        func = func.value
    qual = facts.qualname(func)
    head = dotted(func) or ""
    return (
        head.split(".")[0] in facts.aliases
        and not qual.startswith("torch.")
        and qual.rsplit(".", 1)[-1][:1].isupper()
    )


def _whole_module(facts: ModuleFacts, saved: ast.expr, classes: set[str]) -> bool:
    key = dotted(saved)
    origins = facts.values(saved) if key else []
    if not origins:
        return _unbound_model(facts, saved)
    made = [o for o in origins if isinstance(o, ast.Call) and _makes_module(facts, o, classes)]
    if made and all(_module_like(facts, o, key, classes) for o in origins):
        return True
    used = key is not None and _used_as_module(facts, key)
    return used and all(
        _built_elsewhere(facts, o) or _module_like(facts, o, key, classes) for o in origins
    )


def _unbound_model(facts: ModuleFacts, node: ast.expr) -> bool:
    """A ``model`` (``*model``) name the file never binds nor imports: a tutorial's fragment."""
    if not (isinstance(node, ast.Name) and node.id.lower().endswith("model")):
        return False
    imports = [n for n in facts.nodes if isinstance(n, ast.ImportFrom)]
    star = any(a.name == "*" for n in imports for a in n.names)  # could bind anything
    return node.id not in facts.aliases and not star


@rule("PT007", "pickled-module", "a whole nn.Module is saved with torch.save (pickled code)")
def pickled_module(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``torch.save(model, path)`` with ``model = MyModel()`` (or a ``model`` never bound here).

    The file pickles the class by its import path: it loads only where the same code sits at the
    same module path, and torch >= 2.6 refuses it by default (``weights_only=True``).
    """
    facts = module_facts(tree)
    classes = _module_classes(facts)
    for save in _saves(facts):
        saved = save.args[0]
        parts = saved.values if isinstance(saved, ast.Dict) else [saved]  # {"model": net, ...}
        module = next(
            (p for p in parts if p is not None and (
                _wrapped_module(facts, p) or _whole_module(facts, p, classes)
            )),
            None,
        )  # fmt: skip
        if module is None:
            continue
        key = dotted(module) or ast.unparse(module)
        yield Finding.at(
            "PT007",
            save,
            message=f"`{key}` is a whole nn.Module: the file pickles its class by import "
            "path, loads only next to the same code, and torch >= 2.6 refuses it by default",
            fix=f"torch.save({key}.state_dict(), path) and load with "
            "model.load_state_dict(torch.load(path, weights_only=True))",
            api="run.save_weights(model, path)",
        )


def _loads(facts: ModuleFacts) -> Iterator[ast.Call]:
    """``torch.load(...)`` calls, and ``functools.partial(torch.load, ...)`` (with the keywords
    its calls add: ``load_cpu = partial(torch.load, map_location="cpu"); load_cpu(p)``)."""
    for call, qual in facts.calls():
        if qual == "torch.load" and not has_star_kwargs(call):
            yield call
        elif (
            qual.endswith("partial")
            and call.args
            and facts.qualname(call.args[0]) == "torch.load"
            and not has_star_kwargs(call)
        ):
            parent = facts.parents.get(call)
            names = [dotted(t) for t in getattr(parent, "targets", [])] if parent else []
            added = [
                k
                for c, _ in facts.calls()
                if dotted(c.func) in names and c.func is not call
                for k in c.keywords
            ]
            yield ast.Call(
                func=call.args[0], args=call.args[1:], keywords=[*call.keywords, *added],
                lineno=call.lineno, col_offset=call.col_offset,
            )  # fmt: skip


@rule("PT008", "load-unsafe", "torch.load without weights_only=True")
def load_unsafe(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``torch.load(path)``: what it unpickles depends on the torch version.

    Before torch 2.6 it unpickles anything, so a checkpoint can run code; from 2.6 on the same
    line refuses files holding anything but tensors and plain containers. An explicit
    ``weights_only=False`` is a decision and is not flagged.
    """
    facts = module_facts(tree)
    allowed = any(q.endswith("add_safe_globals") for _, q in facts.calls())
    for call in _loads(facts):
        if keyword(call, "weights_only") is not None or allowed or _safe_globals(facts, call):
            continue
        if not old_torch_branch(facts, call):  # `except TypeError:` where weights_only is new
            yield Finding.at(
                "PT008",
                call,
                message="torch.load without weights_only: before torch 2.6 it unpickles any "
                "object (a file can run code), from 2.6 on the same line refuses such files",
                fix="torch.load(path, map_location=..., weights_only=True); a checkpoint that "
                "also holds other objects (an argparse.Namespace of the run's arguments) loads "
                "with them allowed: torch.serialization.add_safe_globals([argparse.Namespace]) "
                "first, or weights_only=False for a file you trust",
                api="run.resume() (restores model, optimizer and loop state)",
            )


def _safe_globals(facts: ModuleFacts, call: ast.Call) -> bool:
    """Inside ``with torch.serialization.safe_globals([...]):``: a weights-only load is meant."""
    for _, parent in facts.ancestors(call):
        if isinstance(parent, (ast.With, ast.AsyncWith)) and any(
            isinstance(i.context_expr, ast.Call)
            and facts.qualname(i.context_expr.func).endswith("safe_globals")
            for i in parent.items
        ):
            return True
    return False


def _in_memory(facts: ModuleFacts, call: ast.Call) -> bool:
    """``torch.load(io.BytesIO(...))`` or a name bound only to ``io.BytesIO(...)``."""
    source = call.args[0] if call.args else keyword(call, "f")
    key = dotted(source) if source is not None else None
    origins = facts.origins.get(key, []) if key else [source]
    return bool(origins) and all(
        isinstance(o, ast.Call) and facts.qualname(o.func) == "io.BytesIO" for o in origins
    )


def _mapped(call: ast.AST) -> bool:
    return isinstance(call, ast.Call) and (
        keyword(call, "map_location") is not None or len(call.args) >= 2
    )


def _other_branch_maps(facts: ModuleFacts, call: ast.Call) -> bool:
    """The load sits in one branch of an ``if`` whose other branch loads with a map_location
    (``if args.gpu is None: torch.load(p) else: torch.load(p, map_location=loc)``): the author
    chose per case (one process driving every GPU has no rank to map to)."""
    for child, parent in facts.ancestors(call):
        if isinstance(parent, ast.If) and child is not parent.test:
            other = parent.orelse if child in parent.body else parent.body
            if any(
                _mapped(n) and facts.qualname(n.func) == "torch.load"  # type: ignore[attr-defined]
                for stmt in other
                for n in ast.walk(stmt)
            ):
                return True
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
    return False


def _saves_cpu_tensors(facts: ModuleFacts) -> bool:
    """Every ``torch.save`` of the script writes tensors moved to the CPU first (``.cpu()``):
    its own files load back onto the CPU without a map_location."""
    saves = list(_saves(facts))
    return bool(saves) and all(
        any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "cpu"
            for part in _saved_parts(facts, save.args[0])
            for n in ast.walk(part)
        )
        for save in saves
    )


@rule("PT009", "load-no-map-location", "torch.load without map_location in a distributed script")
def load_no_map_location(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``torch.load(path)`` in a script with several processes.

    Tensors come back on the device they were saved from, usually cuda:0: every rank fills GPU 0
    (out of memory there, and slow).
    """
    facts = module_facts(tree)
    if not facts.uses_distributed() or _saves_cpu_tensors(facts):
        return
    guards = guards_of(facts)
    for call in _loads(facts):
        if _in_memory(facts, call):
            continue  # bytes this process just wrote
        if guards.main_only(call) or _other_branch_maps(facts, call):
            continue
        if keyword(call, "map_location") is None and len(call.args) < 2:
            yield Finding.at(
                "PT009",
                call,
                message="torch.load without map_location puts the tensors back on the GPU they "
                "were saved from (usually cuda:0): every rank allocates on GPU 0",
                fix='torch.load(path, map_location="cpu", weights_only=True) (or '
                'map_location=f"cuda:{local_rank}")',
                api="run.resume() (loads onto this rank's device)",
            )
