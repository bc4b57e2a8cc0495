"""Several models, optimizers and loaders in one run, in one process, each compared with the
hand-written torch loop it replaces."""

from __future__ import annotations

import copy
import enum
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel
from torch.utils.data import IterableDataset, TensorDataset

import paratrain as pt
from paratrain.data.build import make_loader
from paratrain.errors import CheckpointError, ConfigError
from tests.support.distributed import rank_of_two
from tests.support.training import dataset, max_abs_diff, mlp


def gan_pair(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)), nn.Linear(2, 4)


def gan_data(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(11)
    return TensorDataset(torch.randn(n, 4, generator=g))


def gan_losses(d: nn.Module, g: nn.Module, x: torch.Tensor) -> tuple[Any, Any, Any]:
    """(D loss, G loss, noise); noise is derived from the batch so every setup draws the same."""
    z = x[:, :2] * 0.5 + x[:, 2:]
    bce = nn.functional.binary_cross_entropy_with_logits
    real, fake = d(x), d(g(z).detach())
    loss_d = bce(real, torch.ones_like(real)) + bce(fake, torch.zeros_like(fake))
    return loss_d, z, bce


def paratrain_gan(batch_size: int, steps_per: int = 2, **settings: Any) -> dict[str, Any]:
    """A GAN: D then G each micro-batch, each in its own accumulate and step."""
    with pt.Run(progress=False, grad_accum=steps_per, **settings) as run:
        d_net, g_net = gan_pair()
        d, opt_d = run.setup(d_net, torch.optim.SGD(d_net.parameters(), lr=0.1), name="D")
        g, opt_g = run.setup(g_net, torch.optim.SGD(g_net.parameters(), lr=0.1), name="G")
        loader = run.loader(gan_data(), batch_size=batch_size, shuffle=False)
        stepped = {"D": 0, "G": 0}
        for _ in run.epochs(1):
            for (x,) in loader:
                with run.accumulate(d):
                    loss_d, z, bce = gan_losses(d, g, x)
                    run.backward(loss_d)
                stepped["D"] += run.step(opt_d)
                with run.accumulate(g):
                    out = run.unwrap(d)(g(z))
                    run.backward(bce(out, torch.ones_like(out)), inputs=list(g.parameters()))
                stepped["G"] += run.step(opt_g)
        return {
            "D": run.strategy.full_state_dict(d),
            "G": run.strategy.full_state_dict(g),
            "stepped": stepped,
            "global_step": run.global_step,
        }


def handwritten_gan(micro_batch: int, steps_per: int = 2) -> dict[str, Any]:
    """The same GAN in plain torch, one process, micro-batches of the global size."""
    d, g = gan_pair()
    opt_d = torch.optim.SGD(d.parameters(), lr=0.1)
    opt_g = torch.optim.SGD(g.parameters(), lr=0.1)
    data = gan_data().tensors[0]
    for i, x in enumerate(data.split(micro_batch)):
        loss_d, z, bce = gan_losses(d, g, x)
        (loss_d / steps_per).backward()
        if (i + 1) % steps_per == 0:
            opt_d.step()
            opt_d.zero_grad()
        out = d(g(z))
        (bce(out, torch.ones_like(out)) / steps_per).backward(inputs=list(g.parameters()))
        if (i + 1) % steps_per == 0:
            opt_g.step()
            opt_g.zero_grad()
    return {"D": d.state_dict(), "G": g.state_dict()}


def test_gan_with_accumulation_steps_both_models_like_torch() -> None:
    ours = paratrain_gan(batch_size=8, strategy="cpu")
    ref = handwritten_gan(micro_batch=8)
    assert ours["stepped"] == {"D": 2, "G": 2}  # 4 micro-batches, windows of 2, for each model
    assert ours["global_step"] == 2  # a round of D and G counts once
    assert max_abs_diff(ours["D"], ref["D"]) <= 1e-6
    assert max_abs_diff(ours["G"], ref["G"]) <= 1e-6


@pytest.mark.parametrize("clip", [None, 0.5])
def test_two_optimizers_on_one_backward_fp16_follow_the_amp_recipe(clip: float | None) -> None:
    def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = dataset(8, seed=step)[:]
        return x * (1e6 if step == 1 else 1.0), y  # step 1 overflows fp16

    torch.manual_seed(0)
    net = mlp()
    ref_net = copy.deepcopy(net)
    with pt.Run(strategy="cpu", precision="fp16", progress=False, max_grad_norm=clip) as run:
        first, rest = list(net.parameters())[:2], list(net.parameters())[2:]
        o1, o2 = torch.optim.SGD(first, lr=0.1), torch.optim.SGD(rest, lr=0.1)
        model, o1, o2 = run.setup(net, o1, o2)
        for step in range(4):
            x, y = data(step)
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(o1)
            run.step(o2)
        scale = run.precision.state_dict()
    params = list(ref_net.parameters())
    r1, r2 = torch.optim.SGD(params[:2], lr=0.1), torch.optim.SGD(params[2:], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    for step in range(4):
        x, y = data(step)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(ref_net(x), y)
        scaler.scale(loss).backward()
        if clip is not None:  # the recipe: unscale both, clip the model's norm once
            scaler.unscale_(r1)
            scaler.unscale_(r2)
            torch.nn.utils.clip_grad_norm_(ref_net.parameters(), clip)
        scaler.step(r1)
        scaler.step(r2)
        scaler.update()
        r1.zero_grad()
        r2.zero_grad()
    assert scale is not None and scale["scale"] == scaler.get_scale()
    assert max_abs_diff(run.unwrap(model).state_dict(), ref_net.state_dict()) == 0.0


@pytest.mark.parametrize(
    "settings", [{"precision": "bf16"}, {"activation_checkpointing": (nn.Linear,)}]
)
def test_averaged_model_of_a_set_up_model_runs_its_own_forward(settings: dict[str, Any]) -> None:
    with pt.Run(strategy="cpu", progress=False, **settings) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.5))
        ema = run.track(AveragedModel(run.unwrap(model)), name="ema")
        twin = copy.deepcopy(run.unwrap(model))
        x, y = dataset(16)[:]
        for _ in range(3):
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(opt)
            ema.update_parameters(run.unwrap(model))
        plain = mlp()
        plain.load_state_dict(ema.module.state_dict())
        with run.autocast():
            expected = plain(x).float()  # outputs of a set-up model come back in fp32
        assert torch.equal(ema(x), expected)  # the EMA weights, under the run's precision
        assert not torch.equal(ema(x), model(x))
        assert not torch.equal(twin(x), model(x))  # a deepcopy keeps its own (initial) weights
        assert ema(x).dtype == torch.float32


