"""Rules about data loading: each rank must read its own shard, reshuffled every epoch.

PT003 a DistributedSampler no DataLoader uses; PT004 ``shuffle=True`` next to ``sampler=``;
PT005 no ``sampler.set_epoch(epoch)`` in the epoch loop.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from paratrain.commands.check.findings import Finding, rule
from paratrain.commands.check.patterns import (
    FUNCTIONS,
    ModuleFacts,
    dotted,
    is_const,
    keyword,
    last_name,
    method,
    module_facts,
)

WRAPPERS = ("enumerate", "tqdm", "tqdm.tqdm", "iter", "tqdm.auto.tqdm", "zip", "islice")
LOADER_API = "run.loader(dataset, batch_size=..., shuffle=True) with `for epoch in run.epochs(n)`"
LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _is_sampler_call(facts: ModuleFacts, node: object) -> bool:
    return isinstance(node, ast.Call) and facts.qualname(node.func).endswith("DistributedSampler")


def _samplers(facts: ModuleFacts) -> Iterator[tuple[str, ast.expr]]:
    """(name, call) for ``name = DistributedSampler(...)``, also through a helper that returns
    one (``sampler = build_sampler(ds)``)."""
    if not any(q.endswith("DistributedSampler") for _, q in facts.calls()):
        return
    for node in facts.nodes:
        if not isinstance(node, ast.Assign) or not isinstance(node.value, (ast.Call, ast.IfExp)):
            continue
        options = facts.values(node.value)
        options += [b for v in options if isinstance(v, ast.IfExp) for b in (v.body, v.orelse)]
        made = [v for v in options if _is_sampler_call(facts, v)]
        if not made:
            continue
        for target in node.targets:
            key = dotted(target)
            if key is not None:
                yield key, node.value


def _sampler_collections(facts: ModuleFacts) -> Iterator[tuple[str, ast.expr]]:
    """(``"samplers[]"``, the comprehension) for ``samplers = {s: DistributedSampler(d) ...}``."""
    for node in facts.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.DictComp, ast.ListComp)):
            item = node.value.value if isinstance(node.value, ast.DictComp) else node.value.elt
            if _is_sampler_call(facts, item):
                for target in node.targets:
                    key = dotted(target)
                    if key is not None:
                        yield f"{key}[]", node.value


def _given_from(facts: ModuleFacts, key: str) -> bool:
    """Some DataLoader (or BatchSampler) gets an item of the collection ``key``: its
    ``sampler=`` / ``batch_sampler=`` mentions a name ending like ``key``
    (``samplers[split]``, ``self.samplers["train"]``)."""
    last = key.rsplit(".", 1)[-1]
    for call, qual in facts.calls():
        given = loader_keywords(facts, call)
        places = [given.get("sampler"), given.get("batch_sampler")] if given is not None else []
        if qual.endswith("BatchSampler"):
            places += call.args[:1]
        for place in places:
            if place is not None and any(last_name(n) == last for n in ast.walk(place)):
                return True
    return False


def _used(facts: ModuleFacts, key: str, scope: ast.AST | None = None, depth: int = 0) -> bool:
    """``key`` is read other than as the owner of a method call (``sampler.set_epoch(e)``) or
    in a test; handed to a function of this module, that function must use it in turn
    (``make_loader(ds, cfg, sampler)`` that builds its DataLoader without it does not)."""
    nodes = facts.nodes if scope is None else list(ast.walk(scope))
    for node in nodes:
        if not isinstance(node, (ast.Name, ast.Attribute)) or dotted(node) != key:
            continue
        if not isinstance(getattr(node, "ctx", None), ast.Load):
            continue
        parent = facts.parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            continue
        if isinstance(parent, ast.Compare):  # `shuffle=(sampler is None)` reads, does not use
            continue
        handed = _parameter_given(facts, node) if depth < 3 else None
        if handed is not None:
            func, name = handed
            if _used(facts, name, func, depth + 1):
                return True
            continue
        return True
    return False


def _parameter_given(
    facts: ModuleFacts, node: ast.AST
) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, str] | None:
    """(function, parameter name) when ``node`` is an argument of a call of a function of this
    module that takes it by name (not through ``*args``/``**kwargs``)."""
    parent = facts.parents.get(node)
    call = facts.parents.get(parent) if isinstance(parent, ast.keyword) else parent
    if not isinstance(call, ast.Call):
        return None
    found = facts.function_of(call)
    if found is None or found[0] is not facts:
        return None
    func = found[1]
    names = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
    if isinstance(parent, ast.keyword):
        kwonly = [a.arg for a in func.args.kwonlyargs]
        return (func, parent.arg) if parent.arg in (*names, *kwonly) else None
    if node in call.args:
        index = call.args.index(node)
        if names[:1] == ["self"] and isinstance(call.func, ast.Attribute):
            index += 1
        return (func, names[index]) if index < len(names) else None
    return None


@rule("PT003", "sampler-unused", "a DistributedSampler is made but no DataLoader uses it")
def sampler_unused(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``sampler = DistributedSampler(ds)`` and a DataLoader without ``sampler=sampler``.

    Every rank then iterates the whole dataset: each epoch does world-size times the work and
    the ranks train on the same batches.
    """
    facts = module_facts(tree)
    found = [*_samplers(facts), *_sampler_collections(facts)]
    for key, call in found:
        collection = key.endswith("[]")
        if (collection and not _given_from(facts, key[:-2])) or (
            not collection and not _used(facts, key)
        ):
            key = key.removesuffix("[]")
            yield Finding.at(
                "PT003",
                call,
                message=f"`{key}` is never given to a DataLoader: every rank reads the whole "
                "dataset, so an epoch does world-size times the work on the same samples",
                fix=f"DataLoader(dataset, batch_size=..., sampler={key})",
                api=LOADER_API,
            )


