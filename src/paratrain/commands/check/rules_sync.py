"""Rules about DDP's gradient sync: the hooks that all-reduce gradients must run.

PT021 the training forward pass through ``ddp_model.module(x)`` (the hooks never fire); PT023
every backward inside ``no_sync()`` (gradients are never all-reduced).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from paratrain.commands.check.findings import Finding, rule
from paratrain.commands.check.guards import MULTI, SINGLE, guards_of
from paratrain.commands.check.patterns import (
    FUNCTIONS,
    ModuleFacts,
    dotted,
    last_name,
    method,
    module_facts,
)

DDP = ("DistributedDataParallel",)
NO_GRAD = {"no_grad", "inference_mode"}
EVAL_WORDS = ("eval", "valid", "test", "predict", "infer", "generate", "sample", "score")


def _is_ddp(facts: ModuleFacts, node: ast.expr) -> bool:
    return any(
        isinstance(v, ast.Call) and facts.qualname(v.func).endswith(DDP) for v in facts.values(node)
    )


def _inner_module(facts: ModuleFacts, callee: ast.expr) -> ast.expr | None:
    """The DDP wrapper whose ``.module`` ``callee`` calls: ``ddp.module(x)``,
    ``ddp.module.forward(x)``, or ``net(x)`` with ``net = ddp.module``."""
    if isinstance(callee, ast.Attribute) and callee.attr == "forward":
        callee = callee.value
    candidates: list[object] = [callee]
    if isinstance(callee, ast.Name):
        candidates = list(facts.values(callee))
    found: ast.expr | None = None
    for c in candidates:  # every value of the name must be the inner module
        # `net = model.module if hasattr(model, "module") else model`: the inner one under DDP
        branches = [c.body, c.orelse] if isinstance(c, ast.IfExp) else [c]
        inner = next(
            (b.value for b in branches if isinstance(b, ast.Attribute) and _is_inner(facts, b)),
            None,
        )
        if inner is None:
            return None
        found = found or inner
    return found


def _is_inner(facts: ModuleFacts, node: object) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "module" and _is_ddp(facts, node.value)


def _without_grad(facts: ModuleFacts, node: ast.AST) -> bool:
    """Under ``with torch.no_grad():`` / ``inference_mode()``, in a function decorated so, or
    in a function named for evaluation (``evaluate``, ``validate``, ``generate``)."""
    for _, parent in facts.ancestors(node):
        if isinstance(parent, (ast.With, ast.AsyncWith)) and any(
            last_name(
                i.context_expr.func if isinstance(i.context_expr, ast.Call) else i.context_expr
            )
            in NO_GRAD
            for i in parent.items
        ):
            return True
        if isinstance(parent, FUNCTIONS):
            decorated = {_called(d) for d in parent.decorator_list}
            if decorated & NO_GRAD or any(w in parent.name.lower() for w in EVAL_WORDS):
                return True
    return False


def _called(node: ast.expr) -> str:
    """``no_grad`` for ``torch.no_grad()`` and for ``torch.no_grad``."""
    return last_name(node.func if isinstance(node, ast.Call) else node)


def _trains(facts: ModuleFacts) -> bool:
    return any(method(c) == "backward" for c, _ in facts.calls())


@rule("PT021", "forward-bypasses-ddp", "the training forward pass calls ddp_model.module(x)")
def forward_bypasses_ddp(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``out = ddp_model.module(x)`` in training: DDP's forward never runs.

    DDP prepares its gradient all-reduce in its own ``forward``; calling the inner module skips
    it, so ``backward()`` leaves each rank with its own gradients. The ranks' weights drift
    apart without an error (or DDP raises about unused parameters at the next forward).
    """
    facts = module_facts(tree)
    if not _trains(facts):
        return
    for call, _ in facts.calls():
        wrapper = _inner_module(facts, call.func)
        if wrapper is None or _without_grad(facts, call):
            continue
        name = dotted(wrapper) or "model"
        yield Finding.at(
            "PT021",
            call,
            message=f"the forward pass goes through `{name}.module`, around DDP: its gradient "
            "all-reduce is never set up, so every rank keeps its own gradients and the replicas "
            "drift apart",
            fix=f"call the wrapper: {name}(inputs); keep {name}.module for saving and for "
            "evaluation under torch.no_grad()",
            api="model = run.setup(model) and call model(inputs)",
        )


def _always_no_sync(facts: ModuleFacts, context: ast.expr) -> bool:
    """``model.no_sync()``, or ``model.no_sync() if world_size > 1 else nullcontext()``: a
    choice made on the run's shape (not on the micro-batch) is no_sync whenever it matters."""
    if isinstance(context, (ast.Name, ast.Call)) and method(context) != "no_sync":
        # a name, or a helper returning the context: every value must be no_sync
        chosen = [v for v in facts.values(context) if isinstance(v, ast.expr)]
        return bool(chosen) and all(v is not context and _always_no_sync(facts, v) for v in chosen)
    options: list[ast.expr] = [context]
    for option in options:
        if method(option) == "no_sync":
            return True
        shaped = isinstance(option, ast.IfExp) and guards_of(facts).rank_test(option.test) in (
            MULTI, SINGLE,
        )  # fmt: skip
        if shaped and any(method(b) == "no_sync" for b in (option.body, option.orelse)):  # type: ignore[attr-defined]
            return True
    return False


def _in_no_sync(facts: ModuleFacts, node: ast.AST, depth: int = 0) -> bool:
    """Inside ``with model.no_sync():``, or in a ``with ExitStack() as stack:`` whose body
    enters ``model.no_sync()`` unconditionally before ``node``, or in a function only ever
    called so (``with no_sync(): self._backward(loss)``)."""
    for child, parent in facts.ancestors(node):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            refs = facts.references(parent) if depth < 2 else []
            return bool(refs) and all(_in_no_sync(facts, r, depth + 1) for r in refs)
        if isinstance(parent, (ast.With, ast.AsyncWith)):
            if any(_always_no_sync(facts, i.context_expr) for i in parent.items):
                return True
            before = parent.body[: parent.body.index(child)] if child in parent.body else []
            for stmt in before:
                call = stmt.value if isinstance(stmt, ast.Expr) else None
                if (
                    isinstance(call, ast.Call)
                    and method(call) == "enter_context"
                    and call.args
                    and _always_no_sync(facts, call.args[0])
                ):
                    return True
    return False


@rule("PT023", "backward-always-in-no-sync", "every backward runs inside DDP's no_sync()")
def backward_always_in_no_sync(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``with model.no_sync(): loss.backward()`` and no backward outside it.

    ``no_sync()`` skips the gradient all-reduce for the backward inside it; it is meant for the
    micro-batches before the last one of an accumulation window. When every backward is inside
    it, gradients are never averaged across ranks: each rank steps on its own gradients.
    """
    facts = module_facts(tree)
    backwards = [c for c, _ in facts.calls() if method(c) == "backward"]
    inside = [c for c in backwards if _in_no_sync(facts, c)]
    if not inside or len(inside) != len(backwards):
        return
    for call in inside:
        yield Finding.at(
            "PT023",
            call,
            message="every backward of this script runs inside no_sync(): DDP never all-reduces "
            "the gradients, so each rank steps on its own and the replicas drift apart",
            fix="use no_sync() only for the micro-batches before the last of each window: "
            "`ctx = model.no_sync() if not last else contextlib.nullcontext()`",
            api="with run.accumulate(model): run.backward(loss) (syncs on the last micro-batch)",
        )