def test_two_models_are_saved_restored_and_counted_once_per_round(tmp_path: Path) -> None:
    def run_gan(resume: bool) -> dict[str, Any]:
        with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
            d_net, g_net = gan_pair(seed=1 if resume else 0)  # other initial weights on resume
            d, opt_d = run.setup(d_net, torch.optim.Adam(d_net.parameters()), name="D")
            g, opt_g = run.setup(g_net, torch.optim.Adam(g_net.parameters()), name="G")
            if resume:
                run.resume()
                return {"D": d.state_dict(), "G": g.state_dict(), "step": run.global_step}
            for (x,) in torch.utils.data.DataLoader(gan_data(24), batch_size=8):
                loss_d, z, bce = gan_losses(d, g, x)
                run.backward(loss_d)
                run.step(opt_d)
                out = d(g(z))
                run.backward(bce(out, torch.ones_like(out)), inputs=list(g.parameters()))
                run.step(opt_g)
            run.save()
            return {"D": d.state_dict(), "G": g.state_dict(), "step": run.global_step}

    saved, restored = run_gan(False), run_gan(True)
    assert saved["step"] == restored["step"] == 3  # 3 iterations of D and G
    assert max_abs_diff(saved["G"], restored["G"]) == 0.0
    assert max_abs_diff(saved["D"], restored["D"]) == 0.0


def _epochs_seen(tmp_path: Path, *, stop: bool, resume: bool) -> list[tuple[int, int]]:
    """Saves at the top of every epoch; returns (epoch, first sample) of each pass."""
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        loader = run.loader(dataset(16), batch_size=8)
        if resume:
            run.resume()
        seen = []
        for epoch in run.epochs(4):
            run.save()
            if stop and epoch == 2:
                return seen
            for i, (x, y) in enumerate(loader):
                if i == 0:
                    seen.append((epoch, round(float(x[0, 0]), 4)))
                run.backward(nn.functional.cross_entropy(model(x), y))
                run.step(opt)
        return seen


def test_save_at_the_top_of_an_epoch_resumes_that_epoch(tmp_path: Path) -> None:
    straight = _epochs_seen(tmp_path / "a", stop=False, resume=False)
    first = _epochs_seen(tmp_path / "b", stop=True, resume=False)
    rest = _epochs_seen(tmp_path / "b", stop=False, resume=True)
    assert first + rest == straight and [e for e, _ in straight] == [0, 1, 2, 3]


