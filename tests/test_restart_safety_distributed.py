"""Resume defects that need real ranks: per-rank tracked state, and a model's own methods
under DDP and FSDP (word_language_model's ``model.init_hidden(bsz)``, refused with the fix on
shards and working inside ``pt.gathered``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import paratrain as pt
from paratrain.errors import CheckpointError, ConfigError
from tests.support.distributed import run_distributed

pytestmark = pytest.mark.dist


class Accumulator:
    """A per-rank metric: each rank sums what it saw."""

    def __init__(self) -> None:
        self.total = torch.zeros(2)

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.total = state["total"].clone()


class TinyRNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.nhid = 4
        self.rnn = nn.GRU(3, self.nhid)
        self.out = nn.Linear(self.nhid, 2)

    def forward(self, x: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, hidden = self.rnn(x, hidden)
        return self.out(y), hidden

    def count(self) -> int:  # safe on shards: a DTensor's numel is the whole tensor's
        return sum(p.numel() for p in self.parameters())

    def init_hidden(self, bsz: int) -> torch.Tensor:
        weight = next(self.parameters())
        return weight.new_zeros(1, bsz, self.nhid)


def _save_per_rank(ckpt: str) -> None:
    with pt.Run(strategy="ddp", ckpt_dir=ckpt, progress=False, timeout_s=40) as run:
        run.setup(nn.Linear(3, 2))
        run.track(Accumulator(), "mine").total += run.rank + 1  # differs per rank
        run.track(Accumulator(), "same").total += 7  # equal on every rank
        run.save()


def _resume_per_rank(ckpt: str) -> list[list[float]]:
    with pt.Run(strategy="ddp", ckpt_dir=ckpt, progress=False, timeout_s=40) as run:
        run.setup(nn.Linear(3, 2))
        mine, same = run.track(Accumulator(), "mine"), run.track(Accumulator(), "same")
        run.resume()
        return [mine.total.tolist(), same.total.tolist()]


def _model_methods(strategy: str) -> list[float]:
    with pt.Run(strategy=strategy, progress=False, timeout_s=40, seed=0) as run:
        torch.manual_seed(0)
        net = TinyRNN()
        count = net.count()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        assert model.nhid == 4 and model.count() == count  # the user's own, through the wrapper
        if strategy == "fsdp":  # parameters are shards outside forward: refused with the fix
            with pytest.raises(ConfigError, match=r"TinyRNN.init_hidden\(\).*pt.gathered"):
                model.init_hidden(2)
        with pt.gathered(model):  # whole parameters (a no-op unless sharded)
            hidden = model.init_hidden(2)
        x = torch.randn(5, 2, 3, generator=torch.Generator().manual_seed(1))
        out, hidden = model(x, hidden)
        run.backward(out.square().mean())
        run.step(opt)
        return [float(hidden.detach().abs().sum())]


def _scenarios(ckpt: str) -> dict[str, Any]:
    _save_per_rank(ckpt)
    return {
        "per_rank": _resume_per_rank(ckpt),
        "ddp": _model_methods("ddp"),
        "fsdp": _model_methods("fsdp"),
    }


def test_per_rank_state_and_model_methods_on_two_ranks(tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    results = run_distributed(_scenarios, 2, ckpt)
    assert [r["per_rank"] for r in results] == [[[1.0, 1.0], [7.0, 7.0]], [[2.0, 2.0], [7.0, 7.0]]]
    assert results[0]["ddp"] == results[1]["ddp"] == results[0]["fsdp"]

    # ckpt inspect says where it resumes; one process: the equal state resumes, the per-rank
    # one is refused, naming it.
    from paratrain.checkpoint.inspection import inspect

    (folder,) = (p for p in Path(ckpt).iterdir() if p.name.startswith("step-"))
    assert inspect(folder)["resumes_under"]["world_size"].startswith("2 only: run.track state")
    with pt.Run(strategy="cpu", ckpt_dir=ckpt, progress=False) as run:
        run.setup(nn.Linear(3, 2))
        same = run.track(Accumulator(), "same")
        run.resume()
        assert same.total.tolist() == [7.0, 7.0]
        with pytest.raises(CheckpointError, match=r"run.track\('mine'\).*replicated=True"):
            run.track(Accumulator(), "mine")
    with pt.Run(strategy="cpu", ckpt_dir=ckpt, progress=False) as run:
        run.setup(nn.Linear(3, 2))
        mine = run.track(Accumulator(), "mine", replicated=True)  # rank 0's serves everyone
        run.resume()
        assert mine.total.tolist() == [1.0, 1.0]
