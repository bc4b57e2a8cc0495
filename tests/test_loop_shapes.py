"""Loops shaped the way real scripts are, in one process: own while loops, per-epoch schedulers,
several saves per step, restarts mid-loop, models built from checkpoint values."""

from __future__ import annotations

import pydoc
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import paratrain as pt
from paratrain.errors import ConfigError, EnvironmentMismatchError, ModelError
from tests.support.training import dataset, max_abs_diff, mlp


def test_resume_with_stateless_sgd(tmp_path: Path) -> None:
    # Plain SGD has no tensor state: resuming used to fail with "Expected device to be set".
    net = mlp()
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        x, y = dataset(8)[:]
        run.backward(nn.functional.cross_entropy(model(x), y))
        run.step(opt)
        run.save()
        before = {k: v.clone() for k, v in model.state_dict().items()}
    net = mlp()
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        run.resume()
        assert run.global_step == 1
        assert max_abs_diff(model.state_dict(), before) == 0.0


def _per_epoch_scheduler_run(ckpt: Path, *, stop_epoch: int | None, resume: bool) -> list[float]:
    """An ImageNet-shaped loop: LambdaLR stepped per epoch, given to resume() but not to save()."""
    with pt.Run(strategy="cpu", ckpt_dir=ckpt, progress=False, seed=0) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5**e)
        loader = run.loader(dataset(16), batch_size=8)
        if resume:
            run.resume(scheduler=sched)
        lrs = []
        for epoch in run.epochs(4):
            for x, y in loader:
                run.backward(nn.functional.cross_entropy(model(x), y))
                run.step(opt)
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
            run.save()
            if epoch == stop_epoch:
                break
        return lrs


def test_scheduler_given_to_resume_only_is_saved_and_restored(tmp_path: Path) -> None:
    straight = _per_epoch_scheduler_run(tmp_path / "a", stop_epoch=None, resume=False)
    first = _per_epoch_scheduler_run(tmp_path / "b", stop_epoch=1, resume=True)
    rest = _per_epoch_scheduler_run(tmp_path / "b", stop_epoch=None, resume=True)
    assert first + rest == straight == [0.05, 0.025, 0.0125, 0.00625]


def test_scheduler_registered_after_resume_gets_its_state(tmp_path: Path) -> None:
    for resume in (False, True):
        with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
            net = mlp()
            model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=1.0))
            if resume:
                run.resume()  # before the scheduler exists
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            x, y = dataset(8)[:]
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(opt, sched)  # registers the scheduler: its saved state is applied first
            lr = opt.param_groups[0]["lr"]
            run.save()
    assert lr == 0.25  # two steps over both runs, not a restarted schedule


def test_len_of_a_loader_is_the_pass_about_to_run(tmp_path: Path) -> None:
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        loader = run.loader(dataset(64), batch_size=8)
        assert len(loader) == 8
        for _ in run.epochs(1):
            for i, (x, y) in enumerate(loader):
                run.backward(nn.functional.cross_entropy(model(x), y))
                run.step(opt)
                if i == 3:
                    run.save()
                    break
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        loader = run.loader(dataset(64), batch_size=8)
        run.resume()
        sizes = []
        for _ in run.epochs(2):
            sizes.append(len(loader))
            sizes.append(sum(1 for _ in loader))
        assert sizes == [4, 4, 8, 8]


def _while_loop(run_dir: Path, *, kill_at: int | None) -> dict[str, Any]:
    """nanoGPT-shaped: own while loop on run.global_step, own batch sampling, no loader."""
    with pt.Run(strategy="cpu", run_dir=run_dir, progress=False, seed=3) as run:
        net = nn.Sequential(mlp(), nn.Dropout(0.3))
        model, opt = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
        data = dataset(64)
        best = 9.0
        while run.global_step < 12:  # reading global_step resumes a restarted worker
            idx = torch.randint(0, 64, (8,))
            x, y = data[idx]
            loss = nn.functional.cross_entropy(model(x), y)
            run.backward(loss)
            run.step(opt)
            best = min(best, loss.item())
            if run.global_step % 4 == 0:
                run.save(extras={"best": best})
            if run.global_step == kill_at:
                return {"extras": None}
        return {"weights": run.unwrap(model).state_dict(), "extras": run.extras}


def test_own_while_loop_resumes_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    straight = _while_loop(tmp_path / "a", kill_at=None)
    _while_loop(tmp_path / "b", kill_at=6)  # "killed" after step 6: newest checkpoint is step 4
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    restarted = _while_loop(tmp_path / "b", kill_at=None)
    assert max_abs_diff(restarted["weights"], straight["weights"]) == 0.0
    assert restarted["extras"] == {"best": straight["extras"] or restarted["extras"]["best"]}
    assert (tmp_path / "b" / "restarts.jsonl").read_text().count('"resumed": true') == 1


def test_latest_checkpoint_is_readable_before_setup(tmp_path: Path) -> None:
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        assert run.latest_checkpoint() is None
        run.setup(nn.Linear(4, 6))
        run.save(extras={"model_args": {"n_in": 4, "n_out": 6}})
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        info = run.latest_checkpoint()
        assert info is not None and info.step == 0
        args = info.extras["model_args"]
        model = run.setup(nn.Linear(args["n_in"], args["n_out"]))
        assert run.resume() == {"model_args": {"n_in": 4, "n_out": 6}}
        assert isinstance(model, nn.Linear)


