"""async_save: what is written is the state at the call, while training goes on at once."""

from __future__ import annotations

import contextlib
import copy
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

import paratrain as pt
from tests.support.training import dataset, mlp


def _train_steps(run: pt.Run, model: nn.Module, opt: Any, sched: Any, n: int) -> None:
    x, y = dataset(8)[:]
    for _ in range(n):
        with run.accumulate(model):
            run.backward(nn.functional.cross_entropy(model(x), y))
        run.step(opt, sched)


@contextlib.contextmanager
def _async_run(ckpt: Path) -> Iterator[tuple[pt.Run, nn.Module, Any, Any]]:
    """A run with ``async_save`` training an MLP with AdamW and a StepLR schedule."""
    with pt.Run(
        strategy="cpu", ckpt_dir=ckpt, async_save=True, keep_last=None, progress=False
    ) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
        yield run, model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def _resumed(folder: Path, work: Path) -> tuple[dict[str, Any], dict[str, Any], int]:
    alone = work / folder.name  # a directory holding only this checkpoint
    shutil.copytree(folder, alone / folder.name)
    with pt.Run(strategy="cpu", ckpt_dir=alone, progress=False) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        run.resume(scheduler=sched)
        return run.unwrap(model).state_dict(), opt.state_dict(), run.global_step


def test_each_async_save_holds_the_state_of_its_own_call(tmp_path: Path) -> None:
    snapshots: dict[Path, tuple[dict[str, Any], dict[str, Any], int]] = {}
    with _async_run(tmp_path / "ckpt") as (run, model, opt, sched):
        for _ in range(3):  # later saves reuse the staging buffers of earlier ones
            _train_steps(run, model, opt, sched, 2)
            state = copy.deepcopy((run.unwrap(model).state_dict(), opt.state_dict()))
            folder = run.save()
            assert folder is not None
            snapshots[folder] = (*state, run.global_step)
            _train_steps(run, model, opt, sched, 1)  # mutates weights, moments and lr at once
            with torch.no_grad():  # and an in-place edit outside any optimizer
                for p in model.parameters():
                    p.mul_(0.5)
    assert len(snapshots) == 3
    for folder, (weights, optim, step) in snapshots.items():
        got_weights, got_optim, got_step = _resumed(folder, tmp_path / "alone")
        assert got_step == step
        assert all(torch.equal(got_weights[k], v) for k, v in weights.items())
        assert got_optim["param_groups"] == optim["param_groups"]  # the lr of that moment
        for index, entry in optim["state"].items():
            for key, value in entry.items():
                assert torch.equal(torch.as_tensor(got_optim["state"][index][key]), value)


def test_staging_copies_in_parallel_pieces_equal_plain_copies() -> None:
    from paratrain.checkpoint.store import copy_in_parallel

    torch.manual_seed(0)
    sources = [
        torch.randn(3 * 2**20 + 5),  # 12 MiB: split into pieces over threads
        torch.randn(2048, 2048).t(),  # not contiguous: copied whole
        torch.arange(7, dtype=torch.int64),
        torch.randn(2**21).to(torch.bfloat16)[::2],
    ]
    targets = [torch.full_like(s, -1) for s in sources]
    copy_in_parallel(list(zip(targets, sources, strict=True)))
    for target, source in zip(targets, sources, strict=True):
        assert torch.equal(target, source)


def test_the_first_async_save_copies_into_buffers_made_after_the_first_step(
    tmp_path: Path,
) -> None:
    """The host buffers of the first save are allocated in the background after the first
    optimizer step, so that save stalls no longer than later ones; what it writes is still
    the state of its call."""
    with _async_run(tmp_path / "ckpt") as (run, model, opt, sched):
        _train_steps(run, model, opt, sched, 1)
        store: Any = run.store
        assert store._preparing is not None
        store._preparing.join()
        spare = {b.data_ptr() for buffers in store._spare.values() for b in buffers}
        want = {k: v.clone() for k, v in run.unwrap(model).state_dict().items()}
        folder = run.save()
        staged = {b.data_ptr() for b in store._staging.values() if b.numel()}
        run.store.wait()
    assert staged and staged <= spare  # every buffer of the save was made beforehand
    assert not store._spare  # the leftovers are dropped
    weights, _, step = _resumed(folder, tmp_path / "alone")
    assert step == 1 and all(torch.equal(weights[k], v) for k, v in want.items())
