"""Checkpoint I/O of a full training state against raw I/O and its peers, in one run.

    python benchmarks/checkpoint_io.py                  # 512 MiB state, 7 repeats, + FSDP x2
    python benchmarks/checkpoint_io.py --mib 128 --repeats 3 --fsdp-mib 0

The state: fp32 1024x1024 weights plus their SGD momentum buffers (half the bytes each). Each
repeat runs the contenders of a phase (writes; hot reads; cold reads) back to back, starting at
a rotating position, each after ``gc.collect()`` and ``os.sync()``. A figure is the ratio raw ÷
contender within one repeat (higher is better); the table shows the median of those ratios and
their min–max:

- save: raw write + fsync of one file (one thread writes everything, then fsyncs) ÷
  ``run.save()`` (checksums, manifest, atomic commit and directory fsyncs included);
  ``torch.save`` of ``{model, optim}`` + fsync and ``accelerate`` ``save_state`` beside it.
- resume, hot (page cache warm) and cold (pages evicted with ``posix_fadvise(DONTNEED)``): raw
  read of the file into a fresh buffer ÷ ``run.resume()`` into a fresh model and optimizer
  (every byte verified); ``torch.load`` + ``load_state_dict`` and ``accelerate``
  ``load_state`` beside it. Every contender touches every page it loads.
- async stall: the time ``run.save()`` blocks with ``async_save=True`` ÷ one memory copy of the
  state into existing (already touched) buffers (lower is better).
- FSDP on 2 (``--fsdp-ranks``) gloo ranks: ``dcp.save``/``dcp.load`` of the same model's state
  dict (from ``get_state_dict``) ÷ ``run.save()``/``run.resume()``, the slower rank's time
  counting. ``dcp.load`` twice: as a resume does it, into a freshly built model and optimizer
  (``get_state_dict`` then creates the optimizer state it loads into, as ``run.resume()`` must),
  and into the trained model whose state exists already. And a raw read of each rank's own
  shard file (the bytes it needs) into a fresh buffer.

``accelerate`` joins the table when it is installed (``pip install paratrain[bench]``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

import paratrain as pt

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
    gc.collect()  # no garbage of the previous contender left for this one's collector to walk
    os.sync()  # nothing left dirty by the previous contender writes back during this one
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


def _copy_time(tensors: list[torch.Tensor]) -> float:
    """One memory copy of the state into buffers whose pages exist (as kept buffers' do)."""
    buffers = [torch.empty_like(t) for t in tensors]

    def copy() -> None:
        for b, t in zip(buffers, tensors, strict=True):
            b.copy_(t)

    copy()
    return _timed(copy)


def _raw_write(path: Path, tensors: list[torch.Tensor]) -> None:
    """The plain way: one file, one thread, write everything, then fsync."""
    with path.open("xb") as f:
        for t in tensors:
            f.write(t.reshape(-1).view(torch.uint8).numpy().data)
        f.flush()
        os.fsync(f.fileno())


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


def _accelerate() -> Any:
    try:
        from accelerate import Accelerator
    except ImportError:
        return None
    return Accelerator


def _phase(contenders: dict[str, Callable[[], float]], shift: int) -> dict[str, float]:
    """Run each contender once, back to back, starting at a rotating position (no one is
    always first after a pause, or always last)."""
    names = list(contenders)
    order = names[shift % len(names) :] + names[: shift % len(names)]
    return {name: contenders[name]() for name in order}


def _round(mib: int, work: Path, shift: int) -> dict[str, float]:
    model, optimizer = _trained(mib)
    tensors = _state_tensors(model, optimizer)
    raw, ckpt, pt_file = work / "raw.bin", work / "ckpt", work / "state.pt"

    def torch_save() -> None:
        with pt_file.open("wb") as f:
            torch.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())

    def save() -> float:
        with _quiet(), pt.Run(strategy="cpu", ckpt_dir=ckpt, keep_last=None, progress=False) as run:
            run.setup(model, optimizer)
            return _timed(run.save)

    writes = {
        "raw_write": lambda: _timed(lambda: _raw_write(raw, tensors)),
        "save": save,
        "torch_save": lambda: _timed(torch_save),
    }
    accelerator_cls = _accelerate()
    if accelerator_cls is not None:
        writes["acc_save"] = lambda: _accelerate_save(accelerator_cls, model, optimizer, work)
    out = _phase(writes, shift)

    def torch_load() -> float:
        target, opt = _fresh(mib)  # built before the clock starts, as for every contender

        def load() -> None:
            state = torch.load(pt_file, weights_only=True)
            target.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])

        return _timed(load)

    def resume() -> float:
        target, opt = _fresh(mib)
        with _quiet(), pt.Run(strategy="cpu", ckpt_dir=ckpt, progress=False) as run:
            run.setup(target, opt)
            return _timed(lambda: run.resume())

    reads = {
        "raw_read": lambda: _timed(lambda: _raw_read(raw)),
        "resume": resume,
        "torch_load": torch_load,
    }
    if accelerator_cls is not None:
        reads["acc_load"] = lambda: _accelerate_load(accelerator_cls, mib, work)
    for temperature in ("hot", "cold"):
        cold = temperature == "cold"
        timed = {
            name: (lambda fn=fn: (_evict(work), fn())[1]) if cold else fn  # type: ignore[misc]
            for name, fn in reads.items()
        }
        if not cold:
            _raw_read(raw)  # every file was just written: the page cache holds it
        out.update({f"{k}_{temperature}": v for k, v in _phase(timed, shift).items()})

    out["copy"] = _copy_time(tensors)
    with (
        _quiet(),
        pt.Run(
            strategy="cpu", ckpt_dir=work / "async", async_save=True, keep_last=1, progress=False
        ) as run,
    ):
        run.setup(*_trained(mib))
        run.save()  # no run.step ran here, so this first save allocates the staging buffers
        run.store.wait()
        run.global_step += 1
        out["async_stall"] = _timed(run.save)
        run.store.wait()
    return out


