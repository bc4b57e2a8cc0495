"""Rules about what one rank does and the others do not.

PT010 files written by every rank in a distributed training function; PT011 a collective that
only the main process reaches (the others never join it: a hang); PT016 prints in a distributed
training function that every rank runs; PT020 an average rank 0 reports from its own shard only.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from paratrain.commands.check.findings import Finding, rule
from paratrain.commands.check.guards import guards_of
from paratrain.commands.check.patterns import (
    Function,
    ModuleFacts,
    dotted,
    keyword,
    last_name,
    module_facts,
    own_nodes,
)

COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_to_all",
    "all_to_all_single", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "gather_object", "scatter",
    "scatter_object_list", "new_group",
}  # fmt: skip


def _training_scopes(facts: ModuleFacts) -> set[ast.AST]:
    """Functions (or the module) that start the process group, wrap in DDP or call backward,
    the functions that call them, and every function of this module those call or hand on
    (a helper or callback every rank runs). Found once per module."""
    cached = facts.memo.get("training scopes")
    if cached is None:
        cached = facts.memo["training scopes"] = _find_training_scopes(facts)
    return cached  # type: ignore[return-value]


LAUNCHERS = ("spawn", "start_processes", "Process", "Pool", "launch")


def _launched(facts: ModuleFacts, ref: ast.AST) -> bool:
    """``ref`` is handed to a call that starts it in other processes (``mp.spawn(f, ...)``,
    ``Process(target=f)``): the function that does so runs once, in the launcher."""
    parent = facts.parents.get(ref)
    if isinstance(parent, ast.keyword):
        parent = facts.parents.get(parent)
    return (
        isinstance(parent, ast.Call)
        and parent.func is not ref
        and (facts.qualname(parent.func).rsplit(".", 1)[-1] in LAUNCHERS)
    )


def _other_branch(facts: ModuleFacts, node: ast.AST, trains: list[ast.AST]) -> bool:
    """``node`` is in one branch of an ``if`` and every training call of its scope in the other:
    the process that trains does not run it (an orchestrator that starts torchrun)."""
    for child, parent in facts.ancestors(node):
        if isinstance(parent, ast.If) and child is not parent.test:
            other = parent.orelse if child in parent.body else parent.body
            if all(any(t is n for s in other for n in ast.walk(s)) for t in trains):
                return True
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
    return False


def _find_training_scopes(facts: ModuleFacts) -> set[ast.AST]:
    scopes: set[ast.AST] = set()
    for call, qual in facts.calls():
        method = call.func.attr if isinstance(call.func, ast.Attribute) else ""
        if qual.endswith(("init_process_group", "DistributedDataParallel")) or method == "backward":
            scopes.add(facts.scope_of(call))
    callers = list(scopes)  # up: the functions that call those (train() calls _run_epoch)
    through: dict[ast.AST, list[ast.AST]] = {}
    """A scope found going up -> the references that made it one (its calls of training)."""
    while callers:
        scope = callers.pop()
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for ref in facts.references(scope):
            if _launched(facts, ref):  # mp.spawn(train, ...): the caller is the launcher
                continue
            caller = facts.scope_of(ref)
            if caller in through:
                through[caller].append(ref)
            if caller not in scopes:
                scopes.add(caller)
                through[caller] = [ref]
                callers.append(caller)
    stack = list(scopes)  # down: what they call, and the callbacks they hand on
    while stack:
        scope = stack.pop()
        for node in own_nodes(scope):
            if scope in through and _other_branch(facts, node, through[scope]):
                continue  # `if args.worker: train(args) else: launch_and_compare()`
            found = None
            if isinstance(node, ast.Call):
                found = facts.function_of(node)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                named = facts.functions.get(node.id)
                found = (facts, named[-1]) if named else None
            if found is not None and found[0] is facts and found[1] not in scopes:
                scopes.add(found[1])
                stack.append(found[1])
    return scopes


def _mentions_rank(facts: ModuleFacts, call: ast.Call) -> bool:
    """``torch.save(x, f"ckpt_rank{rank}.pt")``, ``SummaryWriter(f"tb/rank_{rank}")``: one
    file (or log folder) per rank is meant."""
    is_save = facts.qualname(call.func) == "torch.save"
    places = call.args[1:2] if is_save else [*call.args, *(k.value for k in call.keywords)]
    if is_save:
        places += [k.value for k in call.keywords if k.arg == "f"]
    return any(guards_of(facts).is_rank_like(n) for arg in places for n in ast.walk(arg))


@rule("PT010", "every-rank-writes", "torch.save or SummaryWriter outside a rank-0 guard")
def every_rank_writes(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``torch.save(...)`` / ``SummaryWriter(...)`` run by every rank of a distributed script.

    All ranks write the same file at once (a torn or corrupt checkpoint on shared storage) or one
    TensorBoard log each, with world-size copies of every curve.
    """
    facts = module_facts(tree)
    if not facts.distributed:
        return
    for scope in _training_scopes(facts):
        for node in own_nodes(scope):
            if not isinstance(node, ast.Call):
                continue
            qual = facts.qualname(node.func)
            if qual == "torch.save":
                what = "torch.save"
            elif qual.endswith("SummaryWriter"):
                what = "SummaryWriter"
            else:
                continue
            if guards_of(facts).main_only(node) or _mentions_rank(facts, node):
                continue
            yield Finding.at(
                "PT010",
                node,
                message=f"every rank runs this {what}: the ranks write the same file at once "
                "(a torn file on shared storage) or one log each",
                fix=f"only the main process writes: if dist.get_rank() == 0: {what}(...)",
                api="run.save() / run.save_weights(model, path) / run.log({...}) (rank 0 writes)",
            )


