"""Loops whose state moves after ``run.step()``, for the preemption tests: the signal lands
between an optimizer step and the script's own post-step code (or between two models' steps).

    python shapes.py RUN_DIR SHAPE [--signal-at K]

SHAPE ``own``: a loop without ``run.loader`` (batches from ``torch.randint``), dropout and
BatchNorm, an ``AveragedModel`` and a counter updated after the step, a scheduler stepped by hand.
SHAPE ``own_epochs``: ``run.epochs`` with batches the loop makes itself (word_language_model's
shape) and a scheduler stepped per epoch: no safe point before the epoch's end.
SHAPE ``own_accum``: no loader, ``grad_accum=2``, each micro-batch's batch drawn with
``torch.randint`` just before its ``with run.accumulate(model):`` (the port guide's advice).
SHAPE ``accum``: a loader with ``--workers`` and windows of 8 micro-batches (more batches
after the signal than the workers have prefetched).
SHAPE ``two_loaders``: model 1 on the training loader, model 2 on a second loader read with
``next()`` after model 1 stepped. ``--signal-at K``: the process sends itself SIGTERM right after
the optimizer step that makes ``run.global_step == K`` (before the post-step code; 0: before the
first batch), once per run dir. The final
state goes to RUN_DIR/final.pt.
"""

import argparse
import os
import signal
from pathlib import Path

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

import paratrain as pt

parser = argparse.ArgumentParser()
parser.add_argument("run_dir", type=Path)
parser.add_argument("shape", choices=["own", "two_loaders", "own_epochs", "accum", "own_accum"])
parser.add_argument("--signal-at", type=int, default=-1)
parser.add_argument("--signal-after-loop", action="store_true")
parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (two_loaders)")
parser.add_argument("--to-group", action="store_true", help="signal every process of the group")
args = parser.parse_args()


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.count = state["count"]


def signal_at(step: int) -> None:
    if step != args.signal_at or (args.run_dir / "signaled").exists():
        return  # once per run dir: the rerun (the same command) runs on
    (args.run_dir / "signaled").touch()
    if args.to_group:  # loader workers too, as a scheduler does
        group = os.getpgid(0)
        assert group == os.getpid(), "start it in a session of its own (start_new_session)"
        if os.fork() == 0:  # sent by another process than the workers' parent, as from outside
            os.killpg(group, signal.SIGTERM)
            os._exit(0)
    else:
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once: the flag is up before the next line


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.2), nn.Linear(16, 3))


run = pt.Run(
    run_dir=args.run_dir, progress=False, seed=0, stats_every=None, preempt_signals=("SIGTERM",),
    grad_accum={"accum": 8, "own_accum": 2}.get(args.shape, 1),
)  # fmt: skip
torch.manual_seed(0)
features, labels = torch.randn(96, 8), torch.randint(0, 3, (96,))
out: dict[str, object] = {}
if args.shape == "own":
    model_net = net()
    model, opt = run.setup(model_net, torch.optim.AdamW(model_net.parameters(), lr=1e-2))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    run.track(sched, name="sched")
    ema = run.track(AveragedModel(run.unwrap(model)), name="ema")
    counter = run.track(Counter(), name="counter")
    while run.global_step < 12:
        i = torch.randint(0, 96, (8,))
        run.backward(nn.functional.cross_entropy(model(features[i]), labels[i]))
        run.step(opt)
        signal_at(run.global_step)
        sched.step()
        ema.update_parameters(run.unwrap(model))
        counter.count += 1
    out = {"ema": ema.state_dict(), "counter": counter.count, "lr": sched.get_last_lr()}
elif args.shape == "own_accum":
    model_net = net()
    model, opt = run.setup(model_net, torch.optim.SGD(model_net.parameters(), lr=0.1))
    while run.global_step < 8:
        for _ in range(2):
            i = torch.randint(0, 96, (8,))
            with run.accumulate(model):
                run.backward(nn.functional.cross_entropy(model(features[i]), labels[i]))
        run.step(opt)
        signal_at(run.global_step)
elif args.shape == "accum":
    model_net = net()
    model, opt = run.setup(model_net, torch.optim.SGD(model_net.parameters(), lr=0.1))
    data = torch.utils.data.TensorDataset(features, labels)
    loader = run.loader(data, batch_size=2, num_workers=args.workers)
    for _ in run.epochs(2):
        for x, y in loader:
            with run.accumulate(model):
                run.backward(nn.functional.cross_entropy(model(x), y))
            if run.step(opt):
                signal_at(run.global_step)
elif args.shape == "own_epochs":
    model_net = net()
    model, opt = run.setup(model_net, torch.optim.SGD(model_net.parameters(), lr=0.1))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    run.track(sched, name="sched")
    for _epoch in run.epochs(3):
        for i in range(0, 48, 8):  # its own batches, in order
            run.backward(nn.functional.cross_entropy(model(features[i : i + 8]), labels[i : i + 8]))
            run.step(opt)
            signal_at(run.global_step)
        sched.step()
    out = {"lr": sched.get_last_lr()}
else:
    a_net, b_net = net(), net()
    a, opt_a = run.setup(a_net, torch.optim.SGD(a_net.parameters(), lr=0.1), name="a")
    b, opt_b = run.setup(b_net, torch.optim.SGD(b_net.parameters(), lr=0.1), name="b")
    data = torch.utils.data.TensorDataset(features, labels)
    loader = run.loader(data, batch_size=8, num_workers=args.workers)
    aux = run.loader(data, batch_size=8, num_workers=args.workers)
    aux_batches = iter(aux)
    signal_at(0)  # --signal-at 0: before the first batch
    for _ in run.epochs(2):
        for x, y in loader:
            run.backward(nn.functional.cross_entropy(a(x), y))
            run.step(opt_a)
            signal_at(run.global_step)
            xb, yb = next(aux_batches, (None, None))
            if xb is None:
                aux_batches = iter(aux)
                xb, yb = next(aux_batches)
            run.backward(nn.functional.cross_entropy(b(xb), yb))
            run.step(opt_b)
        run.save()
    model = b
    out = {"a": run.unwrap(a).state_dict()}
out.update(model=run.unwrap(model).state_dict(), step=run.global_step, rng=torch.rand(3))
if args.signal_after_loop:
    os.kill(os.getpid(), signal.SIGTERM)  # no safe point comes any more
if run.is_main:
    torch.save(out, args.run_dir / "final.pt")
run.close()
