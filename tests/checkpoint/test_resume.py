"""Save / resume in one process: bit-identical continuation, verification, rotation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import paratrain as pt
from paratrain.checkpoint.loading import read_state_dict
from paratrain.errors import ConfigError
from tests.support.training import dataset, max_abs_diff, mlp


def train_run(
    ckpt: Path,
    *,
    epochs: int = 2,
    stop_at: int | None = None,
    resume: bool = False,
    **settings: Any,
) -> dict[str, Any]:
    """Train (optionally resuming); with ``stop_at``, save at that step and stop."""
    settings = {"strategy": "cpu", "progress": False, "ckpt_dir": ckpt, "seed": 0, **settings}
    with pt.Run(**settings) as run:
        net = nn.Sequential(mlp(), nn.Dropout(0.2))  # dropout: the RNG state matters
        model, opt = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        loader = run.loader(dataset(40), batch_size=4)
        if resume:
            assert run.resume(scheduler=sched) == {"note": "hi"}
        losses = []
        for _ in run.epochs(epochs):
            for x, y in loader:
                with run.accumulate(model):
                    loss = nn.functional.cross_entropy(model(x), y)
                    run.backward(loss)
                run.step(opt, sched)
                losses.append(loss.item())
                if stop_at is not None and run.global_step == stop_at:
                    run.save(extras={"note": "hi"})
                    return {"losses": losses}
        return {
            "losses": losses,
            "weights": run.unwrap(model).state_dict(),
            "lr": sched.get_last_lr(),
            "step": run.global_step,
        }


@pytest.mark.parametrize(
    "settings", [{}, {"grad_accum": 2}, {"precision": "fp16"}, {"async_save": True}]
)
def test_resume_mid_epoch_is_bit_identical(tmp_path: Path, settings: dict[str, Any]) -> None:
    straight = train_run(tmp_path / "a", **settings)
    first = train_run(tmp_path / "b", stop_at=13 // settings.get("grad_accum", 1), **settings)
    rest = train_run(tmp_path / "b", resume=True, **settings)
    assert first["losses"] + rest["losses"] == straight["losses"]
    assert max_abs_diff(rest["weights"], straight["weights"]) == 0.0
    assert rest["lr"] == straight["lr"] and rest["step"] == straight["step"]


def test_corrupt_newest_is_skipped_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_run(tmp_path, stop_at=4, keep_last=None)
    train_run(tmp_path, stop_at=8, keep_last=None, previous_run="share")
    newest = tmp_path / "step-00000008" / "model.safetensors"
    data = bytearray(newest.read_bytes())
    data[-3] ^= 0x10  # one flipped bit in a weight
    newest.write_bytes(bytes(data))
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        run.setup(nn.Sequential(mlp(), nn.Dropout(0.2)))
        run.resume()
        assert run.global_step == 4
    err = capsys.readouterr().err
    assert "skipping" in err and "step-00000008" in err and "checksum" in err


def test_rotation_keeps_the_newest_of_its_own_lineage(tmp_path: Path) -> None:
    for stop in (2, 4, 6, 8):  # one run, stopped and resumed three times
        train_run(tmp_path / "chain", stop_at=stop, keep_last=2, resume=stop > 2)
    assert sorted(p.name for p in (tmp_path / "chain").iterdir()) == [
        "step-00000006",
        "step-00000008",
    ]


def test_a_fresh_run_never_deletes_another_runs_checkpoints(tmp_path: Path) -> None:
    # Another experiment left higher steps in the (shared) directory; keep_last=1.
    train_run(tmp_path, stop_at=8, keep_last=1)
    share = {"keep_last": 1, "previous_run": "share"}  # a shared folder, on purpose
    train_run(tmp_path, stop_at=2, **share)  # a fresh run: its step 2 must survive
    train_run(tmp_path, stop_at=3, **share)  # a third fresh run
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["step-00000002", "step-00000003", "step-00000008"]
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        run.setup(nn.Sequential(mlp(), nn.Dropout(0.2)))
        run.resume()
        assert run.global_step == 3  # the newest save, not the highest step


def test_two_multi_node_jobs_in_one_checkpoint_dir_rotate_only_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from paratrain.checkpoint.manifest import Manifest
    from paratrain.commands.run.plan import RunOptions, make_plan

    script = tmp_path / "train.py"
    script.write_text("")
    shared = tmp_path / "ckpts"
    lineages = {}
    for job, keep_last in (("a", None), ("b", 2)):  # the same command line, submitted twice
        options = RunOptions(target=[str(script)], nnodes=2, rdzv_endpoint="node0:29400")
        argv = make_plan(options, env={}, gpus=0).argv
        rdzv = [a.split("=", 1)[1] for a in argv if a.startswith("--rdzv-id=")] or ["none"]
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", rdzv[0])  # what torchrun gives the ranks
        with pt.Run(
            strategy="cpu", progress=False, ckpt_dir=shared, run_dir=tmp_path / job,
            keep_last=keep_last, previous_run="share",
        ) as run:  # fmt: skip
            net = mlp()
            model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
            for _ in range(3):
                run.backward(model(torch.randn(4, 6)).sum())
                run.step(opt)
                run.save()
            lineages[job] = Manifest.read(run.save()).lineage  # type: ignore[arg-type]
    kept = [Manifest.read(folder).lineage for folder in sorted(shared.iterdir())]
    assert lineages["a"] != lineages["b"]
    assert kept.count(lineages["a"]) == 4 and kept.count(lineages["b"]) == 2


def test_two_saves_at_one_step_keep_the_newer_state(tmp_path: Path) -> None:
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        model = run.setup(mlp())
        first = run.save(extras={"best_acc1": 0.5})
        second = run.save(extras={"best_acc1": 0.9})  # e.g. an epoch-end save after a step save
        assert first is not None and second is not None and first != second
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        run.setup(mlp())
        assert run.resume() == {"best_acc1": 0.9}
    assert model is not None


def test_save_inside_an_accumulation_window_is_refused(tmp_path: Path) -> None:
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, grad_accum=2, progress=False) as run:
        model = run.setup(mlp())
        x, y = dataset(4)[:]
        with run.accumulate(model):
            run.backward(nn.functional.cross_entropy(model(x), y))
        with pytest.raises(ConfigError, match="accumulation window"):
            run.save()


def test_resume_without_checkpoint_starts_fresh(tmp_path: Path) -> None:
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path / "none", progress=False) as run:
        run.setup(mlp())
        assert run.resume() is None and run.global_step == 0


def test_checkpoint_files_are_plain_and_prefix_free(tmp_path: Path) -> None:
    train_run(tmp_path, stop_at=3)
    folder = tmp_path / "step-00000003"
    assert sorted(p.name for p in folder.iterdir()) == [
        "manifest.json",
        "manifest.xxh3",
        "model.safetensors",
        "optimizer.safetensors",
        "trainer.pt",
    ]
    state = read_state_dict(folder)[0]
    assert set(state) == {f"0.{k}" for k in mlp().state_dict()}
    torch.load(folder / "trainer.pt", weights_only=True)  # no pickled code inside


def test_compiled_submodules_save_without_orig_mod(tmp_path: Path) -> None:
    inner = mlp()
    net = nn.Sequential(nn.Linear(6, 6), torch.compile(inner))
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        model = run.setup(net)
        folder = run.save()
        weights = run.save_weights(model, tmp_path / "w.pt")
    assert folder is not None
    expected = {"0.weight", "0.bias", *(f"1.{k}" for k in mlp().state_dict())}
    assert set(pt.checkpoint.loading.read_state_dict(folder)[0]) == expected
    assert set(torch.load(weights, weights_only=True)) == expected


def test_changed_global_batch_is_kept_through_grad_accum_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_run(tmp_path, stop_at=3)  # per-rank batch 4, world 1: global batch 4
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        run.setup(nn.Sequential(mlp(), nn.Dropout(0.2)))
        run.loader(dataset(40), batch_size=2)
        run.resume(keep_global_batch=True)
        assert run.config.grad_accum == 2
    assert "grad_accum set to 2 to keep the global batch 4" in capsys.readouterr().out


def test_state_with_uncommon_dtypes_saves_and_resumes(tmp_path: Path) -> None:
    def model() -> nn.Module:
        net = nn.Linear(2, 2)
        net.register_buffer("codes", torch.tensor([1, 2, 3], dtype=torch.int32).to(torch.uint16))
        net.register_buffer("scales", torch.tensor([0.5, 2.0]).to(torch.float8_e4m3fn))
        return net

    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        saved = run.setup(model())
        run.save()
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        restored = run.setup(model())
        run.resume()
    for name in ("codes", "scales"):
        a, b = getattr(saved, name), getattr(restored, name)
        assert a.dtype == b.dtype and bytes(a.view(torch.uint8)) == bytes(b.view(torch.uint8))


@pytest.mark.parametrize("enabled", [True, False])
def test_no_garbage_collection_runs_inside_a_save_or_a_resume(
    tmp_path: Path, enabled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full collection walks every object of the process (0.2 s once torch is loaded) and
    the other ranks wait for it: writing and reading a checkpoint run with the collector
    paused, and leave it as the script had it (enabled, or disabled on purpose)."""
    import gc

    from paratrain.runtime import save_restore

    collections: list[str] = []
    inside: list[str] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(inside[-1] if inside else "outside")

    def labelled(name: str, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            inside.append(name)
            try:
                return original(*args, **kwargs)
            finally:
                inside.pop()

        return call

    for name in ("save", "resume"):
        monkeypatch.setattr(save_restore, name, labelled(name, getattr(save_restore, name)))
    threshold = gc.get_threshold()
    gc.callbacks.append(count)
    gc.set_threshold(1)  # a collection at nearly every allocation, when enabled
    try:
        (gc.enable if enabled else gc.disable)()
        with pt.Run(strategy="cpu", progress=False, ckpt_dir=tmp_path, seed=0) as run:
            net = mlp()
            model, opt = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
            with run.accumulate(model):
                run.backward(model(torch.randn(4, 6)).sum())
            run.step(opt)
            run.save()
            assert gc.isenabled() is enabled
            assert run.resume() == {}
            assert gc.isenabled() is enabled
            gc.collect()  # counted too: the callback sees collections
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*threshold)
        gc.enable()
    assert "outside" in collections
    assert "save" not in collections and "resume" not in collections