def _rank_branch(facts: ModuleFacts, node: ast.AST) -> ast.If | None:
    """The ``if`` that lets only the main process reach ``node``, or None."""
    for child, parent in facts.ancestors(node):
        if isinstance(parent, ast.If) and guards_of(facts).side(child, parent) is True:
            return parent
    return None


MPI_COLLECTIVES = {
    "bcast", "Bcast", "allreduce", "Allreduce", "reduce", "Reduce", "gather", "Gather",
    "allgather", "Allgather", "scatter", "Scatter", "alltoall", "Alltoall", "barrier", "Barrier",
}  # fmt: skip
"""mpi4py's collectives (``MPI.COMM_WORLD.bcast(data)``), used by diffusion trainers."""


def _collective_name(facts: ModuleFacts, node: ast.AST) -> str | None:
    """``all_reduce`` for ``dist.all_reduce(t)``, ``bcast`` for mpi4py's ``comm.bcast(x)``."""
    if isinstance(node, ast.Call):
        qual = facts.qualname(node.func)
        name = qual.rsplit(".", 1)[-1]
        if qual.startswith("torch.distributed.") and name in COLLECTIVES:
            return name
        if name in MPI_COLLECTIVES and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            comms = [facts.qualname(owner), *(
                facts.qualname(v) for v in facts.values(owner) if isinstance(v, ast.expr)
            )]  # fmt: skip
            if any(c.startswith("mpi4py.") for c in comms):
                return name
    return None


def _collective_inside(facts: ModuleFacts, call: ast.Call) -> str | None:
    """``load_state_dict() -> bcast`` when ``call`` runs a function of this module or of a
    sibling whose body reaches a collective on every path (not under an ``if``)."""
    found = facts.function_of(call)
    if found is None:
        return None
    owner, func = found
    key = ("collective inside", id(func))
    if key not in owner.memo:
        owner.memo[key] = _first_collective(owner, func)
    return owner.memo[key]  # type: ignore[return-value]


def _first_collective(owner: ModuleFacts, func: Function) -> str | None:
    for node in own_nodes(func):
        name = _collective_name(owner, node)
        if name is None:
            continue
        if all(
            _on_every_path(owner, child, parent, name)
            for child, parent in _up_to(owner, node, func)
        ):
            return f"{func.name}() -> {name}"
    return None


def _on_every_path(facts: ModuleFacts, child: ast.AST, parent: ast.AST, name: str) -> bool:
    """What is under ``child`` runs whenever ``parent`` does, as far as collective ``name``
    goes: not in a loop, a ``try`` or a conditional, unless the other branch of the ``if``
    calls the same collective (``if rank == 0: comm.bcast(n) else: n = comm.bcast(None)``)."""
    if isinstance(parent, ast.If) and child is not parent.test:
        other = parent.orelse if child in parent.body else parent.body
        return any(_collective_name(facts, n) == name for s in other for n in ast.walk(s))
    return not isinstance(parent, (ast.IfExp, ast.While, ast.For, ast.AsyncFor, ast.Try))


