"""Several models and evaluation with buffers on 2 real gloo ranks, compared with one process."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt
from tests.support.distributed import run_distributed
from tests.support.training import max_abs_diff
from tests.test_many import handwritten_gan, paratrain_gan

pytestmark = pytest.mark.dist


def bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def bn_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(n, 6, generator=g) * 2 + 1, torch.randint(0, 3, (n,), generator=g)
    )


def evaluate(model: nn.Module, run: pt.Run, *, no_grad: bool) -> tuple[int, int]:
    model.eval()
    correct = total = 0
    with torch.no_grad() if no_grad else torch.enable_grad():
        for x, y in run.eval_loader(bn_data(17, seed=3), batch_size=4):  # 9 vs 8 samples
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    model.train()
    return run.reduce(correct), run.reduce(total)


def _eval_with_batchnorm(strategy: str, wrap: Any) -> dict[str, Any]:
    with pt.Run(strategy=strategy, progress=False, timeout_s=40, fsdp_wrap=wrap) as run:
        net = bn_model()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        for x, y in run.loader(bn_data(32, seed=1), batch_size=4):  # ranks see other data
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(opt)
        results = [evaluate(model, run, no_grad=False), evaluate(model, run, no_grad=True)]
        return {"eval": results, "weights": run.strategy.full_state_dict(model)}


def _scenarios() -> dict[str, Any]:
    out: dict[str, Any] = {"gan": paratrain_gan(batch_size=4, strategy="ddp")}
    out["ddp_bn"] = _eval_with_batchnorm("ddp", ())
    out["fsdp_bn"] = _eval_with_batchnorm("fsdp", (nn.Linear,))
    with pt.Run(strategy="ddp", progress=False, seed=4) as run:
        out["reduced"] = (
            run.reduce(np.float32(1.5)),
            run.reduce(np.array(0.25, dtype=np.float32)),
            run.reduce(np.array([1, 2]), "max"),
        )
        run.setup(nn.Linear(2, 2))
        out["draws"] = torch.rand(3)  # after setup: this rank's own stream
        out["rank_seed"] = run.rank_seed
    with pt.Run(strategy="fsdp", progress=False) as run:
        run.setup(nn.Linear(3, 3))
        second = nn.Linear(3, 3)  # built from per-rank random numbers
        out["init"] = {k: v.clone() for k, v in second.state_dict().items()}
        wrapped = run.setup(second, name="second")
        out["second"] = run.strategy.full_state_dict(wrapped)
        out["rank"] = run.rank
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_distributed(_scenarios, 2)


def test_gan_with_accumulation_on_two_ranks_matches_torch(ranks: list[dict[str, Any]]) -> None:
    ours, ref = ranks[0]["gan"], handwritten_gan(micro_batch=8)
    assert ours["stepped"] == {"D": 2, "G": 2} and ours["global_step"] == 2
    assert max_abs_diff(ours["D"], ref["D"]) <= 1e-6
    assert max_abs_diff(ours["G"], ref["G"]) <= 1e-6


@pytest.mark.parametrize("name", ["ddp_bn", "fsdp_bn"])
def test_eval_with_batchnorm_on_an_odd_set_neither_hangs_nor_miscounts(
    ranks: list[dict[str, Any]], name: str
) -> None:
    model = bn_model()
    model.load_state_dict(ranks[0][name]["weights"])  # what a save would hold
    model.eval()
    x, y = bn_data(17, seed=3).tensors
    with torch.no_grad():
        expected = (int((model(x).argmax(1) == y).sum()), 17)
    assert ranks[0][name]["eval"] == [expected, expected]
    assert ranks[1][name]["eval"] == [expected, expected]


def test_reduce_numpy_values(ranks: list[dict[str, Any]]) -> None:
    scalar, zero_d, array = ranks[1]["reduced"]
    assert isinstance(scalar, np.float32) and scalar == 3.0
    assert float(zero_d) == 0.5  # not truncated to an int
    assert array.tolist() == [1, 2]


def test_each_rank_draws_its_own_random_numbers(ranks: list[dict[str, Any]]) -> None:
    assert not torch.equal(ranks[0]["draws"], ranks[1]["draws"])
    assert ranks[0]["rank_seed"] == 4 and ranks[1]["rank_seed"] != 4
    with pt.Run(strategy="cpu", progress=False, seed=4) as run:
        run.setup(nn.Linear(2, 2))
        assert torch.equal(torch.rand(3), ranks[0]["draws"])  # rank 0 = one process


def test_fsdp_models_agree_across_ranks_whatever_their_init(ranks: list[dict[str, Any]]) -> None:
    assert max_abs_diff(ranks[0]["init"], ranks[1]["init"]) > 0  # the ranks built different ones
    assert max_abs_diff(ranks[0]["second"], ranks[0]["init"]) == 0.0  # rank 0's, on every shard
