"""Every layout resumes from every other: a checkpoint written at step 3 by one layout, resumed
by another for 3 more steps, ends where one uninterrupted process ends (global batch 8, AdamW
moments and step counts, a StepLR schedule; SGD momentum on a smaller set).

The sources and the targets run at 1, 2 and 4 ranks: one process, ddp, fsdp, tp, fsdp x tp,
hsdp and pipeline (1f1b, gpipe, interleaved 1f1b, pp x dp, pp x tp). One launch per world size
writes that size's checkpoints; one launch per world size resumes every checkpoint under each of
that size's layouts, one ``pt.Run`` after another. The README shows the table.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt
from tests.support.distributed import run_distributed
from tests.support.training import max_abs_diff

pytestmark = pytest.mark.layouts

GLOBAL_BATCH = 8
SAVE_AT, END = 3, 6
TOLERANCE = 1e-5
"""fp32, lr 1e-2 with StepLR(0.8), 6 steps of a 3-block MLP: summation order alone (TP's
partial sums, a pipeline's micro-batches) stays below 2e-6 here; a lost moment, step count or
schedule moves weights by 1e-3 or more."""

LAYOUTS: dict[int, dict[str, dict[str, Any]]] = {
    1: {"1 process": dict(strategy="cpu")},
    2: {
        "ddp": dict(strategy="ddp"),
        "fsdp": dict(strategy="fsdp"),
        "tp": dict(strategy="tp", tp_plan="auto"),
        "hsdp": dict(strategy="fsdp", mesh={"dp_replicate": 2, "dp": 1}),
        "pp 1f1b": dict(strategy="pipeline"),
        "pp gpipe": dict(strategy="pipeline", pipeline_schedule="gpipe", n_microbatches=4),
        "pp interleaved": dict(strategy="pipeline", pipeline_schedule="interleaved_1f1b"),
    },
    4: {
        "ddp": dict(strategy="ddp"),
        "fsdp": dict(strategy="fsdp"),
        "tp": dict(strategy="tp", tp_plan="auto"),
        "fsdp+tp": dict(strategy="tp", mesh={"dp": 2, "tp": 2}, tp_plan="auto"),
        "hsdp": dict(strategy="fsdp", mesh={"dp_replicate": 2, "dp": 2}),
        "pp x dp": dict(strategy="pipeline", mesh={"pp": 2, "dp": 2}),
        "pp x tp": dict(strategy="pipeline", mesh={"pp": 2, "tp": 2}, tp_plan="auto"),
    },
}
SGD_PLAIN = {(1, "1 process"), (2, "ddp"), (2, "fsdp")}
SGD_SPLIT = {(2, "tp"), (2, "pp 1f1b"), (4, "fsdp+tp"), (4, "hsdp"), (4, "pp x tp")}
"""SGD with momentum between these two sets, both ways."""


def net() -> nn.Sequential:
    """Three blocks a pipeline can cut between and ``tp_plan='auto'`` splits (Linear, GELU,
    Linear), a LayerNorm between them and a head."""
    torch.manual_seed(0)

    def block() -> nn.Sequential:
        return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))

    return nn.Sequential(
        nn.Linear(6, 16), nn.Tanh(), block(), nn.LayerNorm(16), block(), block(), nn.Linear(16, 4)
    )


def data(n: int = 40) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, 4, (n,), generator=g))


def train(
    settings: dict[str, Any], ckpt_dir: str | None, *, resume: bool, sgd: bool
) -> dict[str, Any]:
    """Train to step 3 and save, or resume and train to step 6 (no ``ckpt_dir``: train to step
    6 uninterrupted). 5 batches an epoch: the save falls mid-epoch, the resume crosses an
    epoch's end."""
    with pt.Run(progress=False, seed=0, ckpt_dir=ckpt_dir, **settings) as run:
        model = net()
        if sgd:
            opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
        model, opt = run.setup(model, opt, loss_fn=nn.functional.cross_entropy)
        loader = run.loader(data(), batch_size=GLOBAL_BATCH // run.data_size, shuffle=True)
        if resume:
            run.resume()
        stop = SAVE_AT if ckpt_dir and not resume else END
        for _ in run.epochs(3):
            for x, y in loader:
                run.backward(model(x, target=y))
                run.step(opt, sched)
                if run.global_step == stop:
                    break
            if run.global_step == stop:
                break
        if ckpt_dir and not resume:
            run.save()
        return {"weights": run.strategy.full_state_dict(model), "steps": run.global_step}


def _write(world: int, root: str) -> None:
    for name, settings in LAYOUTS[world].items():
        for sgd in (False, True):
            if not sgd or (world, name) in SGD_PLAIN | SGD_SPLIT:
                train(settings, _folder(root, world, name, sgd), resume=False, sgd=sgd)


def _resume_all(world: int, root: str) -> dict[tuple[Any, ...], Any]:
    ended: dict[tuple[Any, ...], Any] = {}
    for target, settings in LAYOUTS[world].items():
        for source_world, layouts in LAYOUTS.items():
            for source in layouts:
                for sgd in (False, True):
                    pair = {(source_world, source), (world, target)}
                    if sgd and not (pair & SGD_PLAIN and pair & SGD_SPLIT):
                        continue
                    key = (source_world, source, world, target, sgd)
                    folder = _folder(root, source_world, source, sgd)
                    try:
                        ended[key] = train(settings, folder, resume=True, sgd=sgd)
                    except Exception as err:  # every cell is reported
                        ended[key] = f"{type(err).__name__}: {err}"
    return ended


def _folder(root: str, world: int, name: str, sgd: bool) -> str:
    return str(Path(root) / f"{world}-{name.replace(' ', '_')}-{'sgd' if sgd else 'adamw'}")


def _launch(fn: Any, world: int, *args: Any) -> Any:
    if world == 1:
        return fn(world, *args)
    return run_distributed(fn, world, world, *args, timeout=900)[0]


@pytest.fixture(scope="module")
def cells() -> Iterator[dict[tuple[Any, ...], Any]]:
    with tempfile.TemporaryDirectory() as root:
        for world in LAYOUTS:
            _launch(_write, world, root)
        ended: dict[tuple[Any, ...], Any] = {}
        for world in LAYOUTS:
            ended.update(_launch(_resume_all, world, root))
        yield ended


@pytest.fixture(scope="module")
def reference() -> dict[bool, dict[str, torch.Tensor]]:
    """One process, six steps, no checkpoint."""
    one = LAYOUTS[1]["1 process"]
    return {sgd: train(one, None, resume=False, sgd=sgd)["weights"] for sgd in (False, True)}


def test_every_layout_resumes_from_every_other(
    cells: dict[tuple[Any, ...], Any], reference: dict[bool, dict[str, torch.Tensor]]
) -> None:
    failed = []
    for (source_world, source, world, target, sgd), got in sorted(cells.items()):
        cell = f"{source} ({source_world}) -> {target} ({world}){' sgd' if sgd else ''}"
        if isinstance(got, str):
            failed.append(f"{cell}: {got[:300]}")
        elif got["steps"] != END:
            failed.append(f"{cell}: ended at step {got['steps']}")
        elif (diff := max_abs_diff(got["weights"], reference[sgd])) > TOLERANCE:
            failed.append(f"{cell}: max |dw| {diff:.2e}")
    assert not failed, f"{len(failed)} of {len(cells)} resumes:\n" + "\n".join(failed)
    assert len(cells) == 15 * 15 + 2 * 3 * 5


class _HalfUsed(nn.Module):
    """Two blocks ``tp_plan='auto'`` splits; the forward uses the first alone."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.used = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 4))
        self.unused = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _half_used(world: int, root: str) -> list[int]:
    """Train one step and save at one process; resume under fsdp x tp at 4 ranks."""
    settings = dict(strategy="cpu") if world == 1 else LAYOUTS[4]["fsdp+tp"]
    with pt.Run(progress=False, seed=0, ckpt_dir=root, **settings) as run:
        net = _HalfUsed()
        model, opt = run.setup(net, torch.optim.Adam(net.parameters(), lr=0.1))
        if world == 1:
            run.backward(model(torch.ones(8, 6)).square().mean())
            run.step(opt)
            run.save()
        else:
            run.resume()
        return sorted(int(s["step"]) for s in opt.state.values())


def test_a_parameter_saved_without_state_resumes_without_under_a_2d_mesh(tmp_path: Path) -> None:
    """The full optimizer state of one process, loaded onto fsdp x tp parameters, goes through
    torch's path that creates the state first: what the checkpoint did not hold is dropped."""
    assert _launch(_half_used, 1, str(tmp_path)) == [1, 1, 1, 1]
    assert _launch(_half_used, 4, str(tmp_path)) == [1, 1, 1, 1]
