"""Resume on real gloo ranks: bit-identical for ddp and fsdp, and across world sizes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import paratrain as pt
from paratrain.errors import CheckpointError
from tests.support.distributed import run_distributed
from tests.support.training import dataset, max_abs_diff, mlp

pytestmark = pytest.mark.dist
STRATEGIES = ("ddp", "fsdp", "fsdp-bf16")  # bf16 under fsdp: FSDP2's MixedPrecisionPolicy
STOP = 7  # mid-epoch 1: 40 samples / (2 ranks x 4) = 5 steps per epoch


def _train(
    ckpt: Path,
    strategy: str,
    *,
    stop_at: int | None = None,
    resume: bool = False,
    epochs: int = 2,
    extra_steps: int | None = None,
) -> dict[str, Any]:
    name, _, precision = strategy.partition("-")
    with pt.Run(
        strategy=name, precision=precision or "fp32", progress=False, ckpt_dir=ckpt, seed=0
    ) as run:
        net = nn.Sequential(mlp(), nn.Dropout(0.2))
        model, opt = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
        loader = run.loader(dataset(40), batch_size=4)
        out: dict[str, Any] = {"losses": []}
        if resume:
            run.resume()
            out["resumed_weights"] = run.strategy.full_state_dict(model)
            out["resumed_step"] = run.global_step
        for _ in run.epochs(epochs):
            for x, y in loader:
                with run.accumulate(model):
                    loss = nn.functional.cross_entropy(model(x), y)
                    run.backward(loss)
                run.step(opt)
                out["losses"].append(loss.item())
                if stop_at is not None and run.global_step == stop_at:
                    run.save()
                    out["weights"] = run.strategy.full_state_dict(model)
                    return out
                if extra_steps is not None and run.global_step == out["resumed_step"] + extra_steps:
                    out["weights"] = run.strategy.full_state_dict(model)
                    return out
        out["weights"] = run.strategy.full_state_dict(model)
        out["steps"] = run.global_step
        return out


def _first_half(root: str) -> dict[str, Any]:
    return {
        s: {
            "straight": _train(Path(root) / s / "a", s),
            "first": _train(Path(root) / s / "b", s, stop_at=STOP),
        }
        for s in STRATEGIES
    }


def _second_half(root: str) -> dict[str, Any]:
    out: dict[str, Any] = {s: _train(Path(root) / s / "b", s, resume=True) for s in STRATEGIES}
    # No watchdog: rank 1 idles on purpose while rank 0 waits in save().
    with pt.Run(
        strategy="ddp", progress=False, ckpt_dir=Path(root) / "lonely", timeout_s=3, watchdog=False
    ) as run:
        model = run.setup(mlp())
        if run.rank == 0:
            try:
                run.save(model=model)
                out["lonely"] = "no error"
            except CheckpointError as err:
                out["lonely"] = str(err)
        else:
            time.sleep(6)  # rank 1 never calls save
    return out


def _continue(root: str) -> dict[str, Any]:
    return {s: _train(Path(root) / s / "b", s, resume=True, extra_steps=3) for s in STRATEGIES}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = str(tmp_path_factory.mktemp("resume"))
    first = run_distributed(_first_half, 2, root)
    second = run_distributed(_second_half, 2, root)
    return {"root": root, "first": first, "second": second}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_resume_in_a_new_process_group_is_bit_identical(
    runs: dict[str, Any], strategy: str
) -> None:
    for rank in (0, 1):
        straight = runs["first"][rank][strategy]["straight"]
        first = runs["first"][rank][strategy]["first"]
        rest = runs["second"][rank][strategy]
        assert first["losses"] + rest["losses"] == straight["losses"]
    assert (
        max_abs_diff(
            runs["second"][0][strategy]["weights"],
            runs["first"][0][strategy]["straight"]["weights"],
        )
        == 0.0
    )


def test_save_from_rank_0_alone_fails_with_the_fix(runs: dict[str, Any]) -> None:
    message = runs["second"][0]["lonely"]
    assert "every rank must call it" in message and "1" in message


@pytest.mark.parametrize("world", [1, 3])
def test_resharded_resume_restores_the_model_and_continues(
    runs: dict[str, Any], world: int
) -> None:
    if world == 1:
        results = [_continue(runs["root"])]
    else:
        results = run_distributed(_continue, world, runs["root"])
    for strategy in STRATEGIES:
        saved = runs["first"][0][strategy]["first"]["weights"]
        resumed = results[0][strategy]
        assert resumed["resumed_step"] == STOP
        assert max_abs_diff(resumed["resumed_weights"], saved) == 0.0, strategy
        # 24 samples are left of epoch 1: world 1 stops after its 3 extra steps, world 3 (12 per
        # step) runs out of data after 2.
        assert len(resumed["losses"]) == {1: 3, 3: 2}[world]
        assert all(torch.isfinite(torch.tensor(resumed["losses"])))
        assert max_abs_diff(resumed["weights"], saved) > 0  # and training went on