def loader_keywords(facts: ModuleFacts, call: ast.Call) -> dict[str, ast.expr] | None:
    """The keywords a DataLoader gets from ``call``: its own, those of a ``**options`` dict and
    of a ``functools.partial(DataLoader, ...)`` it calls; None when ``call`` makes none."""
    found: dict[str, ast.expr] = {}
    target = call
    if not facts.qualname(call.func).endswith("DataLoader"):
        inner = _passes_kwargs_to_loader(facts, call)
        if inner is not None:  # `def make_loader(*a, **kw): return DataLoader(*a, **kw)`
            found.update({k: v for k, v in _keywords(facts, inner).items()})
            found.update(_keywords(facts, call))
            return found
        made = [v for v in facts.values(call.func) if isinstance(v, ast.Call)]
        partial = [v for v in made if facts.qualname(v.func).endswith("partial") and v.args]
        if not partial or not facts.qualname(partial[0].args[0]).endswith("DataLoader"):
            return None
        found.update(_keywords(facts, partial[0]))
    found.update(_keywords(facts, target))
    return found


def _passes_kwargs_to_loader(facts: ModuleFacts, call: ast.Call) -> ast.Call | None:
    """The ``DataLoader(..., **kwargs)`` a function of this module returns, handing on the
    keywords ``call`` gives it."""
    found = facts.function_of(call)
    if found is None or found[0] is not facts or found[1].args.kwarg is None:
        return None
    kwarg = found[1].args.kwarg.arg
    for value in facts.returns(found[1]):
        if (
            isinstance(value, ast.Call)
            and facts.qualname(value.func).endswith("DataLoader")
            and any(k.arg is None and dotted(k.value) == kwarg for k in value.keywords)
        ):
            return ast.Call(
                func=value.func, args=value.args, keywords=[k for k in value.keywords if k.arg]
            )
    return None


def _keywords(facts: ModuleFacts, call: ast.Call) -> dict[str, ast.expr]:
    found: dict[str, ast.expr] = {}
    for k in call.keywords:
        if k.arg is not None:
            found[k.arg] = k.value
            continue
        for value in [*facts.values(k.value), *_merged(facts, k.value)]:  # **options
            if isinstance(value, ast.Dict):
                for name, item in zip(value.keys, value.values, strict=True):
                    if isinstance(name, ast.Constant) and isinstance(name.value, str):
                        found.setdefault(name.value, item)
                    elif name is None:  # `{**DEFAULTS, "sampler": s}`
                        inner = ast.Call(
                            func=ast.Name("f"), args=[], keywords=[ast.keyword(None, item)]
                        )
                        for unpacked, v in _keywords(facts, inner).items():
                            found.setdefault(unpacked, v)
            elif isinstance(value, ast.Call) and facts.qualname(value.func) == "dict":
                found.update({kw.arg: kw.value for kw in value.keywords if kw.arg})
    return found


