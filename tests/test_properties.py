"""Properties over generated inputs: evaluation batches, accumulation against hand-written torch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import paratrain as pt
from paratrain.data.samplers import EvenBatchSampler
from paratrain.errors import ConfigError
from tests.support.training import dataset, max_abs_diff, mlp


@given(size=st.integers(0, 300), world=st.integers(1, 9), batch=st.integers(1, 40))
def test_even_batches_are_exact_once_and_equal_in_count(size: int, world: int, batch: int) -> None:
    if 0 < size < world:
        with pytest.raises(ConfigError, match="Evaluate on the main process"):
            EvenBatchSampler(size, rank=0, world_size=world, batch_size=batch)
        return
    ranks = [
        list(EvenBatchSampler(size, rank=r, world_size=world, batch_size=batch))
        for r in range(world)
    ]
    assert len({len(batches) for batches in ranks}) == 1  # the same number of forwards
    seen = sorted(i for batches in ranks for b in batches for i in b)
    assert seen == list(range(size))  # every sample once
    limit = max(batch, 2)
    assert all(1 <= len(b) <= limit for batches in ranks for b in batches)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(4, 40), batch=st.integers(1, 8), accum=st.integers(1, 5))
def test_accumulation_equals_hand_written_torch(n: int, batch: int, accum: int) -> None:
    """paratrain's loop vs the torch loop it replaces (loss / accum, step every accum
    micro-batches, a short last window weighted by accum / k), 2 epochs, no shuffle."""
    torch.manual_seed(0)
    ref = mlp()
    ours_net = mlp()
    ours_net.load_state_dict(ref.state_dict())
    data = dataset(n)
    with pt.Run(strategy="cpu", grad_accum=accum, progress=False) as run:
        model, opt = run.setup(ours_net, torch.optim.SGD(ours_net.parameters(), lr=0.1))
        loader = run.loader(data, batch_size=batch, shuffle=False)
        for _ in run.epochs(2):
            for x, y in loader:
                with run.accumulate(model):
                    run.backward(nn.functional.cross_entropy(model(x), y))
                run.step(opt)
        steps = run.global_step
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    batches = list(torch.utils.data.DataLoader(data, batch_size=batch))
    ref_steps = 0
    for _ in range(2):
        for i, (x, y) in enumerate(batches):
            (nn.functional.cross_entropy(ref(x), y) / accum).backward()
            last = i == len(batches) - 1
            if (i + 1) % accum == 0 or last:
                k = (i % accum) + 1
                for p in ref.parameters():
                    assert p.grad is not None
                    p.grad *= accum / k
                ref_opt.step()
                ref_opt.zero_grad()
                ref_steps += 1
    assert steps == ref_steps
    assert max_abs_diff(run.unwrap(model).state_dict(), ref.state_dict()) <= 1e-6