def _accumulated_steps(shape: str) -> tuple[int, list[float]]:
    with pt.Run(strategy="cpu", grad_accum=2, progress=False) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        main = run.loader(dataset(40), batch_size=8)  # 5 micro-batches: windows of 2, 2, 1
        aux = run.loader(dataset(40, seed=5), batch_size=4)
        steps, norms = 0, []
        for _ in run.epochs(1):
            if shape == "aux":
                batches: Any = ((b, next(iter(aux))) for b in main)
            elif shape == "zip":
                batches = zip(main, itertools.cycle([None]))
            else:  # read one batch ahead, like a prefetcher
                batches = _read_ahead(main)
            for (x, y), _extra in batches:
                with run.accumulate(model):
                    run.backward(nn.functional.cross_entropy(model(x), y))
                stepped = run.step(opt)
                steps += stepped
        return steps, norms


def _read_ahead(loader: Any) -> Any:
    iterator = iter(loader)
    current = next(iterator)
    for following in iterator:
        yield current, None
        current = following
    yield current, None


@pytest.mark.parametrize("shape", ["aux", "zip", "read_ahead"])
def test_window_ends_follow_the_loop_loader_not_the_newest(shape: str) -> None:
    assert _accumulated_steps(shape)[0] == 3


def test_extras_that_cannot_be_resumed_are_converted_or_refused(tmp_path: Path) -> None:
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        run.setup(mlp())
        extras = {"best": np.float64(0.91), "f32": np.float32(0.5), "path": Path("/data")}
        run.save(extras={**extras, "arr": np.zeros(0, dtype=np.float32).sum()})
        with pytest.raises(CheckpointError, match="extras\\['obj'\\] holds a"):
            run.save(extras={"obj": object()})
        bad: list[Any] = [
            {"per_class": {object(): 1}},
            {"when": np.datetime64("2026-01-01")},
            {"mixed": np.array([1, "a"], dtype=object)},
            {"kind": enum.Enum("Kind", "A").A},
        ]
        for extras_value in bad:
            with pytest.raises(CheckpointError, match="extras"):
                run.save(extras=extras_value)
        run.save(extras={**extras, "per_class": {np.int64(3): 0.9, Path("x"): 1}})
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        run.setup(mlp())
        got = run.resume()
    assert got == {"best": 0.91, "f32": 0.5, "path": "/data", "per_class": {3: 0.9, "x": 1}}
    assert type(got["best"]) is float


def _two_loaders(tmp_path: Path, *, stop: bool, resume: bool) -> list[int]:
    """Two training loaders used one after the other in each epoch; stop mid-way through b."""
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        a = run.loader(dataset(16), batch_size=4)
        b = run.loader(dataset(16, seed=9), batch_size=4)
        if resume:
            run.resume()
        seen = []
        for _ in run.epochs(2):
            for loader in (a, b):
                for x, y in loader:
                    seen.append(round(float(x[0, 0]) * 1000))
                    run.backward(nn.functional.cross_entropy(model(x), y))
                    run.step(opt)
                    if stop and run.global_step == 6:
                        run.save()
                        return seen
        return seen


def test_resume_continues_the_loader_that_was_mid_pass(tmp_path: Path) -> None:
    straight = _two_loaders(tmp_path / "a", stop=False, resume=False)
    first = _two_loaders(tmp_path / "b", stop=True, resume=False)
    rest = _two_loaders(tmp_path / "b", stop=False, resume=True)
    assert first + rest == straight


class _Stream(IterableDataset[torch.Tensor]):
    def __iter__(self) -> Any:
        return iter(torch.arange(8.0).view(8, 1))


def test_iterable_dataset_on_several_ranks_is_split_with_a_note() -> None:
    warnings: list[str] = []

    class Hooks:
        def current_epoch(self) -> int:
            return 0

        def current_step(self) -> int:
            return 0

        def on_pass_start(self, loader: Any) -> None:
            pass

        def on_batch(self) -> None:
            pass

        def worker_signals(self) -> tuple[int, ...]:
            return ()

        def safe_point(self) -> None:
            pass

        def warn(self, message: str) -> None:
            warnings.append(message)

        def stream_group(self) -> Any:
            return None

    topology = rank_of_two()
    loader = make_loader(
        _Stream(),
        2,
        train=True,
        shuffle=False,
        drop_last=False,
        seed=0,
        topology=topology,
        data_rank=topology.rank,
        data_size=topology.world_size,
        device=torch.device("cpu"),
        num_workers=0,
        hooks=Hooks(),
        name="loader",
        kwargs={},
    )
    assert warnings and "keeps 1 example in 2 x (workers per rank)" in warnings[0]
    assert [b.view(-1).tolist() for b in loader] == [[0.0, 2.0], [4.0, 6.0]]  # rank 0's share


def test_range_epochs_reshuffle_and_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    with pt.Run(strategy="cpu", progress=False) as run:
        loader = run.loader(dataset(32), batch_size=32)
        orders = [torch.cat([x for x, _ in loader])[:, 0].tolist() for _ in range(3)]
    assert orders[0] != orders[1] != orders[2]
    out = capsys.readouterr().out
    assert out.count("started a new pass") == 1  # once
    assert "use `for epoch in run.epochs(N):`" in out