def _up_to(facts: ModuleFacts, node: ast.AST, stop: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
    for child, parent in facts.ancestors(node):
        if parent is stop:
            return
        yield child, parent


def _matched_off_main(facts: ModuleFacts, node: ast.AST, name: str) -> bool:
    """The same function calls the same collective where only the other ranks run: the
    ``torch_distributed_zero_first`` shape (the others wait at a barrier before the work, rank
    0 joins them after it)."""
    scope = facts.scope_of(node)
    for other in own_nodes(scope):
        if other is node or _collective_name(facts, other) != name:
            continue
        for child, parent in facts.ancestors(other):
            if parent is scope:
                break
            if isinstance(parent, ast.If) and guards_of(facts).side(child, parent) is False:
                return True
    return False


@rule("PT011", "collective-on-one-rank", "a collective that only the main process calls")
def collective_on_one_rank(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``if rank == 0: dist.all_reduce(t)``: the main process waits for ranks that never come.

    Every rank must enter every collective in the same order; here rank 0 blocks until the NCCL
    or gloo timeout (30 minutes by default, or forever), and the others run ahead and block on
    the next collective.
    """
    facts = module_facts(tree)
    guards = guards_of(facts)
    reached: set[int] = set()  # functions reported where rank 0 alone calls them
    for node in facts.nodes:
        if isinstance(node, ast.Call) and _collective_name(facts, node) is None:
            through = _collective_inside(facts, node)
            if through is None or not guards.main_only(node):
                continue
            found = facts.function_of(node)
            if found is not None:
                reached.add(id(found[1]))
            yield Finding.at(
                "PT011",
                node,
                message=f"{through} runs on the main process only: the other ranks never join "
                "the collective inside it, so it waits until the timeout (a hang)",
                fix="call it on every rank (it shares the result itself), or move the "
                "collective out of what only rank 0 runs",
                api="run.resume() (every rank loads; rank 0 reads, the others receive)",
            )
    for node in facts.nodes:
        name = _collective_name(facts, node)
        if name is None or not guards.main_only(node):
            continue
        if id(facts.scope_of(node)) in reached and not guards.main_only(node, within=True):
            continue  # reported where the function is called
        branch = _rank_branch(facts, node)
        if branch is not None:  # `if rank == 0: dist.barrier() else: dist.barrier()` is fine
            in_body = any(node is n for s in branch.body for n in ast.walk(s))
            other = branch.orelse if in_body else branch.body
            if any(_collective_name(facts, n) == name for s in other for n in ast.walk(s)):
                continue
        if _matched_off_main(facts, node, name):
            continue
        func = node.func if isinstance(node, ast.Call) else node
        torch_call = facts.qualname(func).startswith("torch.")
        called = f"dist.{name}" if torch_call else ast.unparse(func)
        yield Finding.at(
            "PT011",
            node,
            message=f"{called} runs on the main process only: the other ranks never join it, "
            "so it waits until the timeout (a hang)",
            fix=f"call {called}(...) on every rank, before or after the rank-0 block",
            api="run.reduce(tensor, 'mean') (called by every rank)",
        )


def _prints_own_rank(facts: ModuleFacts, call: ast.Call) -> bool:
    """``print(f"rank {rank}: ...")`` (or the process id): a rank's own line is meant."""
    args = [*call.args, *(k.value for k in call.keywords)]
    guards = guards_of(facts)
    return any(
        guards.is_rank_like(n) or (isinstance(n, ast.Call) and last_name(n.func) == "getpid")
        for arg in args
        for n in ast.walk(arg)
    )


@rule("PT016", "every-rank-prints", "print in distributed training code outside a rank-0 guard")
def every_rank_prints(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``print(loss)`` run by every rank of a distributed script: each line once per rank.

    The log is world-size copies of every line, interleaved. A print that names the rank
    (``print(f"rank {rank} ...")``) is taken as meant per rank and left alone.
    """
    facts = module_facts(tree)
    if not facts.distributed or guards_of(facts).prints_replaced():
        return
    for scope in _training_scopes(facts):
        for node in own_nodes(scope):
            if not (isinstance(node, ast.Call) and facts.qualname(node.func) == "print"):
                continue
            if guards_of(facts).main_only(node) or _prints_own_rank(facts, node):
                continue
            if _error_before_exit(facts, node):
                continue  # each rank's own error, as it stops
            yield Finding.at(
                "PT016",
                node,
                message="every rank runs this print: each line appears once per rank, interleaved",
                fix="print on the main process only: if dist.get_rank() == 0: print(...)",
                api="run.print(...) (rank 0 prints)",
            )


EXIT_CALLS = {"sys.exit", "exit", "quit", "os._exit"}


def _error_before_exit(facts: ModuleFacts, call: ast.Call) -> bool:
    """A print followed by ``raise`` or ``sys.exit()`` (or, when it says "error", by
    ``return``): a message each rank stops with, once, not a log line."""
    statement = facts.parents.get(call)
    block = facts.parents.get(statement) if statement is not None else None
    if block is None:
        return False
    for field in ("body", "orelse", "finalbody"):
        siblings = getattr(block, field, None)
        if isinstance(siblings, list) and statement in siblings:
            rest = siblings[siblings.index(statement) + 1 :]
            after = rest[0] if rest else None
            if isinstance(after, ast.Raise):
                return True
            if isinstance(after, ast.Return):
                return "error" in ast.unparse(call).lower()
            return (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Call)
                and facts.qualname(after.value.func) in EXIT_CALLS
            )
    return False


REPORTS = {"log", "info", "add_scalar", "add_scalars"}


def _is_report(facts: ModuleFacts, call: ast.Call) -> bool:
    if facts.qualname(call.func) == "print":
        return True
    return isinstance(call.func, ast.Attribute) and call.func.attr in REPORTS


def _sharded_loader(facts: ModuleFacts, iterable: ast.expr) -> bool:
    """``for b in loader`` (or ``enumerate(loader)``) where ``loader`` has a ``sampler=``."""
    while isinstance(iterable, ast.Call) and not facts.qualname(iterable.func).endswith(
        "DataLoader"
    ):
        if not iterable.args:
            return False
        iterable = iterable.args[0]
    origins = facts.values(iterable) if dotted(iterable) else [iterable]
    first = origins[0] if len(origins) == 1 else None
    if isinstance(first, ast.Call) and last_name(first.func) == "iter" and first.args:
        return _sharded_loader(facts, first.args[0])  # `it = iter(loader)`
    return bool(origins) and all(
        isinstance(o, ast.Call)
        and facts.qualname(o.func).endswith("DataLoader")
        and _distributed_sampler(facts, keyword(o, "sampler"))
        for o in origins
    )


def _distributed_sampler(facts: ModuleFacts, sampler: ast.expr | None) -> bool:
    """``DistributedSampler(...)``, or a name bound to one (on some path)."""
    if sampler is None:
        return False
    origins = facts.values(sampler)
    return any(
        isinstance(o, ast.Call) and facts.qualname(o.func).endswith("DistributedSampler")
        for o in origins
    )


def _summed_over_shard(facts: ModuleFacts, name: str) -> bool:
    """``name += ...`` on every rank, in a loop over a loader with a (distributed) sampler
    (``for b in loader``, or ``while (b := next(it)) ...`` with ``it = iter(loader)``)."""
    for node in facts.sites.get(name, []):
        if not (isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add)):
            continue
        if guards_of(facts).main_only(node):
            continue
        for _, loop in facts.ancestors(node):
            if isinstance(loop, (ast.For, ast.AsyncFor)) and _sharded_loader(facts, loop.iter):
                return True
            if isinstance(loop, ast.While) and any(
                _sharded_loader(facts, n.args[0])
                for n in ast.walk(loop.test)
                if isinstance(n, ast.Call) and last_name(n.func) == "next" and n.args
            ):
                return True
    return False


def _combines_anything(facts: ModuleFacts) -> bool:
    """Some reduce or gather is called anywhere: the counts may be combined through a tensor
    made from them (``t = torch.tensor([correct, total]); dist.all_reduce(t)``), which the
    names alone do not show."""
    for call, _ in facts.calls():
        func = last_name(call.func).lower()
        if "reduce" in func or "gather" in func:
            return True
    return False


def _averages(facts: ModuleFacts, value: ast.AST) -> Iterator[ast.BinOp]:
    """The divisions ``value`` shows or its name was assigned from."""
    key = dotted(value)
    origins: list[object] = (
        list(facts.values(value)) if key or isinstance(value, ast.Subscript) else [value]
    )
    if not origins or not all(
        isinstance(o, ast.BinOp) and isinstance(o.op, ast.Div) for o in origins
    ):
        return
    for origin in origins:
        assert isinstance(origin, ast.BinOp)
        yield origin


def _shard_average(facts: ModuleFacts, call: ast.Call) -> ast.BinOp | None:
    """The average ``call`` reports that no rank shares with the others, or None."""
    args = [*call.args, *(k.value for k in call.keywords)]
    for value in (n for a in args for n in ast.walk(a)):
        for division in _averages(facts, value):
            summed = {d for n in ast.walk(division.left) if (d := dotted(n)) is not None}
            if any(_summed_over_shard(facts, s) for s in summed):
                return division
    return None


@rule("PT020", "metric-from-one-rank", "rank 0 reports an average of its own shard only")
def metric_from_one_rank(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``if rank == 0: print(correct / total)`` where every rank summed only its own shard.

    Each rank counts the batches its DistributedSampler gave it; without an all_reduce the
    number rank 0 reports is the accuracy (or loss) of 1/world-size of the data.
    """
    facts = module_facts(tree)
    if not facts.distributed or _combines_anything(facts):
        return
    for call, _ in facts.calls():
        if not (_is_report(facts, call) and guards_of(facts).main_only(call)):
            continue
        division = _shard_average(facts, call)
        if division is None:
            continue
        yield Finding.at(
            "PT020",
            call,
            message=f"`{ast.unparse(division)}` is summed over this rank's shard only: "
            "rank 0 reports 1/world-size of the data",
            fix="sum the counts over the ranks first: dist.all_reduce(t) on a tensor of "
            "[sum, count], then divide",
            api="run.reduce(tensor, 'sum') (called by every rank)",
        )