def _accelerate_save(
    accelerator_cls: Any, model: nn.Module, optimizer: torch.optim.Optimizer, work: Path
) -> float:
    with _quiet():
        acc = accelerator_cls(cpu=True)
        acc.prepare(model, optimizer)
        took = _timed(lambda: acc.save_state(str(work / "acc")))
        acc.free_memory()
    return took


def _accelerate_load(accelerator_cls: Any, mib: int, work: Path) -> float:
    with _quiet():
        target, opt = _fresh(mib)
        acc = accelerator_cls(cpu=True)
        acc.prepare(target, opt)
        took = _timed(lambda: acc.load_state(str(work / "acc")))
        acc.free_memory()
    return took


def _fsdp_rank(mib: int, root: str, repeats: int) -> list[dict[str, float]]:
    """One rank of the FSDP comparison: paratrain vs plain DCP on the same sharded state."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def build(trained: bool = True) -> tuple[pt.Run, nn.Module, torch.optim.Optimizer]:
        run = pt.Run(  # gloo on the CPU, also where a GPU is visible
            strategy="fsdp",
            accelerator="cpu",
            ckpt_dir=Path(root) / "pt",
            keep_last=1,
            progress=False,
            previous_run="share",  # every build trains a step in the same ckpt_dir on purpose
        )
        net = _model(mib)
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9))
        if trained:  # momentum buffers exist; a resume starts without them
            with run.accumulate(model):
                run.backward(model(torch.ones(2, WIDTH)).sum())
            run.step(opt)
        return run, model, opt

    def timed(fn: Callable[[], object], cold: bool = False) -> float:
        if cold:
            _evict(Path(root))
        os.sync()
        dist.barrier()
        took = torch.tensor([_timed(fn)], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slower rank sets the pace
        return float(took.item())

    out = []
    with _quiet():
        run, model, opt = build()
        for r in range(repeats):
            ref = Path(root) / f"dcp{r}"

            def dcp_save(ref: Path = ref) -> None:
                msd, osd = get_state_dict(model, opt)
                dcp.save({"model": msd, "optim": osd}, checkpoint_id=ref)

            def dcp_load(ref: Path = ref) -> None:
                msd, osd = get_state_dict(model, opt)
                dcp.load({"model": msd, "optim": osd}, checkpoint_id=ref)
                set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)

            def dcp_resume(cold: bool, ref: Path = ref) -> float:
                """dcp.load as a resume does it: into a freshly built model and optimizer
                (get_state_dict first creates the optimizer's state to load into)."""
                fresh, model2, opt2 = build(trained=False)  # built before the clock starts
                with fresh:

                    def load() -> None:
                        msd, osd = get_state_dict(model2, opt2)
                        dcp.load({"model": msd, "optim": osd}, checkpoint_id=ref)
                        set_state_dict(model2, opt2, model_state_dict=msd, optim_state_dict=osd)

                    return timed(load, cold)

            def own_bytes() -> None:  # what this rank needs to resume: its own shard file
                newest = max((Path(root) / "pt").glob("step-*"), key=lambda p: p.stat().st_mtime)
                _raw_read(newest / "dcp" / f"__{dist.get_rank()}_0.distcp")

            def resume_time(cold: bool) -> float:
                again, _, _ = build(trained=False)  # as a restarted job: no optimizer state
                with again:
                    return timed(lambda: again.resume(), cold)

            def fsdp_save() -> float:
                took = timed(run.save)
                run.store.wait()  # its old checkpoint is deleted (a thread) before the next clock
                return took

            writes = {"dcp_save": lambda: timed(dcp_save), "fsdp_save": fsdp_save}
            row = _phase(writes, r)
            for cold in (False, True):
                suffix = "cold" if cold else "hot"
                reads = {
                    f"dcp_load_{suffix}": lambda cold=cold: timed(dcp_load, cold),  # type: ignore[misc]
                    f"fsdp_resume_{suffix}": lambda cold=cold: resume_time(cold),  # type: ignore[misc]
                    f"raw_read_{suffix}": lambda cold=cold: timed(own_bytes, cold),  # type: ignore[misc]
                    f"dcp_resume_{suffix}": lambda cold=cold: dcp_resume(cold),  # type: ignore[misc]
                }
                row.update(_phase(reads, r))
            run.global_step += 1
            out.append(row)
            if dist.get_rank() == 0:
                shutil.rmtree(ref, ignore_errors=True)
            dist.barrier()
        run.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="state size (weights + momentum)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    parser.add_argument(
        "--fsdp-mib", type=int, default=256, help="FSDP state on 2 ranks (0: skip that part)"
    )
    parser.add_argument(
        "--fsdp-ranks", default="2", help="rank counts of the FSDP tables, e.g. 2,4 (default 2)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    rounds = []
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(args.repeats):
            work = Path(tmp) / f"r{r}"
            work.mkdir()
            rounds.append(_round(args.mib, work, r))
            shutil.rmtree(work)
            gc.collect()
    t = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}
    print(
        f"state: {args.mib} MiB (fp32 {WIDTH}x{WIDTH} weights + SGD momentum), "
        f"{args.repeats} interleaved repeats, torch {torch.__version__}; ratio = raw ÷ "
        "contender in the same repeat (higher is better): median and min–max over repeats"
    )
    print("| operation | median s | ratio to raw | ratio min–max |")
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
            ratios = [x[ref] / x[key] for x in rounds]
            print(
                f"| {label} | {t[key]:.3f} | {statistics.median(ratios):.2f} | "
                f"{min(ratios):.2f}–{max(ratios):.2f} |"
            )
    if "acc_save" not in t:
        print("(accelerate is not installed: `pip install accelerate` adds it to the table)")
    stalls = [x["async_stall"] / x["copy"] for x in rounds]
    print(
        f"\nasync_save stall {t['async_stall']:.3f} s, one memory copy of the state "
        f"{t['copy']:.3f} s: stall ÷ copy {statistics.median(stalls):.2f} "
        f"(min–max {min(stalls):.2f}–{max(stalls):.2f}; target <= 1.2)"
    )
    if args.fsdp_mib > 0:
        for ranks in (int(n) for n in args.fsdp_ranks.split(",")):
            _fsdp_table(args.fsdp_mib, args.repeats, args.dir, ranks)


