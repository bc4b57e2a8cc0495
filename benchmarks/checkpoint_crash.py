"""Kill a process at random moments while it writes checkpoints; resume must always work.

    python benchmarks/checkpoint_crash.py --trials 200

Each trial forks a writer that saves a ~4 MiB training state in a loop (keep_last=2), SIGKILLs
it after a random delay, then checks that the newest committed checkpoint verifies and loads.
Prints "N/N" resumable, and how many kills landed in the middle of a save.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import paratrain as pt
from paratrain.checkpoint.store import CheckpointStore


def _writer(root: str) -> None:
    torch.set_num_threads(1)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the writer's banner, once per trial
    with pt.Run(strategy="cpu", ckpt_dir=root, keep_last=2, progress=False) as run:
        net = nn.Sequential(nn.Linear(512, 1024), nn.Linear(1024, 512))
        model, opt = run.setup(net, torch.optim.AdamW(net.parameters()))
        while True:
            run.backward(model(torch.randn(8, 512)).square().mean())
            run.step(opt)
            run.save()


def trial(root: Path, rng: random.Random) -> tuple[bool, bool]:
    """One kill; returns (resumable, the kill interrupted a save)."""
    ctx = mp.get_context("fork")
    proc = ctx.Process(target=_writer, args=(str(root),), daemon=True)
    proc.start()
    store = CheckpointStore(root, keep_last=None, check_timeout_s=1, warn=lambda _m: None)
    deadline = time.monotonic() + 30
    while not store.committed() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.3))
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    interrupted = any(root.glob(".tmp-*"))
    found = store.latest_valid()
    if found is None:
        return False, interrupted
    state, _ = pt.checkpoint.loading.read_state_dict(found[0])
    return len(state) == 4, interrupted


def run_trials(trials: int, seed: int = 0) -> tuple[int, int]:
    """(resumable trials, kills that landed mid-save) over ``trials`` kills."""
    rng = random.Random(seed)
    ok = mid_save = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(trials):
            good, interrupted = trial(Path(tmp) / f"t{i}", rng)
            ok += good
            mid_save += interrupted
    return ok, mid_save


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    args = parser.parse_args()
    ok, mid = run_trials(args.trials)
    print(f"{ok}/{args.trials} resumable after SIGKILL ({mid} kills landed mid-save)")


if __name__ == "__main__":
    main()
