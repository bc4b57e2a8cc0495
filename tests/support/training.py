"""Small models, data and loops shared by the tests: the same loop runs on 1 or N ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def dataset(n: int = 64, features: int = 6, classes: int = 3, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return TensorDataset(x, y)


def mlp(features: int = 6, classes: int = 3) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, classes)
    )


def make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


def train(
    *,
    optimizer: str = "sgd",
    batch_size: int,
    steps: int | None = None,
    epochs: int = 1,
    n: int = 64,
    **settings: Any,
) -> dict[str, Any]:
    """Train the MLP with ``pt.Run(**settings)``; return unwrapped weights, losses, step count."""
    with pt.Run(progress=False, seed=0, **settings) as run:
        model = mlp()
        opt = make_optimizer(optimizer, model)
        model, opt = run.setup(model, opt)
        loader = run.loader(dataset(n), batch_size=batch_size, shuffle=True)
        losses = []
        for _ in run.epochs(epochs):
            for x, y in loader:
                with run.accumulate(model):
                    loss = nn.functional.cross_entropy(model(x), y)
                    run.backward(loss)
                losses.append(loss.item())
                run.step(opt)
                if steps is not None and run.global_step >= steps:
                    break
        weights = run.strategy.full_state_dict(model)
        return {
            "weights": weights,
            "losses": losses,
            "steps": run.global_step,
            "rank": run.rank,
            "world": run.world_size,
            "strategy": run.strategy.name,
        }


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def assert_same_training(
    got: dict[str, Any], ref: dict[str, Any], *, losses: bool = True, tol: float = 1e-5
) -> None:
    """``got`` trained like the one-process ``ref``: steps, weights and evaluation count, and
    each step's loss unless ``losses=False`` (with accumulation a loss is a micro-batch's)."""
    assert got["steps"] == ref["steps"]
    assert max_abs_diff(got["weights"], ref["weights"]) <= tol
    if losses:
        assert max(abs(a - b) for a, b in zip(got["losses"], ref["losses"], strict=True)) <= tol
    assert got["correct"] == ref["correct"]


def saved_once(root: str | Path) -> Path:
    """A committed checkpoint of the untrained MLP with its SGD optimizer, in ``root``."""
    with pt.Run(progress=False, ckpt_dir=str(root), seed=0) as run:
        net = mlp()
        run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        folder = run.save()
    assert folder is not None
    return folder


def save_twice(root: str | Path, strategy: str = "cpu") -> dict[int, dict[str, torch.Tensor]]:
    """Two AdamW steps of the MLP, saved after each; the full weights after step 1 and 2."""
    out: dict[int, dict[str, torch.Tensor]] = {}
    with pt.Run(strategy=strategy, progress=False, ckpt_dir=root, keep_last=None, seed=0) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
        x, y = dataset(8)[:]
        for step in (1, 2):
            with run.accumulate(model):
                run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(opt)
            run.save()
            out[step] = run.strategy.full_state_dict(model)
    return out


def resume_saved(root: str | Path, strategy: str = "cpu") -> dict[str, Any]:
    """Resume what :func:`save_twice` wrote: the step reached and the full weights."""
    with pt.Run(strategy=strategy, progress=False, ckpt_dir=root, seed=0) as run:
        net = mlp()
        model, _ = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
        run.resume()
        return {"step": run.global_step, "weights": run.strategy.full_state_dict(model)}
