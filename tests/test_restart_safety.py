"""Resume defects found by porting public scripts (word_language_model, mnist), one process.

Each test is shaped like the script that found the defect: a loop that makes its own batches
inside ``run.epochs``, a DataLoader script compared with its one-process original, a script
reading ``len(train_loader.dataset)``, a ``ReduceLROnPlateau``, a second ``run.resume()``, and
``run.accumulation_window()``. The multi-rank ones (per-rank state, model methods under DDP and
FSDP) are in ``test_restart_safety_distributed.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import paratrain as pt
from paratrain.errors import ConfigError
from tests.support.training import dataset, max_abs_diff


class _Crash(Exception):
    pass


def _own_batches_run(ckpt: Path, *, crash_after_epoch: int | None) -> tuple[Any, int, list[int]]:
    """word_language_model's shape: batches cut by the script itself, a save per epoch."""
    data = torch.randn(40, 6, generator=torch.Generator().manual_seed(1))
    target = torch.randn(40, 1, generator=torch.Generator().manual_seed(2))
    steps_per_epoch: list[int] = []
    with pt.Run(strategy="cpu", ckpt_dir=ckpt, progress=False, seed=0) as run:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.05))
        run.resume()
        for epoch in run.epochs(3):
            before = run.global_step
            for i in range(0, 40, 8):  # the script's own batches: no run.loader
                loss = nn.functional.mse_loss(model(data[i : i + 8]), target[i : i + 8])
                run.backward(loss)
                run.step(opt)
            steps_per_epoch.append(run.global_step - before)
            run.save()
            if epoch == crash_after_epoch:
                raise _Crash
        return (
            {k: v.clone() for k, v in model.state_dict().items()},
            run.global_step,
            (steps_per_epoch),
        )


def test_epoch_end_save_in_own_batch_loop_resumes_at_the_next_epoch(tmp_path: Path) -> None:
    straight, steps, _ = _own_batches_run(tmp_path / "a", crash_after_epoch=None)
    with pytest.raises(_Crash):
        _own_batches_run(tmp_path / "b", crash_after_epoch=1)
    resumed, resumed_steps, epochs_run = _own_batches_run(tmp_path / "b", crash_after_epoch=None)
    assert epochs_run == [5]  # only epoch 2 ran again, not epoch 1 a second time
    assert resumed_steps == steps == 15
    assert max_abs_diff(resumed, straight) == 0.0


def test_mid_epoch_save_in_own_batch_loop_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        net = nn.Linear(6, 1)
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.05))
        x = torch.randn(8, 6)
        for _ in run.epochs(2):
            for i in range(4):
                run.backward(model(x).square().mean())
                run.step(opt)
                if i == 1:
                    run.save()  # in the middle of the epoch: paratrain cannot know the rest
    err = capsys.readouterr().err
    assert err.count("in the middle of epoch") == 1
    assert "run.loader" in err


def _with_dropout() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 3))


def _original_mnist_shape(train: TensorDataset, test: TensorDataset) -> dict[str, torch.Tensor]:
    """The one-process original: a DataLoader each for training and evaluation, dropout."""
    torch.manual_seed(0)
    model = _with_dropout()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = DistributedSampler(train, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=8, sampler=sampler)
    test_loader = DataLoader(test, batch_size=16)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            for x, _ in test_loader:
                model(x)
    return model.state_dict()


def _ported_mnist_shape(train: TensorDataset, test: TensorDataset) -> dict[str, torch.Tensor]:
    with pt.Run(strategy="cpu", progress=False, seed=0, run_dir=None) as run:
        net = _with_dropout()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        loader = run.loader(train, batch_size=8)
        test_loader = run.eval_loader(test, batch_size=16)
        for _ in run.epochs(3):
            model.train()
            for x, y in loader:
                run.backward(nn.functional.cross_entropy(model(x), y))
                run.step(opt)
            model.eval()
            with torch.no_grad():
                for x, _ in test_loader:
                    model(x)
        return {k: v.clone() for k, v in model.state_dict().items()}


