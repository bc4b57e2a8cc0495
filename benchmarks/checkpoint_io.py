"""Checkpoint I/O of a full training state against raw I/O of the same bytes, in one run.

    python benchmarks/checkpoint_io.py                 # 512 MiB state, 5 interleaved repeats
    python benchmarks/checkpoint_io.py --mib 128 --repeats 3

The state: fp32 1024x1024 weights plus their SGD momentum buffers (half the bytes each). Each
repeat runs every contender once, in turn, so drifts of the machine hit all of them alike; the
table shows medians as ratios against raw I/O of the same bytes (higher is better):

- save: raw write + fsync of one file ÷ ``run.save()`` (checksums, manifest, atomic commit and
  directory fsyncs included); ``torch.save`` of ``{model, optim}`` + fsync beside it.
- resume, hot (page cache warm) and cold (pages evicted with ``posix_fadvise(DONTNEED)``): raw
  read of the file into a fresh buffer ÷ ``run.resume()`` into a fresh model and optimizer
  (every byte verified); ``torch.load`` + ``load_state_dict`` beside it. Every contender touches
  every page it loads.
- async stall: the time ``run.save()`` blocks with ``async_save=True`` ÷ one memory copy of the
  state into existing buffers (lower is better).
- ``accelerate`` ``save_state``/``load_state`` join the table when it is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

import paratrain as pt
from paratrain.checkpoint.files import write_durable

WIDTH = 1024


def _model(mib: int, seed: int = 0) -> nn.Module:
    layers = max(1, mib // 2 * 2**20 // (WIDTH * WIDTH * 4))
    torch.manual_seed(seed)
    return nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)))


def _trained(mib: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = _model(mib)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()  # momentum buffers exist: the state is weights + momentum
    return model, optimizer


def _fresh(mib: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = _model(mib, seed=1)
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def _state_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    momentum = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    return [*(p.detach() for p in model.parameters()), *momentum]


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _evict(root: Path) -> None:
    """Drop the page cache of every file under ``root`` (they are fsynced, so clean)."""
    for path in [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _raw_read(path: Path) -> None:
    buffer = torch.empty(path.stat().st_size, dtype=torch.uint8)
    view = buffer.numpy().data
    with path.open("rb", buffering=0) as f:
        offset = 0
        while n := f.readinto(view[offset:]):
            offset += n


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def _accelerate() -> object | None:
    try:
        from accelerate import Accelerator
    except ImportError:
        return None
    return Accelerator


def _round(mib: int, work: Path) -> dict[str, float]:
    model, optimizer = _trained(mib)
    tensors = _state_tensors(model, optimizer)
    out: dict[str, float] = {}
    raw = work / "raw.bin"
    out["raw_write"] = _timed(
        lambda: write_durable(raw, [t.reshape(-1).view(torch.uint8).numpy().data for t in tensors])
    )
    out["raw_read_hot"] = _timed(lambda: _raw_read(raw))
    _evict(raw)
    out["raw_read_cold"] = _timed(lambda: _raw_read(raw))

    def torch_save() -> None:
        with (work / "state.pt").open("wb") as f:
            torch.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())

    out["torch_save"] = _timed(torch_save)

    def torch_load() -> float:
        target, opt = _fresh(mib)  # built before the clock starts, as for every contender

        def load() -> None:
            state = torch.load(work / "state.pt", weights_only=True)
            target.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])

        return _timed(load)

    out["torch_load_hot"] = torch_load()
    _evict(work / "state.pt")
    out["torch_load_cold"] = torch_load()

    ckpt = work / "ckpt"
    with _quiet(), pt.Run(strategy="cpu", ckpt_dir=ckpt, keep_last=None, progress=False) as run:
        run.setup(model, optimizer)
        out["save"] = _timed(run.save)

    def resume() -> float:
        target, opt = _fresh(mib)
        with _quiet(), pt.Run(strategy="cpu", ckpt_dir=ckpt, progress=False) as run:
            run.setup(target, opt)
            return _timed(lambda: run.resume())

    out["resume_hot"] = resume()
    _evict(ckpt)
    out["resume_cold"] = resume()

    buffers = [torch.empty_like(t) for t in tensors]
    out["copy"] = _timed(lambda: [b.copy_(t) for b, t in zip(buffers, tensors, strict=True)])
    with (
        _quiet(),
        pt.Run(
            strategy="cpu", ckpt_dir=work / "async", async_save=True, keep_last=1, progress=False
        ) as run,
    ):
        run.setup(*_trained(mib))
        run.save()  # the first save allocates the staging buffers
        run.store.wait()
        run.global_step += 1
        out["async_stall"] = _timed(run.save)
        run.store.wait()

    accelerator_cls = _accelerate()
    if accelerator_cls is not None:
        out.update(_accelerate_round(accelerator_cls, mib, *_trained(mib), work))
    shutil.rmtree(work / "async", ignore_errors=True)
    return out


def _accelerate_round(
    accelerator_cls: object,
    mib: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    work: Path,
) -> dict[str, float]:
    out: dict[str, float] = {}
    with _quiet():
        acc = accelerator_cls(cpu=True)  # type: ignore[operator]
        acc.prepare(model, optimizer)
        out["acc_save"] = _timed(lambda: acc.save_state(str(work / "acc")))
        target, opt = _fresh(mib)
        acc2 = accelerator_cls(cpu=True)  # type: ignore[operator]
        acc2.prepare(target, opt)
        out["acc_load_hot"] = _timed(lambda: acc2.load_state(str(work / "acc")))
        _evict(work / "acc")
        out["acc_load_cold"] = _timed(lambda: acc2.load_state(str(work / "acc")))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="state size (weights + momentum)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rounds = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(args.repeats):
            work = Path(tmp) / f"r{r}"
            work.mkdir()
            rounds.append(_round(args.mib, work))
            shutil.rmtree(work)
    t = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}
    spread = {k: (min(x[k] for x in rounds), max(x[k] for x in rounds)) for k in rounds[0]}
    print(
        f"state: {args.mib} MiB (fp32 {WIDTH}x{WIDTH} weights + SGD momentum), median of "
        f"{args.repeats} interleaved repeats, torch {torch.__version__}"
    )
    print("| operation | median s | min–max s | ÷ raw (higher is better) |")
    print("|---|---:|---:|---:|")
    rows = [
        ("raw_write", "raw write + fsync", "raw_write"),
        ("save", "paratrain run.save()", "raw_write"),
        ("torch_save", "torch.save + fsync", "raw_write"),
        ("acc_save", "accelerate save_state", "raw_write"),
        ("raw_read_hot", "raw read, hot", "raw_read_hot"),
        ("resume_hot", "paratrain run.resume(), hot", "raw_read_hot"),
        ("torch_load_hot", "torch.load + load_state_dict, hot", "raw_read_hot"),
        ("acc_load_hot", "accelerate load_state, hot", "raw_read_hot"),
        ("raw_read_cold", "raw read, cold", "raw_read_cold"),
        ("resume_cold", "paratrain run.resume(), cold", "raw_read_cold"),
        ("torch_load_cold", "torch.load + load_state_dict, cold", "raw_read_cold"),
        ("acc_load_cold", "accelerate load_state, cold", "raw_read_cold"),
    ]
    for key, label, ref in rows:
        if key in t:
            low, high = spread[key]
            print(f"| {label} | {t[key]:.3f} | {low:.3f}–{high:.3f} | {t[ref] / t[key]:.2f} |")
    if "acc_save" not in t:
        print("(accelerate is not installed: `pip install accelerate` adds it to the table)")
    print(
        f"\nasync_save stall {t['async_stall']:.3f} s ÷ one memory copy of the state "
        f"{t['copy']:.3f} s = {t['async_stall'] / t['copy']:.2f} (target <= 1.2)"
    )


if __name__ == "__main__":
    main()
