"""Tensor parallel, FSDP x TP and HSDP on real gloo ranks equal one process on the same global
batch (AdamW, clipping, 5 steps), and their checkpoints resume under other layouts."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt
from paratrain.checkpoint.inspection import convert, inspect
from tests.support.distributed import run_distributed
from tests.support.training import assert_same_training, max_abs_diff, mlp

pytestmark = pytest.mark.dist

GLOBAL_BATCH = 8
STEPS = 5


class Block(nn.Module):
    """Pre-norm attention (separate q, k, v, o) and an MLP, as in GPT-style models."""

    def __init__(self, d: int = 16, heads: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads = heads
        self.norm = nn.LayerNorm(d)
        self.q_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(3))
        # A key bias gets a zero gradient in exact arithmetic (softmax ignores a shift common
        # to all keys); AdamW would blow its rounding noise up to full steps.
        self.k_proj = nn.Linear(d, d, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.norm(x)
        q, k, v = (
            proj(h).view(b, t, self.n_heads, -1).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.o_proj(a.transpose(1, 2).reshape(b, t, -1)))
        return x + self.drop(self.mlp(x))


class Net(nn.Module):
    def __init__(self, dropout: float = 0.0, classes: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(6, 16)
        self.block = Block(dropout=dropout)
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(x)).mean(1))


PLAN = pt.tp.attention("block", heads=("n_heads",)) | pt.tp.mlp("block.mlp", up="0", down="2")


def sequences(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(n, 5, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


def train(
    *,
    steps: int = STEPS,
    model: str = "net",
    dropout: float = 0.0,
    ckpt_dir: str | None = None,
    save_at: int | None = None,
    resume: bool = False,
    loss_fn: bool = False,
    classes: int = 3,
    **settings: Any,
) -> dict[str, Any]:
    """AdamW with clipping on the global batch; returns rank 0's full weights and the losses.

    ``loss_fn``: the loss comes from ``model(x, target=y)`` (loss parallel when the plan has
    ``pt.tp.output``, which needs a class count tp divides)."""
    with pt.Run(progress=False, seed=0, max_grad_norm=0.5, ckpt_dir=ckpt_dir, **settings) as run:
        net = Net(dropout, classes) if model == "net" else _seeded_mlp()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.01)
        seen: set[str] = set()  # what the loss function received: split logits are a DTensor

        def criterion(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            seen.add(type(output).__name__)
            return nn.functional.cross_entropy(output, target)

        net, opt = run.setup(net, opt, loss_fn=criterion if loss_fn else None)
        per_rank = GLOBAL_BATCH // (run.data_size * run.config.grad_accum)
        data = sequences() if model == "net" else _flat()
        loader = run.loader(data, batch_size=per_rank, shuffle=True)
        if resume:
            run.resume()
        losses, local = [], []
        for _ in run.epochs(2):
            for x, y in loader:
                with run.accumulate(net):
                    loss = net(x, target=y) if loss_fn else nn.functional.cross_entropy(net(x), y)
                    run.backward(loss)
                run.step(opt)
                losses.append(run.reduce(loss.item(), "mean"))
                local.append(loss.item())
                if save_at is not None and run.global_step == save_at:
                    run.save()
                if run.global_step >= steps:
                    break
            if run.global_step >= steps:
                break
        correct = sum(int((net(x).argmax(1) == y).sum()) for x, y in run.eval_loader(data, 16))
        return {
            "weights": run.strategy.full_state_dict(net),
            "losses": losses,
            "local_losses": local,
            "correct": run.reduce(correct, "sum"),
            "steps": run.global_step,
            "data": (run.data_rank, run.data_size),
            "strategy": run.strategy.name,
            "loss_saw": sorted(seen),
        }


def _seeded_mlp() -> nn.Module:
    torch.manual_seed(0)
    return mlp()


def _flat() -> TensorDataset:
    x, y = sequences()[:]
    return TensorDataset(x[:, 0], y)


SCENARIOS: dict[int, dict[str, dict[str, Any]]] = {
    2: {
        "tp": dict(strategy="tp", tp_plan=PLAN),
        "tp_auto": dict(strategy="tp", tp_plan="auto", model="mlp"),
        "tp_dropout": dict(strategy="tp", tp_plan=PLAN, dropout=0.2),
        "tp_accum": dict(strategy="tp", tp_plan=PLAN, grad_accum=2),
        "loss_parallel": dict(tp_plan=PLAN | pt.tp.output("head"), classes=4, loss_fn=True),
        "output_gathered": dict(tp_plan=PLAN | pt.tp.output("head"), classes=4),
    },
    4: {
        "fsdp_tp": dict(strategy="tp", mesh={"dp": 2, "tp": 2}, tp_plan=PLAN),
        "hsdp": dict(strategy="fsdp", mesh={"dp_replicate": 2, "dp": 2}),
        "hsdp_tp": dict(mesh={"dp_replicate": 2, "dp": -1, "tp": 2}, tp_plan=PLAN, model="net"),
        "fsdp_tp_accum": dict(mesh={"dp": 2, "tp": 2}, tp_plan=PLAN, grad_accum=2),
    },
}


def _scenarios(world: int) -> dict[str, Any]:
    return {name: train(**settings) for name, settings in SCENARIOS[world].items()}


@pytest.fixture(scope="module")
def world2() -> list[dict[str, Any]]:
    return run_distributed(_scenarios, 2, 2)


@pytest.fixture(scope="module")
def world4() -> list[dict[str, Any]]:
    return run_distributed(_scenarios, 4, 4, timeout=300)


def _reference(model: str = "net") -> dict[str, Any]:
    return train(strategy="cpu", model=model)


@pytest.mark.parametrize("name", ["tp", "tp_auto", "tp_accum", "loss_parallel", "output_gathered"])
def test_tensor_parallel_matches_one_process(world2: list[dict[str, Any]], name: str) -> None:
    """``loss_parallel``: the cross-entropy on logits split over the classes;
    ``output_gathered``: the same plan with the loss computed by the caller on whole logits."""
    scenario = SCENARIOS[2][name]
    ref = train(
        strategy="cpu", model=scenario.get("model", "net"), classes=scenario.get("classes", 3)
    )
    got = world2[0][name]
    assert got["strategy"] == "tp" and got["data"] == (0, 1)
    assert [r[name]["data"] for r in world2] == [(0, 1), (0, 1)]  # one tp group, one batch
    assert got["steps"] == STEPS
    assert_same_training(got, ref, losses="accum" not in name)  # a tp group counted once
    assert got["loss_saw"] == (["DTensor"] if name == "loss_parallel" else [])


def test_ranks_of_a_tp_group_draw_the_same_dropout(world2: list[dict[str, Any]]) -> None:
    a, b = (r["tp_dropout"] for r in world2)
    assert a["local_losses"] == b["local_losses"]  # identical masks on replicated activations
    no_dropout = world2[0]["tp"]["weights"]
    assert max_abs_diff(a["weights"], no_dropout) > 1e-4  # dropout did act


@pytest.mark.parametrize("name", ["fsdp_tp", "hsdp", "hsdp_tp", "fsdp_tp_accum"])
def test_two_dimensional_meshes_match_one_process(world4: list[dict[str, Any]], name: str) -> None:
    ref = _reference()
    got = world4[0][name]
    data_size = 4 if name == "hsdp" else 2
    assert [r[name]["data"][1] for r in world4] == [data_size] * 4
    assert got["steps"] == STEPS
    assert_same_training(got, ref, losses="accum" not in name)


# -- checkpoints across layouts ----------------------------------------------------------------


def _save(ckpt: str, settings: dict[str, Any]) -> None:
    train(steps=3, save_at=3, ckpt_dir=ckpt, **settings)


def _resume(ckpt: str, settings: dict[str, Any]) -> dict[str, Any]:
    return train(steps=6, ckpt_dir=ckpt, resume=True, **settings)


def test_tp_checkpoint_resumes_under_ddp_and_one_process() -> None:
    with tempfile.TemporaryDirectory() as work:
        ckpt = str(Path(work) / "ckpt")
        run_distributed(_save, 2, ckpt, dict(strategy="tp", tp_plan=PLAN))
        manifest = json_of(ckpt)
        assert manifest["mesh"] == {"dp_replicate": 1, "dp": 1, "tp": 2}
        assert manifest["format_version"] == 7 and manifest["global_batch"] == GLOBAL_BATCH
        (folder,) = (p for p in Path(ckpt).iterdir() if p.name.startswith("step-"))
        assert inspect(folder)["saved_by"]["mesh"] == "tp 2"
        convert(folder, Path(work) / "full.pt", to="pt")  # one unsharded file
        full = torch.load(Path(work) / "full.pt", weights_only=True)
        at_save = train(strategy="cpu", steps=3)["weights"]
        assert max_abs_diff(full, at_save) <= 1e-5
        ddp = run_distributed(_resume, 2, ckpt, dict(strategy="ddp"))[0]
        alone = _resume(ckpt, dict(strategy="cpu"))
    ref = train(strategy="cpu", steps=6)
    for got in (ddp, alone):
        assert got["steps"] == 6
        assert max_abs_diff(got["weights"], ref["weights"]) <= 1e-5


def test_fsdp_tp_checkpoint_resumes_under_fsdp_at_half_the_ranks() -> None:
    with tempfile.TemporaryDirectory() as work:
        ckpt = str(Path(work) / "ckpt")
        run_distributed(_save, 4, ckpt, dict(strategy="tp", mesh={"dp": 2, "tp": 2}, tp_plan=PLAN))
        (folder,) = (p for p in Path(ckpt).iterdir() if p.name.startswith("step-"))
        assert inspect(folder)["saved_by"]["mesh"] == "dp 2 x tp 2"
        fsdp = run_distributed(_resume, 2, ckpt, dict(strategy="fsdp"))[0]
    ref = train(strategy="cpu", steps=6)
    assert fsdp["steps"] == 6
    assert max_abs_diff(fsdp["weights"], ref["weights"]) <= 1e-5


def json_of(ckpt: str) -> dict[str, Any]:
    import json

    (folder,) = (p for p in Path(ckpt).iterdir() if p.name.startswith("step-"))
    return dict(json.loads((folder / "manifest.json").read_text()))