def test_one_process_port_of_a_dataloader_script_is_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    train, test = dataset(40, seed=1), dataset(20, seed=2)
    original = _original_mnist_shape(train, test)
    ported = _ported_mnist_shape(train, test)
    assert max_abs_diff(ported, original) == 0.0


def test_loader_answers_what_scripts_read_from_a_dataloader(tmp_path: Path) -> None:
    data = dataset(40)
    with pt.Run(strategy="cpu", run_dir=tmp_path, progress=False) as run:
        loader = run.loader(data, batch_size=8, drop_last=True)
        evaluation = run.eval_loader(data, batch_size=16)
        assert loader.dataset is data and len(loader.dataset) == 40  # mnist's log line
        assert loader.batch_size == 8 and loader.drop_last is True
        assert len(loader.sampler) == 40 and len(loader) == 5
        assert loader.num_workers == 0 and loader.pin_memory is False  # the DataLoader's own
        assert evaluation.dataset is data and evaluation.batch_size is None  # a batch sampler
        with pytest.raises(AttributeError):
            _ = loader.no_such_attribute


def test_plateau_scheduler_in_run_step_is_refused_and_still_checkpointed(tmp_path: Path) -> None:
    x, y = dataset(16)[:]
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        net = nn.Linear(6, 3)
        opt = torch.optim.SGD(net.parameters(), lr=1.0)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
        model, opt = run.setup(net, opt, scheduler=plateau)
        run.backward(nn.functional.cross_entropy(model(x), y))
        with pytest.raises(ConfigError, match=r"scheduler.step\(metric\) yourself"):
            run.step(opt, plateau)
        run.step(opt)
        for metric in (1.0, 2.0, 3.0):  # no improvement twice: lr halves twice
            plateau.step(metric)
        run.save()
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        net = nn.Linear(6, 3)
        opt = torch.optim.SGD(net.parameters(), lr=1.0)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
        model, opt = run.setup(net, opt, scheduler=plateau)
        run.resume()
        assert plateau.best == 1.0 and opt.param_groups[0]["lr"] == 0.25


def test_second_resume_reloads_weights_changed_in_place(tmp_path: Path) -> None:
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        net = nn.Linear(6, 3)
        model, _ = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        run.save()
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        run.resume()
        run.unwrap(model).reset_parameters()  # no step since the last resume
        assert max_abs_diff(model.state_dict(), saved) > 0
        run.resume()  # a rollback: the weights come back
        assert max_abs_diff(model.state_dict(), saved) == 0.0


def test_accumulation_window_counts_micro_batches_since_the_last_step(tmp_path: Path) -> None:
    x, y = dataset(8)[:]
    with pt.Run(strategy="cpu", run_dir=tmp_path, progress=False, grad_accum=3) as run:
        net = nn.Linear(6, 3)
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        assert run.accumulation_window() == 0
        seen = []
        for _ in range(4):
            with run.accumulate(model):
                run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(opt)
            seen.append(run.accumulation_window(model))
        assert seen == [1, 2, 0, 1]
        other = nn.Linear(6, 3)
        run.setup(other)
        with pytest.raises(ConfigError, match="name the one"):
            run.accumulation_window()


def _break_run(ckpt: Path | None, *, stop: int, shape: str) -> tuple[Any, list[tuple[int, int]]]:
    """Two ``break`` shapes over ``run.loader`` (5 batches an epoch). ``"max_steps"``: leave
    both loops at step ``stop``, then save (train for N steps, save, continue later).
    ``"limit"``: each epoch stops after 3 batches (``limit_train_batches``) and saves at its
    end; the run stops after ``stop`` epochs."""
    x = torch.randn(40, 6, generator=torch.Generator().manual_seed(1))
    y = torch.randn(40, 1, generator=torch.Generator().manual_seed(2))
    seen: list[tuple[int, int]] = []
    with pt.Run(strategy="cpu", ckpt_dir=ckpt, progress=False, seed=0) as run:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
        model, opt = run.setup(net, torch.optim.Adam(net.parameters(), lr=0.01))
        loader = run.loader(TensorDataset(x, y), batch_size=8, shuffle=True)
        if ckpt is not None:
            run.resume()
        for epoch in run.epochs(4):
            for i, (xb, yb) in enumerate(loader):
                if shape == "limit" and i == 3:
                    break
                seen.append((epoch, int((xb[:, :1] * 1e4).sum())))
                run.backward(nn.functional.mse_loss(model(xb), yb))
                run.step(opt)
                if shape == "max_steps" and run.global_step == stop:
                    break
            if shape == "limit":
                if ckpt is not None:
                    run.save()
                if epoch + 1 == stop:
                    break
            elif run.global_step == stop:
                break
        if shape == "max_steps" and ckpt is not None:
            run.save()
        return {k: v.clone() for k, v in model.state_dict().items()}, seen


