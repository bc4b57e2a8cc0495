"""Rules about devices: which GPU a process uses, and tensors that never reach it.

PT001 the global rank used as a CUDA device; PT002 ``x.to(device)`` whose result is dropped;
PT017 the NCCL backend in a script that would otherwise run without GPUs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from paratrain.commands.check.findings import Finding, rule
from paratrain.commands.check.guards import guards_of
from paratrain.commands.check.patterns import (
    Element,
    LoopTarget,
    ModuleFacts,
    dotted,
    is_const,
    keyword,
    last_name,
    method,
    module_facts,
)

DEVICE_CALLS = {"torch.cuda.set_device", "torch.device", "torch.cuda.device"}
WRAPPERS = ("DistributedDataParallel", "FullyShardedDataParallel")
TENSOR_FACTORIES = {
    "tensor", "as_tensor", "from_numpy", "randn", "rand", "randint", "randperm", "zeros", "ones",
    "empty", "full", "arange", "linspace", "zeros_like", "ones_like", "empty_like", "full_like",
    "rand_like", "randn_like", "stack", "cat",
}  # fmt: skip
MOVES = {"to", "cuda"}


def _rank_device_uses(facts: ModuleFacts) -> Iterator[ast.AST]:
    """Expressions that give the global rank where a device (index) is expected."""
    for call, qual in facts.calls():
        method = call.func.attr if isinstance(call.func, ast.Attribute) else ""
        candidates: list[ast.expr] = []
        if qual in DEVICE_CALLS:
            candidates += call.args[-1:] if qual == "torch.device" else call.args[:1]
        elif method in MOVES and not qual.startswith("torch."):
            candidates += call.args[:1]
        if qual.endswith(WRAPPERS):
            ids = keyword(call, "device_ids")
            if isinstance(ids, (ast.List, ast.Tuple)):
                candidates += ids.elts
            candidates += [v for v in [keyword(call, "output_device")] if v is not None]
        candidates += [v for v in [keyword(call, "device")] if v is not None]
        yield from (c for c in candidates if guards_of(facts).is_global_rank(c))
    for node in facts.nodes:
        if isinstance(node, ast.JoinedStr) and len(node.values) >= 2:
            head, value = node.values[0], node.values[1]
            cuda = isinstance(head, ast.Constant) and str(head.value).endswith("cuda:")
            if (
                cuda
                and isinstance(value, ast.FormattedValue)
                and guards_of(facts).is_global_rank(value.value)
            ):
                yield node


@rule("PT001", "rank-as-device", "the global rank is used as a CUDA device index")
def rank_as_device(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``torch.cuda.set_device(rank)`` with ``rank = dist.get_rank()`` (or ``$RANK``).

    The global rank counts processes across all machines; GPUs are numbered per machine. On the
    second node rank 4 asks for cuda:4 on a 4-GPU machine ("invalid device ordinal"), and where
    ranks and GPUs differ in number two processes share one GPU.
    """
    uses: dict[str, list[ast.AST]] = {}
    for node in _rank_device_uses(module_facts(tree)):
        value = node.values[1].value if isinstance(node, ast.JoinedStr) else node  # type: ignore[attr-defined]
        uses.setdefault(dotted(value) or f"@{id(node)}", []).append(node)
    for nodes in uses.values():  # one finding per rank variable, at its first use as a device
        first = min(nodes, key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
        more = f" (and {len(nodes) - 1} more use(s) below)" if len(nodes) > 1 else ""
        yield Finding.at(
            "PT001",
            first,
            message="the global rank is used as a GPU index: on a second machine it names a GPU "
            "that does not exist there (invalid device ordinal), or two processes share a "
            f"GPU{more}",
            fix='use the local rank: local_rank = int(os.environ["LOCAL_RANK"]); '
            "torch.cuda.set_device(local_rank)",
            api="pt.Run() (picks cuda:<local rank> and moves the model with run.setup(model))",
        )


def _from_loader(facts: ModuleFacts, iterable: ast.expr) -> bool:
    """``loader`` / ``enumerate(loader)`` where loader is a DataLoader (or named like one)."""
    while isinstance(iterable, ast.Call) and iterable.args and last_name(iterable.func) in (
        "enumerate", "tqdm", "iter",
    ):  # fmt: skip
        iterable = iterable.args[0]
    key = dotted(iterable)
    if key is None:
        return False
    values = facts.values(iterable)
    built = [o for o in values if isinstance(o, ast.Call)]
    if any(facts.qualname(o.func).endswith("DataLoader") for o in built):
        return True
    geometric = any(q.startswith("torch_geometric") for q in facts.aliases.values())
    names = [key, *(dotted(v) or "" for v in values if isinstance(v, ast.expr))]
    return not geometric and any(n.rsplit(".", 1)[-1].lower().endswith("loader") for n in names)


def _batch(facts: ModuleFacts, node: ast.expr) -> bool:
    """``node`` is a whole batch a loader yields (``for batch in loader``)."""
    owners = facts.values(node)
    return any(isinstance(o, LoopTarget) and _from_loader(facts, o.iterable) for o in owners)


def _is_tensor(facts: ModuleFacts, node: ast.expr) -> bool:
    """Every value of ``node`` is a tensor: a factory, a moved copy, a batch from a loader
    (unpacked, or a value of ``batch.items()``), or what every caller passes for a parameter."""
    key = dotted(node)
    origins = facts.values(node)

    def tensor(origin: object) -> bool:
        if isinstance(origin, LoopTarget):
            if origin.items:  # `for k, v in batch.items()` with `batch` from a loader
                return _batch(facts, origin.iterable)
            if isinstance(origin.iterable, (ast.Tuple, ast.List)) and not origin.unpacked:
                # `for t in (wavs, lens, tokens): t.to(device)`
                parts = origin.iterable.elts
                return bool(parts) and all(
                    dotted(p) is not None and dotted(p) != key and _is_tensor(facts, p)
                    for p in parts
                )
            return origin.unpacked and _from_loader(facts, origin.iterable)
        if isinstance(origin, Element):  # `image, target = batch`
            return _batch(facts, origin.source)
        if not isinstance(origin, ast.Call):
            return False
        qual = facts.qualname(origin.func)
        if qual.startswith("torch.") and qual.rsplit(".", 1)[-1] in TENSOR_FACTORIES:
            return True
        func = origin.func
        return isinstance(func, ast.Attribute) and func.attr in MOVES and dotted(func.value) == key

    return bool(origins) and all(tensor(o) for o in origins)


@rule("PT002", "move-result-dropped", "`x.to(device)` on a tensor whose result is thrown away")
def move_result_dropped(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``data.to(device)`` as a statement: tensors are not moved in place (modules are).

    The tensor stays on the CPU; the forward pass then fails with "Expected all tensors to be on
    the same device", or, when everything else is on the CPU too, the GPU is never used.
    """
    facts = module_facts(tree)
    for node in module_facts(tree).nodes:
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        if not (isinstance(func, ast.Attribute) and func.attr in MOVES):
            continue
        key = dotted(func.value)
        if key is not None and _is_tensor(facts, func.value):
            yield Finding.at(
                "PT002",
                node,
                message=f"`{key}.{func.attr}(...)` returns a moved copy and the copy is dropped: "
                f"`{key}` stays where it was (tensors, unlike modules, do not move in place)",
                fix=f"assign the result: {key} = {ast.unparse(node.value)}",
                api="run.loader(dataset, ...) (its batches arrive on this rank's device)",
            )


OTHER_BACKENDS = ("gloo", "mpi", "ucc")


GPU_INDEX_NAMES = {"local_rank", "gpu", "gpu_id", "device_id", "cuda_id", "ddp_local_rank"}
"""Names of a GPU index: ``model.to(local_rank)`` runs on CUDA only."""


def _has_fallback(facts: ModuleFacts) -> bool:
    """The script names a backend other than NCCL, or is GPU-only anyway.

    GPU-only means it needs CUDA whatever the backend: it calls ``torch.cuda.set_device``,
    ``.cuda()``, ``.to(local_rank)``, names a ``"cuda..."`` device or passes ``device_ids``,
    other than under a ``torch.cuda.is_available()`` test. ``torch.cuda.manual_seed`` or
    ``empty_cache`` run without GPUs and say nothing.
    """
    for node in facts.nodes:
        needs_cuda = False
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.lower()
            if any(b in text for b in OTHER_BACKENDS):
                return True
            needs_cuda = text.startswith("cuda")
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            needs_cuda = isinstance(head, ast.Constant) and str(head.value).startswith("cuda")
        elif isinstance(node, ast.Call):
            qual = facts.qualname(node.func)
            needs_cuda = qual == "torch.cuda.set_device" or method(node) == "cuda"
            index = node.args[0] if method(node) == "to" and node.args else None
            if index is not None and dotted(index) is not None:  # `.to(local_rank)`: a GPU
                needs_cuda = needs_cuda or last_name(index).lower() in GPU_INDEX_NAMES
        elif isinstance(node, ast.keyword) and node.arg == "device_ids":
            chosen = [node.value, *facts.values(node.value)]  # `[rank] if cuda else None`
            needs_cuda = not any(
                isinstance(v, ast.IfExp) or (isinstance(v, ast.expr) and is_const(v, None))
                for v in chosen
            )
        if needs_cuda and not _tests_for_gpu(facts, node):
            return True
    return False


def _tests_for_gpu(facts: ModuleFacts, node: ast.AST) -> bool:
    """``node`` sits under ``if torch.cuda.is_available()`` (or ``device_count()``), either
    branch, or in the value of a name chosen so (``use_cuda = ...``)."""
    for _, parent in facts.ancestors(node):
        if isinstance(parent, (ast.If, ast.IfExp, ast.While)) and _gpu_test(facts, parent.test):
            return True
    return False


def _gpu_test(facts: ModuleFacts, test: ast.AST, depth: int = 0) -> bool:
    """``test`` asks whether there is a GPU: ``torch.cuda.is_available()``, ``device_count()``,
    ``device.type == "cuda"``, or a name set from such a test (``use_cuda``), two names deep."""
    for n in ast.walk(test):
        if isinstance(n, ast.Call) and last_name(n.func) in ("is_available", "device_count"):
            return True
        if (
            depth < 2
            and isinstance(n, (ast.Name, ast.Attribute))
            and any(
                isinstance(v, ast.expr) and v is not n and _gpu_test(facts, v, depth + 1)
                for v in (facts.values(n) if dotted(n) else [])
            )
        ):
            return True
        if last_name(n) in ("use_cuda", "cuda", "has_cuda", "cuda_available", "use_gpu"):
            return True
        if isinstance(n, ast.Compare) and last_name(n.left) == "type":
            return True  # `device.type == "cuda"`: the device was picked by a GPU test
    return False


@rule("PT017", "nccl-only", "init_process_group with NCCL and no fallback for machines w/o GPUs")
def nccl_only(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``dist.init_process_group("nccl")`` in a script that never tests for a GPU.

    NCCL runs on GPUs only: on a machine without them (a laptop, a CPU CI runner) the script
    stops at once ("ProcessGroupNCCL is only supported with GPUs, no GPUs found!").
    """
    facts = module_facts(tree)
    if _has_fallback(facts):
        return
    for call, qual in facts.calls():
        if not qual.endswith("init_process_group"):
            continue
        backend = keyword(call, "backend") or (call.args[0] if call.args else None)
        values = facts.values(backend) if backend is not None else []
        if not values or not all(isinstance(v, ast.Constant) and v.value == "nccl" for v in values):
            continue
        yield Finding.at(
            "PT017",
            backend or call,
            message='the "nccl" backend needs GPUs: on a machine without them this fails '
            '("ProcessGroupNCCL is only supported with GPUs")',
            fix='backend="nccl" if torch.cuda.is_available() else "gloo"',
            api="pt.Run() (picks nccl on GPUs, gloo elsewhere)",
        )
