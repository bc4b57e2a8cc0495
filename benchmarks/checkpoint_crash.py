"""Kill a process at random moments while it writes checkpoints; resume must always work.

    python benchmarks/checkpoint_crash.py --trials 200
    python benchmarks/checkpoint_crash.py --trials 50 --s3      # against moto's S3 server

Each trial forks a writer that saves a ~4 MiB training state in a loop (keep_last=2), SIGKILLs
it after a random delay, then checks that the newest committed checkpoint verifies and loads.
Prints "N/N" resumable, and how many kills landed in the middle of a save. With ``--s3`` (or
``run_trials(ckpt_dir="s3://...")``) the checkpoints go to object storage: a kill can land in
the local write, in the upload or in the deletion of a rotated checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

import paratrain as pt
from paratrain.checkpoint.loading import read_state_dict
from paratrain.checkpoint.remote_store import RemoteStore, open_store
from paratrain.checkpoint.store import CheckpointStore


def _writer(ckpt_dir: str, run_dir: str | None) -> None:
    torch.set_num_threads(1)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the writer's banner, once per trial
    with pt.Run(
        strategy="cpu", ckpt_dir=ckpt_dir, run_dir=run_dir, keep_last=2, progress=False
    ) as run:
        net = nn.Sequential(nn.Linear(512, 1024), nn.Linear(1024, 512))
        model, opt = run.setup(net, torch.optim.AdamW(net.parameters()))
        while True:
            run.backward(model(torch.randn(8, 512)).square().mean())
            run.step(opt)
            run.save()


def _interrupted(store: CheckpointStore, root: Path) -> bool:
    """Whether a save was in progress: its temporary folder, or (object storage) a save
    committed in staging but not uploaded, a folder uploaded in part, or a rotated one deleted
    in part (no manifest.json in either)."""
    if not isinstance(store, RemoteStore):
        return any(root.glob(".tmp-*"))
    objects = store.storage.list()
    folders = {rel.split("/", 1)[0] for rel in objects if "/" in rel}
    committed = {rel.split("/", 1)[0] for rel in objects if rel.count("/") == 1 and
                 rel.endswith("/manifest.json")}  # fmt: skip
    staged = {p.name for p in (root / "run").glob(".ckpt-staging/*/*")}
    writing = any(name.startswith(".tmp-") for name in staged)
    uploading = {name for name in staged if name.startswith("step-")} - committed
    return writing or bool(uploading) or bool(folders - committed)


def trial(root: Path, rng: random.Random, ckpt_dir: str | None = None) -> tuple[bool, bool]:
    """One kill; returns (resumable, the kill interrupted a save)."""
    location = ckpt_dir or str(root)
    run_dir = str(root / "run") if ckpt_dir else None
    ctx = mp.get_context("fork")
    proc = ctx.Process(target=_writer, args=(location, run_dir), daemon=True)
    proc.start()
    store = open_store(
        location,
        staging=root / "checker",  # the writer's staging folder is its own
        storage_options=None,
        keep_last=None,
        check_timeout_s=1,
        warn=lambda _m: None,
        say=lambda _m: None,
    )
    deadline = time.monotonic() + 60
    while not store.committed() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.3))
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    interrupted = _interrupted(store, root)
    found = store.latest_valid()
    if found is None:
        return False, interrupted
    state, _ = read_state_dict(found[0])
    return len(state) == 4, interrupted


@contextlib.contextmanager
def _environment(env: dict[str, str] | None) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_trials(
    trials: int, seed: int = 0, *, ckpt_dir: str | None = None, env: dict[str, str] | None = None
) -> tuple[int, int]:
    """(resumable trials, kills that landed mid-save) over ``trials`` kills. ``ckpt_dir``: a
    URL whose ``t<i>`` subfolders the trials write to (default a local temporary folder each);
    ``env``: variables set meanwhile (endpoint and credentials of object storage)."""
    rng = random.Random(seed)
    ok = mid_save = 0
    # What every writer imports (paratrain.runtime.run; torch._dynamo, which AdamW pulls in) is
    # imported here once, not again in each forked writer: more of each trial is saving.
    assert pt.Run is not None and torch.optim.AdamW(nn.Linear(1, 1).parameters())
    with tempfile.TemporaryDirectory() as tmp, _environment(env):
        for i in range(trials):
            url = f"{ckpt_dir.rstrip('/')}/t{i}" if ckpt_dir else None
            good, interrupted = trial(Path(tmp) / f"t{i}", rng, url)
            ok += good
            mid_save += interrupted
    return ok, mid_save


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--s3", action="store_true", help="save to moto's S3 server on loopback")
    args = parser.parse_args()
    if not args.s3:
        ok, mid = run_trials(args.trials)
    else:
        try:
            from benchmarks.moto_s3 import moto_s3
        except ModuleNotFoundError:  # run as a script: benchmarks/ is on sys.path
            from moto_s3 import moto_s3  # type: ignore[no-redef]
        with moto_s3() as server:
            server.make_bucket("crash")
            ok, mid = run_trials(args.trials, ckpt_dir="s3://crash", env=server.env)
    print(f"{ok}/{args.trials} resumable after SIGKILL ({mid} kills landed mid-save)")


if __name__ == "__main__":
    main()