@pytest.mark.parametrize("shape", ["max_steps", "limit"])
def test_a_save_after_break_resumes_where_the_steps_stopped(tmp_path: Path, shape: str) -> None:
    """``max_steps``: the pass continues after the 3 batches trained (it started over, training
    them twice). ``limit``: the next epoch starts (the cut-short epoch is over)."""
    first, later = (3, 8) if shape == "max_steps" else (1, 3)
    straight, order = _break_run(None, stop=later, shape=shape)
    _, before = _break_run(tmp_path, stop=first, shape=shape)
    resumed, after = _break_run(tmp_path, stop=later, shape=shape)
    assert before + after == order
    assert max_abs_diff(resumed, straight) == 0.0


def _while_run(ckpt: Path | None, *, save_at: int | None) -> tuple[Any, list[int]]:
    """A `while` loop that leaves the loader every 3 steps and enters it again (no run.epochs):
    the next pass goes on after the batches trained; a save after a `break` resumes there."""
    x = torch.randn(40, 6, generator=torch.Generator().manual_seed(1))
    y = torch.randn(40, 1, generator=torch.Generator().manual_seed(2))
    seen: list[int] = []
    with pt.Run(strategy="cpu", ckpt_dir=ckpt, progress=False, seed=0) as run:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
        model, opt = run.setup(net, torch.optim.Adam(net.parameters(), lr=0.01))
        loader = run.loader(TensorDataset(x, y), batch_size=8, shuffle=True)
        if ckpt is not None:
            run.resume()
        while run.global_step < 14:
            for xb, yb in loader:
                seen.append(int((xb[:, :1] * 1e4).sum()))
                run.backward(nn.functional.mse_loss(model(xb), yb))
                run.step(opt)
                if run.global_step % 3 == 0 or run.global_step >= 14:
                    break
            if run.global_step == save_at:
                run.save()
                break
        return {k: v.clone() for k, v in model.state_dict().items()}, seen


def test_a_loader_entered_again_after_break_goes_on_and_resumes_alike(tmp_path: Path) -> None:
    straight, order = _while_run(None, save_at=None)
    assert len(set(order[:5])) == 5  # the first pass's 5 batches, not its first 3 again
    _, before = _while_run(tmp_path, save_at=6)
    resumed, after = _while_run(tmp_path, save_at=None)
    assert before + after == order
    assert max_abs_diff(resumed, straight) == 0.0


def test_a_break_after_the_last_batch_ends_the_pass() -> None:
    """``if step == max_steps: break`` on a pass's last batch (HF's ``run_clm_no_trainer``):
    the pass is over, so ``len(loader)`` after it is a whole pass and the next epoch trains one
    (it went on after the last batch: an empty pass, and ``x / len(loader)`` divided by 0)."""
    x = torch.randn(40, 6, generator=torch.Generator().manual_seed(1))
    with pt.Run(strategy="cpu", progress=False, seed=0) as run:
        net = nn.Linear(6, 1)
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.01))
        loader = run.loader(TensorDataset(x), batch_size=8, shuffle=True)
        per_epoch = []
        for _epoch in run.epochs(3):
            batches = 0
            for (xb,) in loader:
                run.backward(model(xb).square().mean())
                run.step(opt)
                batches += 1
                if batches == 5:
                    break
            per_epoch.append((batches, len(loader)))
    assert per_epoch == [(5, 5)] * 3
