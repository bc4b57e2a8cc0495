"""Rules about torch APIs that are deprecated, removed or wrong for several processes.

PT012 ``torch.cuda.amp``; PT013 SyncBatchNorm under DataParallel; PT014 ``nn.DataParallel``;
PT015 ``torch.distributed.pipeline.sync.Pipe`` (removed).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from paratrain.commands.check.findings import Finding, rule
from paratrain.commands.check.patterns import (
    keyword,
    last_name,
    module_facts,
    old_torch_branch,
)

CUDA_AMP = {
    "torch.cuda.amp.autocast": "torch.autocast",
    "torch.cuda.amp.autocast_mode.autocast": "torch.autocast",
    "torch.cuda.amp.GradScaler": "torch.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler": "torch.amp.GradScaler",
}
DATA_PARALLEL = {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel"}
CONVERT_SYNC_BN = {
    "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
    "torch.nn.modules.batchnorm.SyncBatchNorm.convert_sync_batchnorm",
}
PIPE = "torch.distributed.pipeline"


@rule("PT012", "cuda-amp", "deprecated torch.cuda.amp.autocast / GradScaler")
def cuda_amp(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``torch.cuda.amp.autocast()`` / ``torch.cuda.amp.GradScaler()``: deprecated in torch 2.4.

    Each call warns (FutureWarning) and the names are going away; the device-generic
    ``torch.autocast`` and ``torch.amp.GradScaler`` replace them.
    """
    facts = module_facts(tree)
    for node in facts.nodes:  # handed on, not called: `partial(torch.cuda.amp.autocast, ...)`
        if not isinstance(node, (ast.Attribute, ast.Name)) or isinstance(
            facts.parents.get(node), ast.Attribute
        ):
            continue
        qual = facts.qualname(node)
        parent = facts.parents.get(node)
        called = isinstance(parent, ast.Call) and parent.func is node
        handed = isinstance(parent, (ast.Call, ast.keyword, ast.Assign, ast.Return))
        if isinstance(parent, ast.Call) and last_name(parent.func).lower().endswith(
            ("isinstance", "issubclass")
        ):
            continue  # a type test (also unittest's assertIsInstance): nothing is made
        if qual in CUDA_AMP and handed and not called and not old_torch_branch(facts, node):
            yield Finding.at(
                "PT012",
                node,
                message=f"{qual.rsplit('.', 1)[-1]} from torch.cuda.amp is deprecated since "
                "torch 2.4 (a FutureWarning at every call) and will be removed",
                fix=f'use {CUDA_AMP[qual]} with "cuda" as its first argument',
                api='pt.Run(precision="fp16") (autocast and loss scaling in run.step), or '
                '"bf16" (no scaler needed)',
            )
    for call, qual in facts.calls():
        if qual in CUDA_AMP and not old_torch_branch(facts, call):
            kept = ", ".join(ast.unparse(k) for k in call.keywords)
            replacement = f'{CUDA_AMP[qual]}("cuda"{", " * bool(kept)}{kept})'
            dtype = keyword(call, "dtype")
            half = "autocast" in qual and (dtype is None or "bfloat16" not in ast.unparse(dtype))
            note = " (float16, as before)" if half else ""
            yield Finding.at(
                "PT012",
                call,
                message=f"{qual.rsplit('.', 1)[-1]} from torch.cuda.amp is deprecated since "
                "torch 2.4 (a FutureWarning at every call) and will be removed",
                fix=f"use {replacement}{note}",
                api='pt.Run(precision="fp16") (autocast and loss scaling in run.step), or '
                '"bf16" (no scaler needed)',
            )


@rule("PT013", "syncbn-with-dataparallel", "SyncBatchNorm conversion in a DataParallel script")
def syncbn_with_dataparallel(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``nn.SyncBatchNorm.convert_sync_batchnorm(model)`` next to ``nn.DataParallel``.

    SyncBatchNorm synchronises statistics through a process group, one GPU per process; under
    DataParallel (one process, several GPUs) its forward raises "SyncBatchNorm is only supported
    within torch.nn.parallel.DistributedDataParallel" or fails for lack of a process group.
    """
    facts = module_facts(tree)
    calls = list(facts.calls())
    if not any(q in DATA_PARALLEL for _, q in calls):
        return
    for call, qual in calls:
        if qual in CONVERT_SYNC_BN:
            yield Finding.at(
                "PT013",
                call,
                message="SyncBatchNorm works only with DistributedDataParallel (one process per "
                "GPU); under nn.DataParallel its forward raises",
                fix="train with DistributedDataParallel (torchrun), or keep plain BatchNorm "
                "under DataParallel",
                api='paratrain run --nproc N train.py with pt.Run(strategy="ddp") and '
                "run.setup(model)",
            )


@rule("PT014", "data-parallel", "nn.DataParallel instead of DistributedDataParallel")
def data_parallel(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``nn.DataParallel(model)``: one process drives every GPU.

    Each forward copies the model to every GPU and gathers outputs on cuda:0, which runs out of
    memory first; the Python thread per GPU scales poorly. PyTorch recommends
    DistributedDataParallel even on a single machine.
    """
    for call, qual in module_facts(tree).calls():
        if qual in DATA_PARALLEL:
            yield Finding.at(
                "PT014",
                call,
                message="nn.DataParallel copies the model to every GPU in each forward and "
                "gathers on cuda:0: GPU 0 fills first and the speed-up stays small",
                fix="one process per GPU with DistributedDataParallel, started by torchrun",
                api="paratrain run --nproc N train.py with model = run.setup(model)",
            )


@rule("PT015", "removed-pipe", "torch.distributed.pipeline.sync.Pipe (removed from torch)")
def removed_pipe(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``from torch.distributed.pipeline.sync import Pipe``: the package was removed in torch 2.4.

    The import fails with ModuleNotFoundError; ``torch.distributed.pipelining`` replaces it.
    """
    facts = module_facts(tree)
    for node in facts.nodes:
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            names = [facts.qualname(node.func)]  # `Pipe(...)` of an import: the import is found
        if any(n == PIPE or n.startswith(PIPE + ".") for n in names):
            yield Finding.at(
                "PT015",
                node,
                message="torch.distributed.pipeline (Pipe) was removed in torch 2.4: the import "
                "fails with ModuleNotFoundError",
                fix="use torch.distributed.pipelining (pipeline(), ScheduleGPipe)",
                api='pt.Run(strategy="pipeline") with run.setup(model)',
            )