def test_global_batch_derives_grad_accum() -> None:
    with pt.Run(strategy="cpu", global_batch=32, progress=False) as run:
        run.setup(mlp())
        run.loader(dataset(64), batch_size=8)
        assert run.loop.grad_accum == 4
    with pt.Run(strategy="cpu", global_batch=30, progress=False) as run:
        run.setup(mlp())
        with pytest.raises(ConfigError, match="not a multiple of per-rank batch 8"):
            run.loader(dataset(64), batch_size=8)
    with pytest.raises(ConfigError, match="Pass one of them"):
        pt.Run(strategy="cpu", global_batch=32, grad_accum=2)
    with pt.Run(strategy="cpu", global_batch=32, per_rank_batch=4, progress=False) as run:
        assert run.loop.grad_accum == 8  # a loop that draws its own batches (no run.loader)
        with pytest.raises(ConfigError, match="Use the same per-rank batch"):
            run.loader(dataset(64), batch_size=8)


def test_rank_seed_is_the_seed_on_rank_zero() -> None:
    with pt.Run(strategy="cpu", seed=5, progress=False) as run:
        assert run.rank_seed == 5


def test_comm_hook_bf16_on_gloo_is_refused_up_front() -> None:
    with pytest.raises(ConfigError, match="comm_hook='bf16' needs the nccl backend"):
        pt.Run(strategy="cpu", comm_hook="bf16")


def test_gpu_strategy_without_gpu_says_auto_chose_cpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("needs a machine without GPUs")
    with pytest.raises(EnvironmentMismatchError) as err:
        pt.Run(strategy="single")
    assert "accelerator='auto' chose the CPU" in str(err.value)
    assert "accelerator='cpu' was chosen" not in str(err.value)


def test_a_model_split_over_devices_is_not_collapsed() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2, device="meta"))
    with pt.Run(strategy="cpu", progress=False) as run, pytest.raises(ModelError, match="split"):
        run.setup(model)
    assert model[1].weight.device.type == "meta"


def test_a_config_changed_after_creation_is_checked_again() -> None:
    cfg = pt.RunConfig(strategy="cpu")
    cfg.grad_accum = 0
    with pytest.raises(ConfigError, match="grad_accum"):
        pt.Run(cfg)


def test_launcher_run_dir_conflict_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARATRAIN_RUN_DIR", str(tmp_path / "launcher"))
    with pytest.raises(ConfigError, match="launcher set --run-dir"):
        pt.Run(strategy="cpu", run_dir=tmp_path / "script")
    with pt.Run(strategy="cpu", progress=False) as run:
        assert run.run_dir == tmp_path / "launcher"


def test_run_reports_its_run_dir_to_the_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from paratrain.distributed.environment import read_report

    monkeypatch.setenv("PARATRAIN_REPORT", str(tmp_path / "report.json"))
    with pt.Run(strategy="cpu", run_dir=tmp_path / "mine", progress=False):
        pass
    report = read_report(tmp_path / "report.json")
    assert report is not None and report["run_dir"] == str((tmp_path / "mine").resolve())


def test_a_failing_start_leaves_no_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from paratrain.errors import ParatrainError

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if it were not installed
    with pytest.raises(ParatrainError, match="tensorboard"):
        pt.Run(strategy="ddp", tensorboard=True)
    assert not dist.is_initialized()
    with pytest.raises(ConfigError, match="not a multiple"):  # a check after the group exists
        pt.Run(strategy="ddp", global_batch=30, per_rank_batch=4)
    assert not dist.is_initialized()
    with pt.Run(strategy="ddp", progress=False) as run:  # and the next Run starts cleanly
        assert run.world_size == 1 and dist.is_initialized()
    assert not dist.is_initialized()


def test_changed_global_batch_is_reported_when_the_loader_comes_after_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False, grad_accum=2) as run:
        model = run.setup(mlp())
        run.loader(dataset(16), batch_size=4)
        run.save()
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        run.setup(mlp())
        run.resume(keep_global_batch=True)  # ImageNet order: resume, then build the loaders
        run.loader(dataset(16), batch_size=4)
        assert run.loop.grad_accum == 2
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        run.setup(mlp())
        run.resume()
        run.loader(dataset(16), batch_size=4)
    assert "global batch changed from 8 (saved) to 4" in capsys.readouterr().err
    assert model is not None


def test_setup_twice_and_overlong_names_are_refused() -> None:
    with pt.Run(strategy="cpu", progress=False) as run:
        net = mlp()
        run.setup(net)
        with pytest.raises(ModelError, match="already given to"):
            run.setup(net)
        with pytest.raises(ConfigError, match="1 to 64 letters"):
            run.setup(mlp(), name="a" * 65)


def test_help_lists_the_public_attributes_and_the_store_reads_well(tmp_path: Path) -> None:
    text = pydoc.render_doc(pt.Run, renderer=pydoc.plaintext)
    for name in ("device", "global_step", "epoch", "run_dir", "restart_count", "rank_seed"):
        assert f"{name}\n" in text or f" {name}" in text
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        run.setup(mlp())
        run.save()
        assert repr(run.store) == f"CheckpointStore({str(tmp_path)!r}, keep_last=3, checkpoints=1)"
        assert "strategy='cpu'" in repr(run)
