"""Parallel runs on real gloo ranks give the same weights as one process with the global batch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import paratrain as pt
from tests.support.distributed import run_distributed
from tests.support.training import dataset, max_abs_diff, mlp, train

pytestmark = pytest.mark.dist

B = 4  # per-rank batch
SCENARIOS: dict[str, dict[str, Any]] = {
    "ddp_sgd": dict(strategy="ddp", optimizer="sgd", batch_size=B, steps=5),
    "ddp_adamw": dict(strategy="ddp", optimizer="adamw", batch_size=B, steps=5),
    "fsdp_sgd": dict(
        strategy="fsdp", optimizer="sgd", batch_size=B, steps=5, fsdp_wrap=(nn.Linear,)
    ),
    "fsdp_adamw": dict(strategy="fsdp", optimizer="adamw", batch_size=B, steps=5),
    # 40 samples, 2 ranks, 2 per micro-batch, 4 per window: windows of 4, 4 and a short 2.
    "ddp_accum": dict(strategy="ddp", batch_size=2, grad_accum=4, n=40),
    "fsdp_accum": dict(strategy="fsdp", batch_size=2, grad_accum=4, n=40),
    "ddp_clip": dict(strategy="ddp", batch_size=B, steps=5, max_grad_norm=0.05),
    "fsdp_clip": dict(strategy="fsdp", batch_size=B, steps=5, max_grad_norm=0.05),
    "ddp_fp16_hook": dict(strategy="ddp", batch_size=B, steps=5, comm_hook="fp16"),
    "ddp_bf16": dict(strategy="ddp", batch_size=B, steps=5, precision="bf16"),
    "ddp_fp16": dict(strategy="ddp", batch_size=B, steps=5, precision="fp16"),
    # PowerSGD all-reduces exactly during its warm-up, then sends a low-rank approximation.
    "ddp_powersgd_warmup": dict(
        strategy="ddp", batch_size=B, steps=5, comm_hook="powersgd", powersgd_warmup=100
    ),
    "ddp_powersgd": dict(
        strategy="ddp", batch_size=B, steps=5, comm_hook="powersgd", powersgd_warmup=2
    ),
    "fsdp_bf16": dict(strategy="fsdp", batch_size=B, steps=5, precision="bf16"),
    "fsdp_keep_gathered": dict(
        strategy="fsdp",
        optimizer="adamw",
        batch_size=B,
        steps=5,
        fsdp_wrap=(nn.Linear,),
        fsdp_reshard_after_forward=False,
    ),
}


def _reference(settings: dict[str, Any], world: int = 2) -> dict[str, Any]:
    """The same training in one process with the global batch."""
    ref = dict(settings, strategy="cpu", batch_size=settings["batch_size"] * world)
    ref.pop("fsdp_wrap", None)
    for option in ("comm_hook", "powersgd_rank", "powersgd_warmup", "fsdp_reshard_after_forward"):
        ref.pop(option, None)
    if ref.get("grad_accum", 1) > 1:
        ref["batch_size"] *= ref.pop("grad_accum")
    return train(**ref)


def _evaluate(model: nn.Module, run: pt.Run, n: int) -> tuple[int, int, list[int]]:
    correct = total = 0
    seen: list[int] = []
    for x, y in run.eval_loader(dataset(n, seed=7), batch_size=8):
        correct += int((model(x).argmax(1) == y).sum())
        total += len(y)
    batches = run.eval_loader(dataset(n, seed=7), batch_size=8).loader.batch_sampler
    seen = [i for batch in batches for i in batch]
    return run.reduce(correct, "sum"), run.reduce(total, "sum"), run.gather(seen)


def _uneven_batches() -> int:
    with pt.Run(strategy="ddp", progress=False) as run:
        model = run.setup(mlp())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = dataset(16)
        batches = 3 if run.rank == 0 else 5  # rank 0 runs out first
        with run.uneven_inputs(model):
            for i in range(batches):
                x, y = data[i * 2 : i * 2 + 2]
                run.backward(nn.functional.cross_entropy(model(x), y))
                run.step(opt)
        return run.global_step


def _all_scenarios() -> dict[str, Any]:
    out: dict[str, Any] = {name: train(**s) for name, s in SCENARIOS.items()}
    with pt.Run(strategy="ddp", progress=False) as run:
        out["eval"] = _evaluate(run.setup(mlp()), run, 101)
    out["uneven"] = _uneven_batches()
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_distributed(_all_scenarios, 2)


@pytest.mark.parametrize(
    "name", ["ddp_sgd", "ddp_adamw", "ddp_accum", "ddp_clip", "ddp_powersgd_warmup"]
)
def test_ddp_matches_one_process(ranks: list[dict[str, Any]], name: str) -> None:
    ref = _reference(SCENARIOS[name])
    for rank in ranks:
        assert rank[name]["strategy"] == "ddp" and rank[name]["world"] == 2
        assert rank[name]["steps"] == ref["steps"]
        assert max_abs_diff(rank[name]["weights"], ref["weights"]) <= 1e-6


@pytest.mark.parametrize(
    "name", ["fsdp_sgd", "fsdp_adamw", "fsdp_accum", "fsdp_clip", "fsdp_keep_gathered"]
)
def test_fsdp_matches_one_process(ranks: list[dict[str, Any]], name: str) -> None:
    ref = _reference(SCENARIOS[name])
    full = ranks[0][name]["weights"]  # the full state dict lands on rank 0
    assert ranks[0][name]["steps"] == ref["steps"]
    assert max_abs_diff(full, ref["weights"]) <= 1e-5


def test_accumulation_flushes_the_short_last_window(ranks: list[dict[str, Any]]) -> None:
    # 10 micro-batches per rank in windows of 4: steps after the 4th, 8th and the last one.
    assert ranks[0]["ddp_accum"]["steps"] == 3
    assert len(ranks[0]["ddp_accum"]["losses"]) == 10


def test_clipping_changed_the_result(ranks: list[dict[str, Any]]) -> None:
    unclipped = ranks[0]["ddp_sgd"]["weights"]
    assert max_abs_diff(ranks[0]["ddp_clip"]["weights"], unclipped) > 1e-3


@pytest.mark.parametrize(
    "name,tol",
    [
        ("ddp_fp16_hook", 5e-3),
        ("ddp_bf16", 5e-2),
        ("ddp_fp16", 5e-2),
        ("ddp_powersgd", 5e-2),
        ("fsdp_bf16", 5e-2),
    ],
)
def test_reduced_precision_stays_close(ranks: list[dict[str, Any]], name: str, tol: float) -> None:
    ref = _reference(SCENARIOS["ddp_sgd"])
    diff = max_abs_diff(ranks[0][name]["weights"], ref["weights"])
    assert 0 < diff <= tol  # different arithmetic, same training
    if not name.startswith("fsdp"):  # fsdp: the full state dict lands on rank 0 only
        assert max_abs_diff(ranks[0][name]["weights"], ranks[1][name]["weights"]) == 0
    losses = ranks[0][name]["losses"]
    assert losses[-1] < losses[0]


def test_powersgd_compresses_after_its_warmup(ranks: list[dict[str, Any]]) -> None:
    exact = ranks[0]["ddp_sgd"]["weights"]
    assert max_abs_diff(ranks[0]["ddp_powersgd_warmup"]["weights"], exact) <= 1e-6
    assert max_abs_diff(ranks[0]["ddp_powersgd"]["weights"], exact) > 1e-4  # low-rank steps


def test_distributed_eval_counts_every_sample_once(ranks: list[dict[str, Any]]) -> None:
    correct, total, seen = ranks[0]["eval"]
    assert total == 101
    flat = [i for part in seen for i in part]
    assert sorted(flat) == list(range(101))
    with pt.Run(strategy="cpu", progress=False) as run:
        ref_correct, ref_total, _ = _evaluate(run.setup(mlp()), run, 101)
    assert (correct, total) == (ref_correct, ref_total)
    assert correct / total == ref_correct / ref_total


def test_uneven_inputs_do_not_hang(ranks: list[dict[str, Any]]) -> None:
    assert [r["uneven"] for r in ranks] == [3, 5]
