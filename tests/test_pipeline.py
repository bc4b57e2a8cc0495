"""Pipeline parallel on real gloo ranks equals one process on the same global batch (AdamW,
clipping, 5 steps): GPipe, 1F1B and interleaved 1F1B at world 2, pipeline x FSDP at world 4;
its checkpoints resume under other layouts, and the same loop runs under every strategy."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import TensorDataset

import paratrain as pt
from paratrain.checkpoint.inspection import convert, inspect
from tests.support.distributed import run_distributed
from tests.support.training import assert_same_training, max_abs_diff

pytestmark = pytest.mark.dist

GLOBAL_BATCH = 8
STEPS = 5


def net(dropout: float = 0.0, norm: bool = False) -> nn.Sequential:
    """Eight layers along one nn.Sequential (a nested block included), as the seeds build them."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 16),
        nn.BatchNorm1d(16) if norm else nn.LayerNorm(16),
        nn.GELU(),
        nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Dropout(dropout)),
        nn.Linear(16, 16),
        nn.GELU(),
        nn.Linear(16, 3),
    )


class Tower(nn.Module):
    """Not a Sequential: embedding, a ModuleDict of blocks and a head, as torchtitan builds
    models, whose forward skips the parts a pipeline stage does not hold."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed: nn.Module | None = nn.Linear(6, 16)
        self.blocks = nn.ModuleDict(
            {str(i): nn.Sequential(nn.Linear(16, 16), nn.GELU()) for i in range(4)}
        )
        self.head: nn.Module | None = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x) if self.embed is not None else x
        for block in self.blocks.values():
            x = x + block(x)
        return self.head(x) if self.head is not None else x


def tower_stage(model: nn.Module, stage: int, stages: int) -> nn.Module:
    """The stage builder a user writes: a copy of the model without the other stages' parts."""
    import copy

    part = copy.deepcopy(model)
    per = len(part.blocks) // stages
    for name in list(part.blocks):
        if not stage * per <= int(name) < (stage + 1) * per:
            del part.blocks[name]
    if stage > 0:
        part.embed = None
    if stage < stages - 1:
        part.head = None
    return part


def data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


def train(
    *,
    steps: int = STEPS,
    tower: bool = False,
    dropout: float = 0.0,
    norm: bool = False,
    ckpt_dir: str | None = None,
    save_at: int | None = None,
    resume: bool = False,
    **settings: Any,
) -> dict[str, Any]:
    """The loop every strategy runs: model(x, target=y), run.backward, run.step."""
    with pt.Run(progress=False, seed=0, max_grad_norm=0.5, ckpt_dir=ckpt_dir, **settings) as run:
        model = Tower() if tower else net(dropout, norm)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
        model, opt = run.setup(model, opt, loss_fn=nn.functional.cross_entropy)
        per_rank = GLOBAL_BATCH // (run.data_size * run.config.grad_accum)
        loader = run.loader(data(), batch_size=per_rank, shuffle=True, drop_last=True)
        if resume:
            run.resume()
        losses = []
        for _ in run.epochs(2):
            for x, y in loader:
                with run.accumulate(model):
                    loss = model(x, target=y)
                    run.backward(loss)
                run.step(opt)
                losses.append(run.reduce(loss.item(), "mean"))
                if save_at is not None and run.global_step == save_at:
                    run.save()
                if run.global_step >= steps:
                    break
            if run.global_step >= steps:
                break
        model.eval()
        with torch.no_grad():
            batches = list(run.eval_loader(data(), 16))
            correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in batches)
            eval_loss = sum(float(model(x, target=y)) for x, y in batches)
            odd = tuple(model(batches[0][0][:3]).shape)  # a batch no schedule divides
        return {
            "weights": run.strategy.full_state_dict(model),
            "losses": losses,
            "correct": run.reduce(correct, "sum"),
            "eval_loss": run.reduce(eval_loss, "sum"),
            "steps": run.global_step,
            "data": (run.data_rank, run.data_size),
            "strategy": run.strategy.name,
            "split": any(isinstance(p, DTensor) for p in model.parameters()),
            "odd": odd,
        }


SCENARIOS: dict[int, dict[str, dict[str, Any]]] = {
    2: {
        "1f1b": dict(strategy="pipeline"),
        "gpipe": dict(pipeline_schedule="gpipe", pipeline_split=("3.1",), n_microbatches=4),
        "interleaved": dict(strategy="pipeline", pipeline_schedule="interleaved_1f1b"),
        "accum": dict(strategy="pipeline", grad_accum=2),
        "bf16": dict(strategy="pipeline", precision="bf16"),
        "norm": dict(strategy="pipeline", pipeline_schedule="gpipe", norm=True),
        "norm_late": dict(pipeline_schedule="gpipe", pipeline_split=("1",), norm=True),
        "builder": dict(strategy="pipeline", pipeline_split=tower_stage, tower=True),
        "ddp": dict(strategy="ddp"),  # the same loop: loss_fn= under DDP
    },
    4: {
        "pp_fsdp": dict(strategy="pipeline", mesh={"pp": 2, "dp": 2}),
        "pp_hsdp": dict(mesh={"pp": 2, "dp_replicate": 2}, pipeline_schedule="gpipe"),
        "pp_fsdp_accum": dict(mesh={"pp": 2, "dp": 2}, grad_accum=2),
        "pp_tp": dict(mesh={"pp": 2, "tp": 2}, tp_plan="auto", dropout=0.0),
    },
}