def test_small_api_gaps() -> None:
    with pt.Run(strategy="cpu", grad_accum=2, progress=False) as run:
        model = run.setup(mlp())
        assert len(run.eval_loader(dataset(10), 2, drop_last=False)) == 5
        with pytest.raises(ConfigError, match="never drops"):
            run.eval_loader(dataset(10), 2, drop_last=True)
        x, y = dataset(4)[:]
        with run.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            run.backward(loss, retain_graph=True)
            run.backward(loss, inputs=[next(model.parameters())])
            with pytest.raises(ConfigError, match="same model"), run.accumulate(model):
                pass


def test_reduce_keeps_numpy_types_in_one_process() -> None:
    with pt.Run(strategy="cpu", progress=False) as run:
        value = np.float32(1.5)
        assert run.reduce(value) == value and isinstance(run.reduce(value), np.float32)


def test_accumulate_takes_the_inner_model_and_refuses_strangers() -> None:
    with pt.Run(strategy="cpu", grad_accum=2, progress=False) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        x, y = dataset(4)[:]
        for _ in range(2):
            with run.accumulate(run.unwrap(model)):
                run.backward(nn.functional.cross_entropy(model(x), y))
        assert run.step(opt)
        with pytest.raises(ConfigError, match="did not return"), run.accumulate(mlp()):
            pass


def _aux_run(tmp_path: Path, *, stop: bool, resume: bool) -> tuple[list[float], Any]:
    """An auxiliary loader read with next(iter(aux)) each step; save at step 5."""
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        main = run.loader(dataset(16), batch_size=4)
        aux = run.loader(dataset(12, seed=3), batch_size=4)
        if resume:
            run.resume()
        seen = []
        for _ in run.epochs(3):
            for x, y in main:
                ax, ay = next(iter(aux))
                seen.append(round(float(ax[0, 0]), 4))
                loss = nn.functional.cross_entropy(model(torch.cat([x, ax])), torch.cat([y, ay]))
                run.backward(loss)
                run.step(opt)
                if stop and run.global_step == 5:
                    run.save()
                    return seen, None
        return seen, run.unwrap(model).state_dict()


def test_auxiliary_loader_read_with_next_iter_resumes_exactly(tmp_path: Path) -> None:
    straight, weights = _aux_run(tmp_path / "a", stop=False, resume=False)
    first, _ = _aux_run(tmp_path / "b", stop=True, resume=False)
    rest, resumed = _aux_run(tmp_path / "b", stop=False, resume=True)
    assert first + rest == straight
    assert max_abs_diff(resumed, weights) == 0.0


def _range_run(tmp_path: Path, *, stop: int | None, resume: bool) -> tuple[list[Any], Any]:
    """`for epoch in range(start, 4)` with a save after each epoch (no run.epochs)."""
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path, progress=False) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        loader = run.loader(dataset(8), batch_size=4)
        start = run.resume()["epoch"] + 1 if resume else 0
        seen = []
        for epoch in range(start, 4):
            for x, y in loader:
                seen.append((epoch, round(float(x[0, 0]), 4)))
                run.backward(nn.functional.cross_entropy(model(x), y))
                run.step(opt)
            run.save(extras={"epoch": epoch})
            if epoch == stop:
                return seen, None
        return seen, run.unwrap(model).state_dict()


@pytest.mark.parametrize("stop", [0, 1, 2])
def test_range_epoch_loop_with_end_of_epoch_saves_resumes_exactly(
    tmp_path: Path, stop: int
) -> None:
    straight, weights = _range_run(tmp_path / "a", stop=None, resume=False)
    first, _ = _range_run(tmp_path / "b", stop=stop, resume=False)
    rest, resumed = _range_run(tmp_path / "b", stop=None, resume=True)
    assert first + rest == straight and len(straight) == 8
    assert max_abs_diff(resumed, weights) == 0.0


def test_a_parameter_in_two_optimizers_is_refused_at_setup() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    everything = torch.optim.Adam(model.parameters())
    head = torch.optim.Adam(model[1].parameters())
    needle = r"'1\.weight' is in optimizer 1 and optimizer 2"
    with pt.Run(strategy="cpu") as run, pytest.raises(pt.ModelError, match=needle):
        run.setup(model, everything, head)


@pytest.mark.parametrize("not_an_optimizer", [None, "sgd", 0.1])
def test_setup_refuses_what_is_not_an_optimizer(not_an_optimizer: Any) -> None:
    needle = "only optimizers go after the model"
    with pt.Run(strategy="cpu", progress=False) as run, pytest.raises(pt.ModelError, match=needle):
        run.setup(mlp(), not_an_optimizer)
