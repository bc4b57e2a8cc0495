"""Checkpoints on object storage against a local disk: save and resume throughput, side by side.

    python -m benchmarks.object_store_io                     # 256 MiB state, 3 repeats
    python -m benchmarks.object_store_io --mib 64 --repeats 5

The state: fp32 1024x1024 weights plus their SGD momentum buffers (half the bytes each). The S3
server is moto on loopback (``python -m moto.server``, as in the tests): it measures what
paratrain adds (staging, checksums, the upload and the download through s3fs, the verification)
over a network that is not the bottleneck, not what a real bucket over a real network would do.
Each repeat times, for a fresh folder or prefix:

- save: ``run.save()`` into ``ckpt_dir`` (local: write, fsync, commit; S3: the same into the
  staging folder, then the upload with the manifest last, then rotation's listing);
- resume: ``run.resume()`` in a new run dir (S3: list, read manifests, download, verify, load);
- resume, cached (S3 only): the same run dir as the save, whose staging folder holds the
  verified copy (a restart on the same machine): list, read manifests, verify, load;
- raw upload and download: s3fs ``put``/``get`` of the same files, nothing else (what the
  server and the client library allow).

Prints the median seconds and MB/s of each, S3 ÷ local, and S3 ÷ the raw transfer.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

import paratrain as pt

try:
    from benchmarks.moto_s3 import moto_s3
except ModuleNotFoundError:  # run as a script: benchmarks/ is on sys.path
    from moto_s3 import moto_s3  # type: ignore[no-redef]

WIDTH = 1024
ORDER = (
    "save local",
    "raw upload",
    "save s3",
    "resume local",
    "raw download",
    "resume s3",
    "resume s3, cached copy",
)


def _trained(mib: int, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    layers = max(1, mib // 2 * 2**20 // (WIDTH * WIDTH * 4))
    torch.manual_seed(seed)
    model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()  # momentum buffers exist: the state is weights + momentum
    return model, optimizer


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def _timed(fn: Callable[[], object]) -> float:
    os.sync()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _save(mib: int, ckpt_dir: str | Path, run_dir: Path) -> float:
    model, optimizer = _trained(mib, seed=0)
    with (
        _quiet(),
        pt.Run(
            strategy="cpu", ckpt_dir=ckpt_dir, run_dir=run_dir, keep_last=None, progress=False
        ) as run,
    ):
        run.setup(model, optimizer)
        return _timed(run.save)


def _resume(mib: int, ckpt_dir: str | Path, run_dir: Path) -> float:
    model, optimizer = _trained(mib, seed=1)
    with (
        _quiet(),
        pt.Run(strategy="cpu", ckpt_dir=ckpt_dir, run_dir=run_dir, progress=False) as run,
    ):
        run.setup(model, optimizer)
        took = _timed(run.resume)
        assert run.resumed_from is not None, "nothing was resumed"
    expected = _trained(mib, seed=0)[0].parameters()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), expected, strict=True))
    return took


def _raw(work: Path, bucket: str, i: int, files: list[Path]) -> dict[str, float]:
    """s3fs put and get of ``files``, concurrently, as paratrain's transfers run."""
    import fsspec

    fs, _ = fsspec.url_to_fs(f"s3://{bucket}", skip_instance_cache=True)
    remote = [f"{bucket}/raw{i}/{f.name}" for f in files]
    back = [str(work / f"raw{i}" / f.name) for f in files]
    (work / f"raw{i}").mkdir()
    return {
        "raw upload": _timed(lambda: fs.put([str(f) for f in files], remote)),
        "raw download": _timed(lambda: fs.get(remote, back)),
    }


def _repeat(mib: int, work: Path, bucket: str, i: int) -> dict[str, float]:
    local, url = work / f"disk{i}", f"s3://{bucket}/r{i}"
    out = {"save local": _save(mib, local, work / f"a{i}")}
    out |= _raw(work, bucket, i, [f for f in next(local.glob("step-*")).iterdir()])
    out["save s3"] = _save(mib, url, work / f"b{i}")
    out["resume local"] = _resume(mib, local, work / f"c{i}")
    out["resume s3"] = _resume(mib, url, work / f"d{i}")
    out["resume s3, cached copy"] = _resume(mib, url, work / f"b{i}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="size of the training state")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rounds = []
    with moto_s3() as server, tempfile.TemporaryDirectory() as tmp:
        os.environ.update(server.env)
        server.make_bucket("bench")
        for i in range(args.repeats):
            rounds.append(_repeat(args.mib, Path(tmp), "bench", i))
    size = sum(p.numel() * 4 for p in _trained(args.mib, 0)[0].parameters()) * 2 / 1e6
    median = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    print(f"training state {size:.0f} MB; median of {args.repeats} repeats")
    print(f"{'':24} {'seconds':>8} {'MB/s':>8} {'÷ local':>8} {'÷ raw':>8}")
    for name in ORDER:
        _row(name, median, size)


def _row(name: str, median: dict[str, float], size: float) -> None:
    saving = name.startswith(("save", "raw upload"))
    local = median["save local" if saving else "resume local"]
    raw = median["raw upload" if saving else "raw download"]
    seconds = median[name]
    versus_raw = f"{seconds / raw:8.2f}" if "s3" in name else f"{'':8}"
    print(f"{name:24} {seconds:8.3f} {size / seconds:8.0f} {seconds / local:8.2f} {versus_raw}")


if __name__ == "__main__":
    main()