def _scenarios(world: int) -> dict[str, Any]:
    return {name: train(**settings) for name, settings in SCENARIOS[world].items()}


@pytest.fixture(scope="module")
def world2() -> list[dict[str, Any]]:
    return run_distributed(_scenarios, 2, 2)


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return train(strategy="cpu")


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "interleaved", "accum", "builder", "ddp"])
def test_pipeline_matches_one_process(world2: list[dict[str, Any]], name: str) -> None:
    reference = train(strategy="cpu", tower=name == "builder")
    got = world2[0][name]
    if name == "ddp":
        assert [r[name]["data"] for r in world2] == [(0, 2), (1, 2)]
    else:
        assert got["strategy"] == "pipeline"
        assert [r[name]["data"] for r in world2] == [(0, 1), (0, 1)]  # one pipeline, one batch
    assert got["steps"] == STEPS
    assert_same_training(got, reference, losses=name != "accum")  # a pipeline counted once
    assert world2[1][name]["losses"] == got["losses"]  # every stage reports the loss
    assert got["odd"] == world2[1][name]["odd"] == (3, 3)  # evaluation takes any batch
    assert abs(got["eval_loss"] - reference["eval_loss"]) <= 1e-4


def test_batchnorm_statistics_follow_the_micro_batches(world2: list[dict[str, Any]]) -> None:
    """BatchNorm sees micro-batches, as with grad_accum in one process; the shape-finding pass
    on each stage's first step leaves its running statistics alone."""
    ref = train(strategy="cpu", norm=True, grad_accum=2)
    for name in ("norm", "norm_late"):  # BatchNorm in the first stage, then in the last
        got = world2[0][name]
        assert max_abs_diff(got["weights"], ref["weights"]) <= 1e-5  # running stats included


def test_bf16_pipeline_trains_close_to_fp32(
    world2: list[dict[str, Any]], reference: dict[str, Any]
) -> None:
    got = world2[0]["bf16"]
    assert got["steps"] == STEPS
    assert max(abs(a - b) for a, b in zip(got["losses"], reference["losses"], strict=True)) < 0.05


@pytest.fixture(scope="module")
def world4() -> list[dict[str, Any]]:
    return run_distributed(_scenarios, 4, 4, timeout=300)


@pytest.mark.parametrize("name", ["pp_fsdp", "pp_hsdp", "pp_fsdp_accum", "pp_tp"])
def test_pipeline_times_data_or_tensor_parallel_matches_one_process(
    world4: list[dict[str, Any]], reference: dict[str, Any], name: str
) -> None:
    """pp 2 x dp 2 (FSDP, HSDP, with accumulation) and pp 2 x tp 2 (stage 1's MLP split)."""
    if name == "pp_tp":
        assert [r[name]["data"] for r in world4] == [(0, 1)] * 4  # one pipeline of tp pairs
        # ranks 0, 1 hold stage 0 (no Linear pair inside it), ranks 2, 3 stage 1 (its MLP split)
        assert [r[name]["split"] for r in world4] == [False, False, True, True]
    else:
        assert [r[name]["data"] for r in world4] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    got = world4[0][name]
    assert got["steps"] == STEPS
    assert_same_training(got, reference, losses=name != "pp_fsdp_accum")


# -- checkpoints across layouts ----------------------------------------------------------------


def _save(ckpt: str, settings: dict[str, Any]) -> None:
    train(steps=3, save_at=3, ckpt_dir=ckpt, **settings)


def _resume(ckpt: str, settings: dict[str, Any]) -> dict[str, Any]:
    return train(steps=6, ckpt_dir=ckpt, resume=True, **settings)


def test_pipeline_checkpoint_resumes_in_one_process_and_as_a_pipeline() -> None:
    with tempfile.TemporaryDirectory() as work:
        ckpt = str(Path(work) / "ckpt")
        run_distributed(_save, 2, ckpt, dict(strategy="pipeline"))
        (folder,) = (p for p in Path(ckpt).iterdir() if p.name.startswith("step-"))
        info = inspect(folder)
        assert info["saved_by"]["mesh"] == "pp 2"
        convert(folder, Path(work) / "full.pt", to="pt")  # one unsharded file, every stage
        full = torch.load(Path(work) / "full.pt", weights_only=True)
        assert max_abs_diff(full, train(strategy="cpu", steps=3)["weights"]) <= 1e-5
        alone = _resume(ckpt, dict(strategy="cpu"))
        again = run_distributed(_resume, 2, ckpt, dict(pipeline_schedule="gpipe"))[0]
    ref = train(strategy="cpu", steps=6)
    for got in (alone, again):
        assert got["steps"] == 6
        assert max_abs_diff(got["weights"], ref["weights"]) <= 1e-5


def test_fsdp_checkpoint_resumes_as_a_pipeline() -> None:
    with tempfile.TemporaryDirectory() as work:
        ckpt = str(Path(work) / "ckpt")
        run_distributed(_save, 2, ckpt, dict(strategy="fsdp"))
        got = run_distributed(_resume, 2, ckpt, dict(strategy="pipeline"))[0]
    assert got["steps"] == 6
    assert max_abs_diff(got["weights"], train(strategy="cpu", steps=6)["weights"]) <= 1e-5
