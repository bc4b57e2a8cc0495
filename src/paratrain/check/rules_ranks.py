"""Rules about what one rank does and the others do not.

PT010 files written by every rank in a distributed training function; PT011 a collective that
only the main process reaches (the others never join it: a hang).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from paratrain.check.findings import Finding, rule
from paratrain.check.patterns import ModuleFacts, module_facts, own_nodes

COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_to_all",
    "all_to_all_single", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "gather_object", "scatter",
    "scatter_object_list", "new_group",
}  # fmt: skip


def _training_scopes(facts: ModuleFacts) -> set[ast.AST]:
    """Functions (or the module) that start the process group, wrap in DDP or call backward."""
    scopes: set[ast.AST] = set()
    for call, qual in facts.calls():
        method = call.func.attr if isinstance(call.func, ast.Attribute) else ""
        if qual.endswith(("init_process_group", "DistributedDataParallel")) or method == "backward":
            scopes.add(facts.scope_of(call))
    return scopes


def _mentions_rank(facts: ModuleFacts, call: ast.Call) -> bool:
    """``torch.save(x, f"ckpt_rank{rank}.pt")``: one file per rank is meant."""
    return any(facts.is_rank_like(n) for arg in call.args[1:2] for n in ast.walk(arg))


@rule("PT010", "every-rank-writes", "torch.save or SummaryWriter outside a rank-0 guard")
def every_rank_writes(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``torch.save(...)`` / ``SummaryWriter(...)`` run by every rank of a distributed script.

    All ranks write the same file at once (a torn or corrupt checkpoint on shared storage) or one
    TensorBoard log each, with world-size copies of every curve.
    """
    facts = module_facts(tree)
    if not any(q.endswith("init_process_group") for _, q in facts.calls()):
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
            if facts.main_only(node) or (what == "torch.save" and _mentions_rank(facts, node)):
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
        if isinstance(parent, ast.If) and child is not parent.test:
            main = facts.main_test(parent.test)
            in_body = child in parent.body
            if (main is True and in_body) or (main is False and not in_body):
                return parent
    return None


def _collective_name(facts: ModuleFacts, node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        qual = facts.qualname(node.func)
        name = qual.rsplit(".", 1)[-1]
        if qual.startswith("torch.distributed.") and name in COLLECTIVES:
            return name
    return None


@rule("PT011", "collective-on-one-rank", "a collective that only the main process calls")
def collective_on_one_rank(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``if rank == 0: dist.all_reduce(t)``: the main process waits for ranks that never come.

    Every rank must enter every collective in the same order; here rank 0 blocks until the NCCL
    or gloo timeout (30 minutes by default, or forever), and the others run ahead and block on
    the next collective.
    """
    facts = module_facts(tree)
    for node in module_facts(tree).nodes:
        name = _collective_name(facts, node)
        if name is None or not facts.main_only(node):
            continue
        branch = _rank_branch(facts, node)
        if branch is not None:  # `if rank == 0: dist.barrier() else: dist.barrier()` is fine
            in_body = any(node is n for s in branch.body for n in ast.walk(s))
            other = branch.orelse if in_body else branch.body
            if any(_collective_name(facts, n) == name for s in other for n in ast.walk(s)):
                continue
        yield Finding.at(
            "PT011",
            node,
            message=f"dist.{name} runs on the main process only: the other ranks never join it, "
            "so it waits until the timeout (a hang)",
            fix=f"call dist.{name}(...) on every rank, before or after the rank-0 block",
            api="run.reduce(tensor, 'mean') (called by every rank)",
        )