def _fsdp_table(mib: int, repeats: int, where: Path | None, ranks: int = 2) -> None:
    from paratrain.distributed.ranks import FileGroup, spawn_ranks

    with tempfile.TemporaryDirectory(dir=where) as tmp:
        rounds = spawn_ranks(
            _fsdp_rank, ranks, (mib, tmp, repeats), group=FileGroup(timeout_s=600), threads=1
        )[0]
    print(
        f"\nFSDP, {ranks} gloo ranks, {mib} MiB state, {repeats} repeats: ratio = reference ÷ "
        "paratrain in the same repeat (higher is better; the slower rank's time counts; the raw "
        "read is of each rank's own shard file, the bytes it needs)"
    )
    print("| operation | paratrain median s | reference median s | ratio | ratio min–max |")
    print("|---|---:|---:|---:|---:|")
    for ours, ref, label in (
        ("fsdp_save", "dcp_save", "save ÷ dcp.save"),
        ("fsdp_resume_hot", "dcp_resume_hot", "resume ÷ dcp.load into a fresh model, hot"),
        ("fsdp_resume_cold", "dcp_resume_cold", "resume ÷ dcp.load into a fresh model, cold"),
        ("fsdp_resume_hot", "dcp_load_hot", "resume ÷ dcp.load into the trained model, hot"),
        ("fsdp_resume_cold", "dcp_load_cold", "resume ÷ dcp.load into the trained model, cold"),
        ("fsdp_resume_hot", "raw_read_hot", "resume ÷ raw read of the rank's bytes, hot"),
        ("fsdp_resume_cold", "raw_read_cold", "resume ÷ raw read of the rank's bytes, cold"),
    ):
        ratios = [x[ref] / x[ours] for x in rounds]
        print(
            f"| {label} | {statistics.median(x[ours] for x in rounds):.3f} | "
            f"{statistics.median(x[ref] for x in rounds):.3f} | {statistics.median(ratios):.2f} | "
            f"{min(ratios):.2f}–{max(ratios):.2f} |"
        )


if __name__ == "__main__":
    main()