def _merged(facts: ModuleFacts, options: ast.expr) -> list[ast.expr]:
    """What ``options.update(more)`` and ``options["k"] = v`` add to a ``**options`` dict."""
    key = dotted(options)
    added: list[ast.expr] = []
    if key is None:
        return added
    for call, _ in facts.calls():
        if method(call) == "update" and dotted(call.func.value) == key:  # type: ignore[attr-defined]
            for arg in call.args:
                added += [v for v in facts.values(arg) if isinstance(v, ast.expr)]
            if call.keywords:
                added.append(ast.Call(func=ast.Name("dict"), args=[], keywords=call.keywords))
    for node in facts.nodes:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Subscript) and dotted(target.value) == key:
                added.append(ast.Dict(keys=[target.slice], values=[node.value]))
    return added


@rule("PT004", "shuffle-with-sampler", "a DataLoader gets both shuffle=True and a sampler")
def shuffle_with_sampler(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``DataLoader(ds, shuffle=True, sampler=sampler)``: torch refuses the pair.

    DataLoader raises "sampler option is mutually exclusive with shuffle" when it is built. The
    keywords may come through a ``**options`` dict or a ``functools.partial(DataLoader, ...)``.
    """
    facts = module_facts(tree)
    for call, _ in facts.calls():
        given = loader_keywords(facts, call)
        if given is None:
            continue
        sampler = given.get("sampler")
        shuffle = given.get("shuffle")
        options = (facts.values(shuffle) or [shuffle]) if shuffle is not None else []
        shuffles = bool(options) and all(
            isinstance(v, ast.expr) and is_const(v, True) for v in options
        )
        if shuffles and sampler is not None and not is_const(sampler, None):
            yield Finding.at(
                "PT004",
                call,
                message="DataLoader raises ValueError (sampler option is mutually exclusive "
                "with shuffle): the sampler decides the order",
                fix="let the sampler shuffle: DistributedSampler(dataset, shuffle=True), and "
                "shuffle=sampler is None in the DataLoader (a run without a sampler keeps its "
                "shuffle)",
                api=LOADER_API,
            )


def _shuffling_sampler(facts: ModuleFacts, sampler: ast.expr | None) -> bool:
    """A DistributedSampler that shuffles (``shuffle`` left out or ``True``)."""
    if sampler is None:
        return False
    made = [v for v in facts.values(sampler) if _is_sampler_call(facts, v)]
    return bool(made) and all(
        keyword(c, "shuffle") is None or is_const(keyword(c, "shuffle"), True)
        for c in made
        if isinstance(c, ast.Call)
    )


def _sharded_iterable(facts: ModuleFacts, loop: ast.For | ast.AsyncFor) -> bool:
    """``for b in loader`` (or ``enumerate(tqdm(loader))``) over a DataLoader whose
    DistributedSampler shuffles."""
    iterable = loop.iter
    while isinstance(iterable, ast.Call) and iterable.args:
        if facts.qualname(iterable.func).endswith("DataLoader"):
            break
        if dotted(iterable.func) not in WRAPPERS and facts.qualname(iterable.func) not in WRAPPERS:
            return False
        iterable = iterable.args[0]
    for value in facts.values(iterable):
        if not isinstance(value, ast.Call):
            continue
        given = loader_keywords(facts, value)
        if given is not None and _shuffling_sampler(facts, given.get("sampler")):
            return True
    return False


def _epoch_loops(facts: ModuleFacts, node: ast.AST, depth: int = 0) -> list[ast.AST]:
    """The loops that run ``node`` again and again: the outermost loop around it in its
    function, or, when there is none, around the calls of that function (two levels up)."""
    outermost: ast.AST | None = None
    for child, parent in facts.ancestors(node):
        if isinstance(parent, LOOPS) and child is not getattr(parent, "iter", None):
            outermost = parent  # (`for b in batches(loader)` walks the data: not an epoch)
        elif isinstance(parent, FUNCTIONS):
            if outermost is not None or depth >= 2:
                break
            return [
                loop
                for ref in facts.references(parent)
                for loop in _epoch_loops(facts, ref, depth + 1)
            ]
        elif isinstance(parent, (ast.Lambda, ast.ClassDef)):
            break
    return [outermost] if outermost is not None else []


def _still(facts: ModuleFacts, sampler: ast.expr) -> bool:
    """Every value of ``sampler`` is a DistributedSampler made with ``shuffle=False``: telling
    it the epoch leaves the shuffling one untold (``val_sampler.set_epoch(epoch)``)."""
    made = facts.values(sampler) if dotted(sampler) else []
    return bool(made) and all(
        _is_sampler_call(facts, v) and is_const(keyword(v, "shuffle"), False)  # type: ignore[arg-type]
        for v in made
    )


def _passes(facts: ModuleFacts) -> Iterator[ast.AST]:
    """Where a shuffling loader is walked: ``for b in loader``, and ``next(it)`` in a loop
    that makes ``it = iter(loader)`` again when it runs out (torchtitan's ``while True``)."""
    for node in facts.nodes:
        if isinstance(node, (ast.For, ast.AsyncFor)) and _sharded_iterable(facts, node):
            yield node
        elif (
            isinstance(node, ast.Call)
            and dotted(node.func) == "next"
            and node.args
            and dotted(node.args[0]) is not None
        ):
            made = [v for v in facts.values(node.args[0]) if isinstance(v, ast.Call)]
            walked = [v.args[0] for v in made if dotted(v.func) == "iter" and v.args]
            if walked and all(_walks_sharded(facts, w) for w in walked):
                loops = _epoch_loops(facts, node)
                if any(_makes_again(facts, loop, walked) for loop in loops):
                    yield node


def _walks_sharded(facts: ModuleFacts, loader: ast.expr) -> bool:
    for value in facts.values(loader) or [loader]:
        given = loader_keywords(facts, value) if isinstance(value, ast.Call) else None
        if given is not None and _shuffling_sampler(facts, given.get("sampler")):
            return True
    return False


def _makes_again(facts: ModuleFacts, loop: ast.AST, loaders: list[ast.expr]) -> bool:
    names = {dotted(x) for x in loaders}
    return any(
        isinstance(n, ast.Call) and dotted(n.func) == "iter" and n.args
        and dotted(n.args[0]) in names
        for n in ast.walk(loop)
    )  # fmt: skip


def _deferred_set_epoch(facts: ModuleFacts, scope: ast.AST) -> bool:
    """``scope`` holds a ``set_epoch`` that runs later or again: in a lambda, a nested
    function or a loop of its own (not once, before the epochs, on a resume)."""
    for owner, call in facts.calls_within(scope, depth=0):
        if method(call) != "set_epoch" or _still(owner, call.func.value):  # type: ignore[attr-defined]
            continue
        for _, parent in owner.ancestors(call):
            if parent is scope:
                break
            if isinstance(parent, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, *LOOPS)):
                return True
    return False


def _sets_epoch(facts: ModuleFacts, scope: ast.AST) -> bool:
    """Some ``.set_epoch(...)`` runs in ``scope`` or in a function it calls (three deep)."""
    return any(
        method(c) == "set_epoch" and not _still(owner, c.func.value)  # type: ignore[attr-defined]
        for owner, c in facts.calls_within(scope, depth=3)
    )


@rule("PT005", "no-set-epoch", "the epoch loop never calls set_epoch on the DistributedSampler")
def no_set_epoch(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """An epoch loop over a loader whose DistributedSampler shuffles, without
    ``sampler.set_epoch(epoch)``.

    DistributedSampler shuffles with its seed plus the epoch it was told; never told, it shuffles
    every epoch into the same order. The loop may be a ``for``, a ``while`` or a ``trange``, and
    the loader may be iterated in a helper the loop calls (``train_one_epoch(loader, ...)``).
    A sampler made with ``shuffle=False`` needs no ``set_epoch``.
    """
    facts = module_facts(tree)
    reported: set[int] = set()
    for loop in _passes(facts):
        for epoch_loop in _epoch_loops(facts, loop):
            if id(epoch_loop) in reported or _sets_epoch(facts, epoch_loop):
                continue
            if _deferred_set_epoch(facts, facts.scope_of(loop)):
                continue  # a hook the loop fires: `hooks.append(lambda s: sampler.set_epoch(...))`
            reported.add(id(epoch_loop))
            yield Finding.at(
                "PT005",
                epoch_loop,
                message="this epoch loop never calls `set_epoch(epoch)` on the loader's "
                "DistributedSampler: every epoch visits the samples in the same shuffled order",
                fix="call sampler.set_epoch(epoch) (or loader.sampler.set_epoch(epoch)) first "
                "thing in each epoch",
                api=LOADER_API,
            )
