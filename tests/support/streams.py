"""Streaming datasets for the tests, built from local files, and one loop that trains on them.

    urls = write_tar_shards(tmp, shards=4, per_shard=12)   # webdataset-style .tar shards
    files = write_jsonl_shards(tmp, shards=4, per_shard=12)
    seen, weights = train_on_stream(("webdataset", urls), root, stop_at=5)

Every example carries its id, so a test can compare exactly which examples each rank saw, and in
which order, between an uninterrupted run and a stopped-and-resumed one.
"""

from __future__ import annotations

import io
import os
import random
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import IterableDataset

import paratrain as pt

FEATURES = 4


def features(i: int) -> list[float]:
    """The input of example ``i`` (deterministic)."""
    g = torch.Generator().manual_seed(i)
    return torch.randn(FEATURES, generator=g).tolist()


def write_tar_shards(root: Path, *, shards: int, per_shard: int) -> list[str]:
    """``shards`` tar files in webdataset's layout: per example ``<key>.id`` and ``<key>.x``."""
    root.mkdir(parents=True, exist_ok=True)
    urls = []
    for s in range(shards):
        path = root / f"shard-{s:04d}.tar"
        with tarfile.open(path, "w") as tar:
            for k in range(per_shard):
                i = s * per_shard + k
                for ext, text in (("id", str(i)), ("x", ",".join(map(str, features(i))))):
                    data = text.encode()
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        urls.append(str(path))
    return urls


def write_jsonl_shards(root: Path, *, shards: int, per_shard: int) -> list[str]:
    """``shards`` JSON-lines files of ``{"id": i, "x": [...]}``."""
    import json

    root.mkdir(parents=True, exist_ok=True)
    files = []
    for s in range(shards):
        path = root / f"part-{s:04d}.jsonl"
        with path.open("w") as f:
            for k in range(per_shard):
                i = s * per_shard + k
                f.write(json.dumps({"id": i, "x": features(i)}) + "\n")
        files.append(str(path))
    return files


class Counting(IterableDataset[dict[str, Any]]):
    """A generator stream with no idea of ranks or workers (paratrain splits it)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(self.n):
            yield {"id": i, "x": torch.tensor(features(i))}


class GloballyShuffled(IterableDataset[dict[str, Any]]):
    """Shuffles with Python's global ``random``, which every DataLoader worker and rank seeds
    differently: each reads the stream in another order (what paratrain's split cannot use)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[dict[str, Any]]:
        ids = list(range(self.n))
        random.shuffle(ids)
        for i in ids:
            yield {"id": i, "x": torch.tensor(features(i))}


class ShuffledInOneWorker(IterableDataset[dict[str, Any]]):
    """In order everywhere but in worker 1 of rank 1, which shuffles: only that rank can see it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[dict[str, Any]]:
        ids = list(range(self.n))
        info = torch.utils.data.get_worker_info()
        if torch.distributed.get_rank() == 1 and info is not None and info.id == 1:
            random.Random(0).shuffle(ids)
        for i in ids:
            yield {"id": i, "x": torch.tensor(features(i))}


class Uneven(IterableDataset[dict[str, Any]]):
    """Splits itself by rank (rank r yields ``sizes[r]`` examples), not by worker."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __iter__(self) -> Iterator[dict[str, Any]]:
        rank = torch.distributed.get_rank()
        start = sum(self.sizes[:rank])
        for i in range(start, start + self.sizes[rank]):
            yield {"id": i, "x": torch.tensor(features(i))}


class Same(IterableDataset[dict[str, Any]]):
    """Claims to split itself (it mentions get_rank) but gives every rank the same examples."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[dict[str, Any]]:
        _ = torch.distributed.get_rank  # mentioned, never used: the mistake to detect
        for i in range(self.n):
            yield {"id": i, "x": torch.tensor(features(i))}


def _decode(sample: dict[str, Any]) -> dict[str, Any]:
    x = [float(v) for v in sample["x"].decode().split(",")]
    return {"id": int(sample["id"].decode()), "x": torch.tensor(x)}


def build(source: tuple[str, Any]) -> IterableDataset[Any]:
    """The dataset a rank reads: ``("webdataset", urls)``, ``("hf", files)``, or a class name
    of this module with its argument."""
    kind, arg = source
    if kind == "webdataset":
        import webdataset as wds

        return (  # type: ignore[no-any-return]
            wds.WebDataset(
                arg,
                shardshuffle=False,
                nodesplitter=wds.split_by_node,
                workersplitter=wds.split_by_worker,
                empty_check=False,
            ).map(_decode)
        )
    if kind in ("hf", "hf-shuffled"):
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        from datasets import load_dataset

        stream = load_dataset("json", data_files=arg, split="train", streaming=True)
        if kind == "hf-shuffled":  # a shuffle buffer: its own state would lose the buffer
            stream = stream.shuffle(seed=3, buffer_size=8)
        return stream.with_format("torch")  # type: ignore[no-any-return]
    return globals()[kind](arg)  # type: ignore[no-any-return]


def train_on_stream(
    source: tuple[str, Any],
    root: str,
    *,
    stop_at: int | None = None,
    epochs: int = 2,
    batch_size: int = 3,
    workers: int = 2,
    strategy: str = "auto",
    shard: Any = "auto",
    loader_first: bool = False,
) -> dict[str, Any]:
    """Train on the stream for ``epochs``; ``stop_at``: save at that step and return. A second
    call with the same ``root`` resumes. Returns the ids seen per step, the epoch of each step,
    the weights and the step."""
    seen: list[list[int]] = []
    epoch_of_step: list[int] = []
    with pt.Run(strategy=strategy, run_dir=root, progress=False, seed=0, timeout_s=60) as run:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        model, opt = run.setup(model, opt)
        if not loader_first:
            run.resume()  # the loader made after: its saved position waits for it
        # The ranks are spawned, so workers would be too (each importing torch): fork them.
        fork = {"multiprocessing_context": "fork"} if workers else {}
        loader = run.loader(
            build(source), batch_size=batch_size, num_workers=workers, shard=shard, **fork
        )
        if loader_first:
            run.resume()
        for _ in run.epochs(epochs):
            for batch in loader:
                seen.append([int(i) for i in batch["id"]])
                epoch_of_step.append(run.epoch)
                loss = model(batch["x"]).pow(2).mean()
                run.backward(loss)
                run.step(opt)
                if stop_at is not None and run.global_step == stop_at:
                    run.save()
                    return {
                        "seen": seen,
                        "epochs": epoch_of_step,
                        "weights": None,
                        "step": run.global_step,
                    }
        weights = {k: v.clone() for k, v in run.strategy.full_state_dict(model).items()}
        return {"seen": seen, "epochs": epoch_of_step, "weights": weights, "step": run.global_step}
