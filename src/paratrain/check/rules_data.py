"""Rules about data loading: each rank must read its own shard, reshuffled every epoch.

PT003 a DistributedSampler no DataLoader uses; PT004 ``shuffle=True`` next to ``sampler=``;
PT005 no ``sampler.set_epoch(epoch)`` in the epoch loop.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from paratrain.check.findings import Finding, rule
from paratrain.check.patterns import ModuleFacts, dotted, is_const, keyword, module_facts

WRAPPERS = ("enumerate", "tqdm", "tqdm.tqdm", "iter")
LOADER_API = "run.loader(dataset, batch_size=..., shuffle=True) with `for epoch in run.epochs(n)`"


def _samplers(facts: ModuleFacts) -> Iterator[tuple[str, ast.Call]]:
    """(name, call) for ``name = DistributedSampler(...)``."""
    for call, qual in facts.calls():
        parent = facts.parents.get(call)
        if qual.endswith("DistributedSampler") and isinstance(parent, ast.Assign):
            for target in parent.targets:
                key = dotted(target)
                if key is not None:
                    yield key, call


def _passed_to_a_call(facts: ModuleFacts, key: str) -> bool:
    for call, _ in facts.calls():
        values = [*call.args, *(k.value for k in call.keywords)]
        if any(dotted(v) == key for v in values):
            return True
    return False


@rule("PT003", "sampler-unused", "a DistributedSampler is made but no DataLoader uses it")
def sampler_unused(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``sampler = DistributedSampler(ds)`` and a DataLoader without ``sampler=sampler``.

    Every rank then iterates the whole dataset: each epoch does world-size times the work and
    the ranks train on the same batches.
    """
    facts = module_facts(tree)
    for key, call in _samplers(facts):
        if not _passed_to_a_call(facts, key):
            yield Finding.at(
                "PT003",
                call,
                message=f"`{key}` is never given to a DataLoader: every rank reads the whole "
                "dataset, so an epoch does world-size times the work on the same samples",
                fix=f"DataLoader(dataset, batch_size=..., sampler={key})",
                api=LOADER_API,
            )


@rule("PT004", "shuffle-with-sampler", "a DataLoader gets both shuffle=True and a sampler")
def shuffle_with_sampler(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``DataLoader(ds, shuffle=True, sampler=sampler)``: torch refuses the pair.

    DataLoader raises "sampler option is mutually exclusive with shuffle" when it is built.
    """
    for call, qual in module_facts(tree).calls():
        sampler = keyword(call, "sampler")
        if (
            qual.endswith("DataLoader")
            and is_const(keyword(call, "shuffle"), True)
            and sampler is not None
            and not is_const(sampler, None)
        ):
            yield Finding.at(
                "PT004",
                call,
                message="DataLoader raises ValueError (sampler option is mutually exclusive "
                "with shuffle): the sampler decides the order",
                fix="drop shuffle=True from the DataLoader and shuffle in the sampler: "
                "DistributedSampler(dataset, shuffle=True)",
                api=LOADER_API,
            )


def _loader_samplers(facts: ModuleFacts) -> dict[str, str]:
    """loader name -> the name of its DistributedSampler (or ``loader.sampler`` when inline)."""
    samplers = {key for key, _ in _samplers(facts)}
    found: dict[str, str] = {}
    for call, qual in facts.calls():
        parent = facts.parents.get(call)
        if not (qual.endswith("DataLoader") and isinstance(parent, ast.Assign)):
            continue
        sampler = keyword(call, "sampler")
        for target in parent.targets:
            key = dotted(target)
            if key is None or sampler is None:
                continue
            if dotted(sampler) in samplers:
                found[key] = dotted(sampler) or ""
            elif isinstance(sampler, ast.Call) and facts.qualname(sampler.func).endswith(
                "DistributedSampler"
            ):
                found[key] = f"{key}.sampler"
    return found


def _iterated(loop: ast.For) -> str | None:
    iterable = loop.iter
    if isinstance(iterable, ast.Call) and iterable.args and dotted(iterable.func) in WRAPPERS:
        iterable = iterable.args[0]
    return dotted(iterable)


def _is_epoch_loop(facts: ModuleFacts, node: ast.AST) -> bool:
    return (
        isinstance(node, ast.For)
        and isinstance(node.iter, ast.Call)
        and facts.qualname(node.iter.func) == "range"
        and isinstance(node.target, ast.Name)
    )


@rule("PT005", "no-set-epoch", "the epoch loop never calls set_epoch on the DistributedSampler")
def no_set_epoch(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``for epoch in range(n): for x, y in loader:`` without ``sampler.set_epoch(epoch)``.

    DistributedSampler shuffles with a seed plus the epoch it was told; never told, every epoch
    visits the samples in the same order.
    """
    facts = module_facts(tree)
    loaders = _loader_samplers(facts)
    for epoch_loop in module_facts(tree).nodes:
        if not _is_epoch_loop(facts, epoch_loop):
            continue
        if any(_is_epoch_loop(facts, up) for _, up in facts.ancestors(epoch_loop)):
            continue  # an inner range loop: the outermost one is the epoch loop
        inner = [n for n in ast.walk(epoch_loop) if isinstance(n, ast.For) and n is not epoch_loop]
        used = {loaders[k] for k in map(_iterated, inner) if k is not None and k in loaders}
        called = {
            dotted(n.func.value)
            for n in ast.walk(epoch_loop)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "set_epoch"
        }
        for sampler in sorted(used - called):
            yield Finding.at(
                "PT005",
                epoch_loop,
                message=f"`{sampler}.set_epoch(...)` is never called in this epoch loop: the "
                "DistributedSampler shuffles every epoch into the same order",
                fix=f"call {sampler}.set_epoch(epoch) first thing in each epoch",
                api=LOADER_API,
            )
