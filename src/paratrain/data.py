"""Per-rank data loading with correct samplers, and batches delivered on the right device.

    loader = run.loader(train_set, batch_size=32, shuffle=True)      # 32 samples per rank
    for x, y in loader:          # on run.device; the sampler's epoch is set for you
        ...
    evaluation = run.eval_loader(test_set, batch_size=256)             # every sample exactly once

A training :class:`DeviceLoader` knows where it is: the epoch of its pass and the samples all
ranks consumed in it. That position is part of every checkpoint (``state_dict``), so a resumed
run continues each loader exactly where it stopped, and ``len(loader)`` is the length of the pass
about to run (shorter right after a mid-epoch resume). A second pass within one epoch (a loop
that does not use ``run.epochs``) is shuffled as the next epoch, with a warning, instead of
repeating the same order. Samplers: :mod:`paratrain.samplers`.

An ``IterableDataset`` (a stream: HF ``datasets`` streaming, webdataset, a generator) is split by
rank and DataLoader worker (:mod:`paratrain.streaming`) and read through torchdata's
``StatefulDataLoader``, whose per-rank state is part of every checkpoint. In a multi-rank run the
ranks agree after each fetch whether all of them got a batch (a tiny all-reduce on a gloo side
group), so uneven shares end the pass on every rank at once instead of leaving one rank waiting in
a collective; the first batches are compared, and ranks or workers that got the same data are
reported.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from paratrain import faults
from paratrain.errors import ConfigError
from paratrain.samplers import (
    EvenBatchSampler,
    ExactOnceSampler,
    ShardedSampler,
    build_sampler,
    dataset_size,
)
from paratrain.streaming import StreamShard, fingerprint, shard_stream
from paratrain.topology import Topology

__all__ = [
    "DeviceLoader",
    "EvenBatchSampler",
    "ExactOnceSampler",
    "LoaderHooks",
    "ShardedSampler",
    "build_sampler",
    "check_batch_size",
    "make_loader",
    "to_device",
]

T = TypeVar("T")
_PASSES = itertools.count()


def to_device(batch: T, device: torch.device, *, non_blocking: bool = False) -> T:
    """Move every tensor in ``batch`` (tensors, lists, tuples, namedtuples, dicts, dataclasses)."""
    moved: Any
    if isinstance(batch, torch.Tensor):
        moved = batch.to(device, non_blocking=non_blocking)
    elif isinstance(batch, Mapping):
        moved = type(batch)(  # type: ignore[call-arg]
            {k: to_device(v, device, non_blocking=non_blocking) for k, v in batch.items()}
        )
    elif isinstance(batch, tuple) and hasattr(batch, "_fields"):
        moved = type(batch)(*(to_device(v, device, non_blocking=non_blocking) for v in batch))
    elif isinstance(batch, (list, tuple)):
        moved = type(batch)(to_device(v, device, non_blocking=non_blocking) for v in batch)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {
            f.name: to_device(getattr(batch, f.name), device, non_blocking=non_blocking)
            for f in dataclasses.fields(batch)
            if f.init
        }
        moved = dataclasses.replace(batch, **changes)
    else:
        moved = batch
    return moved  # type: ignore[no-any-return]


class LoaderHooks(Protocol):
    """What a loader asks of the run it belongs to."""

    def current_epoch(self) -> int:
        """The run's epoch (``run.epoch``)."""
        ...

    def on_pass_start(self, loader: DeviceLoader[Any]) -> None:
        """A pass begins (training: the loop starts; evaluation: sync buffers)."""
        ...

    def on_batch(self) -> None:
        """A batch arrived (progress for the hang watchdog)."""
        ...

    def warn(self, message: str) -> None:
        """A warning from the main process."""
        ...

    def stream_group(self) -> Any:
        """A gloo process group of all ranks for streams to agree on (None: one process)."""
        ...


@dataclasses.dataclass(slots=True)
class Position:
    """Where a training loader is: the epoch of its pass and the samples all ranks consumed."""

    epoch: int = -1
    """Epoch of the current (or last) pass; -1 before the first."""
    samples: int = 0
    """Samples of the global order consumed in that pass, by all ranks together."""
    finished: bool = False
    """True once that pass ran to its end."""
    running: bool = True
    """True while that pass is being iterated. A pass left before its end (``break``,
    ``next(iter(loader))``) is over: the next pass of the same epoch starts that epoch's order
    from the beginning, as torch's DistributedSampler does."""


class DeviceLoader(Generic[T]):
    """Wraps a DataLoader: sets the sampler epoch, moves batches, knows its position."""

    def __init__(
        self,
        loader: DataLoader[Any],
        device: torch.device,
        *,
        hooks: LoaderHooks,
        train: bool,
        world_size: int = 1,
        name: str = "loader",
    ) -> None:
        self.loader = loader
        self.device = device
        self.hooks = hooks
        self.train = train
        self.world_size = world_size
        self.name = name
        """Key of this loader's position in checkpoints."""
        self.position = Position()
        """The current (or last) pass; saved with every checkpoint."""
        self.in_progress = False
        """True while a pass is being iterated."""
        self.pass_id = -1
        """Increases with every pass of any loader: the earliest running pass drives the epoch."""
        self.pass_length: int | None = None
        """Batches of the current pass; None when the length is unknown."""
        self.samples = 0
        """Samples handed out by this loader in all passes (for throughput stats)."""
        self.data_wait_s = 0.0
        """Seconds spent waiting for the next batch in all passes."""
        self.pass_seed: Any = None
        """``epoch -> seed`` of the loader's own generator (worker seeds), when the run owns it."""
        self._restored: Position | None = None
        self._warned_second_pass = False
        self.stream: StreamShard | None = None
        """The dataset as split for this rank (an ``IterableDataset`` was given)."""
        self.group: Any = None
        """Side group on which the ranks' streams agree to end a pass together (None: don't)."""
        self.data_rank = 0
        self._stream_state: Any = None
        self._firsts: list[str] | None = []  # fingerprints of the first pass's first batches
        self._warned_uneven = False

    # -- position ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The loader's position (plain data)."""
        return {**dataclasses.asdict(self.position), "running": self.in_progress}

    def stream_state(self) -> dict[str, Any] | None:
        """This rank's stream position (every worker's), or None for a map-style dataset."""
        if self.stream is None or not self.train:
            return None
        return self.loader.state_dict()  # type: ignore[attr-defined, no-any-return]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` at the next pass (a resumed run). A stream's ``state`` may
        carry this rank's ``"stream"`` position (absent: saved at another world size)."""
        fields = {k: v for k, v in state.items() if k != "stream"}
        self.position = Position(**fields)
        self._restored = Position(**fields)
        self._stream_state = state.get("stream")

    def _next_pass(self) -> tuple[int, int]:
        """(epoch, samples to skip) of the pass about to start."""
        run_epoch = self.hooks.current_epoch()
        last, restored = self.position, self._restored
        if restored is not None and restored.epoch >= run_epoch:
            if restored.running and not restored.finished:  # saved mid-pass: continue it
                return restored.epoch, restored.samples
            if restored.finished and restored.epoch == run_epoch:
                # Saved while another loader was mid-pass, after this one's pass of the epoch
                # ended: that pass was consumed before the save, so it is empty now.
                return restored.epoch, self._size()
        if last.epoch >= run_epoch and last.finished:
            return last.epoch + 1, 0  # another full pass in one epoch: shuffled as the next
        if last.epoch >= run_epoch:
            return last.epoch, 0  # a pass left early (a peek, `next(iter(...))`) starts over
        return run_epoch, 0

    def _size(self) -> int:
        sampler = self.loader.sampler
        return sampler.size if isinstance(sampler, ShardedSampler) else 0

    def __bool__(self) -> bool:
        return True  # a loader is a loader, even an empty one or a stream without a length

    def __len__(self) -> int:
        if self.stream is not None and not callable(getattr(self.stream.dataset, "__len__", None)):
            raise TypeError(
                f"{self.name} reads a stream ({type(self.stream.dataset).__name__}), which has no "
                "length: count steps yourself (e.g. `while run.global_step < max_steps`), or give "
                "the dataset a __len__ of this rank's batches."
            )
        if self.in_progress and self.pass_length is not None:
            return self.pass_length
        sampler = self.loader.sampler
        if self.train and isinstance(sampler, ShardedSampler):
            return self._batches(sampler.length_from(self._next_pass()[1]))
        return len(self.loader)

    def last_batch_size(self) -> int | None:
        """Samples in the last batch of a full pass when it is a short one, else None."""
        sampler = self.loader.sampler
        size = self.loader.batch_size or 1
        if self.loader.drop_last or not isinstance(sampler, ShardedSampler):
            return None
        return len(sampler) % size or None

    def _batches(self, samples: int) -> int:
        size = self.loader.batch_size or 1
        return samples // size if self.loader.drop_last else -(-samples // size)

    @property
    def sampler(self) -> Any:
        """The underlying sampler (a ShardedSampler for training loaders)."""
        return self.loader.sampler

    @property
    def dataset(self) -> Any:
        """The dataset given to ``run.loader`` (the whole dataset, not this rank's share:
        ``len(loader.dataset)`` is what a DataLoader script prints as the total)."""
        if self.stream is not None:
            return self.stream.dataset
        return self.loader.dataset

    @property
    def batch_size(self) -> int | None:
        """Samples per batch on this rank (the per-rank batch)."""
        return self.loader.batch_size

    @property
    def drop_last(self) -> bool:
        """Whether a short last batch is dropped."""
        return bool(self.loader.drop_last)

    def __getattr__(self, name: str) -> Any:
        # Anything else a DataLoader has (num_workers, pin_memory, collate_fn, generator, ...)
        # reads as it does on the DataLoader inside. Only called for names not found above.
        if name.startswith("__") or name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    # -- iteration -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        # First: a restarted run resumes here (loop_action), so the pass chosen below starts
        # where the checkpoint stopped, even for `it = iter(loader)` before the loop's first step.
        self.hooks.on_pass_start(self)
        if not self.train:
            return self._iterate(self.hooks.current_epoch(), 0)
        epoch, start = self._next_pass()
        restored, self._restored = self._restored, None
        if restored is None and self.position.epoch >= self.hooks.current_epoch():
            self._warn_second_pass(epoch, abandoned=not self.position.finished)
        if self.stream is not None:
            return self._stream_pass(epoch, restored)
        return self._iterate(epoch, start)

    def _stream_pass(self, epoch: int, restored: Position | None) -> Iterator[Any]:
        """A pass over the stream: from its start, or from the saved position of a resume."""
        assert self.stream is not None
        self.stream.set_epoch(epoch)
        state, self._stream_state = self._stream_state, None
        if restored is None or restored.epoch != epoch:
            return self._iterate(epoch, 0)
        if restored.finished:  # consumed before the save: an empty pass
            self.position = Position(epoch=epoch, samples=restored.samples, finished=True)
            return iter(())
        if not restored.running:  # left early before the save: the epoch starts over
            return self._iterate(epoch, 0)
        if state is not None:
            self.loader.load_state_dict(state)  # type: ignore[attr-defined]
            if not self.stream.stateful and restored.samples:
                self.hooks.warn(
                    f"{self.name}: {type(self.stream.dataset).__name__}: "
                    f"{self.stream.replayed_because}, so resuming reads and discards the "
                    "examples each worker had consumed before the save (exact, but slow for a "
                    "long stream)."
                )
        elif restored.samples:
            self._skip_about(restored.samples)
        return self._iterate(epoch, restored.samples)

    def _skip_about(self, samples: int) -> None:
        """Resumed at another world size: each worker skips its share of ``samples``."""
        assert self.stream is not None
        workers = max(self.loader.num_workers, 1)
        each = samples if self.stream.split else samples // (self.world_size * workers)
        self.stream.load_state_dict({"consumed": each, "dataset": None})
        self.hooks.warn(
            f"{self.name}: saved at another world size, so the stream's position cannot be "
            f"mapped exactly: every worker skips about {each} examples of its share "
            f"({samples} examples were consumed in all). Resume at the saved world size for "
            "an exact continuation."
        )

    def _warn_second_pass(self, epoch: int, *, abandoned: bool) -> None:
        if self._warned_second_pass:
            return
        self._warned_second_pass = True
        now = self.hooks.current_epoch()
        if abandoned:
            self.hooks.warn(
                f"{self.name} started its pass of epoch {epoch} again before the last one ended: "
                "every `iter(loader)` starts the epoch's order from the beginning (as with "
                "torch's DistributedSampler), so `next(iter(loader))` in a loop gives the same "
                "batch every time. Keep one iterator to walk the loader (it = iter(loader) once "
                "per epoch, then next(it))."
            )
            return
        self.hooks.warn(
            f"{self.name} started a new pass while epoch {now} already had one; it is shuffled "
            f"as epoch {epoch} so it does not repeat the order. Loop with "
            "`for epoch in run.epochs(N):` so that samplers, checkpoints and resume know the "
            "epoch (a `for epoch in range(N)` loop never tells them)."
        )

    def _iterate(self, epoch: int, start: int) -> Iterator[Any]:
        sampler = self.loader.sampler
        # Not looked up again in `finally`, which may run at interpreter exit (an unfinished
        # `it = iter(loader)`), when module globals such as ShardedSampler are already gone.
        sharded = sampler if isinstance(sampler, ShardedSampler) else None
        if isinstance(sampler, (ShardedSampler, DistributedSampler)):
            sampler.set_epoch(epoch)
        if sharded is not None:
            sharded.set_start(start)
        if self.pass_seed is not None and self.loader.generator is not None:
            # Iterators draw worker seeds from this generator, not from the global one, so the
            # model's random stream (dropout) does not depend on when a pass starts: resuming
            # mid-epoch then replays it exactly.
            self.loader.generator.manual_seed(self.pass_seed(epoch))
            if start == 0 or not self.train:
                # A DataLoader without a generator draws its base seed from the global one at
                # every iter(), even with num_workers=0. Draw it too, so a one-process port of
                # a DataLoader script keeps every later random number (dropout masks). A pass
                # continued after a resume made this draw before the save: not again.
                torch.empty((), dtype=torch.int64).random_()
        self.pass_id = next(_PASSES)
        self.pass_length = _length(self.loader)
        if self.train:
            self.position = Position(epoch=epoch, samples=start)
        batch_size = self.loader.batch_size or 1
        non_blocking = bool(self.loader.pin_memory) and self.device.type == "cuda"
        self.in_progress = True
        try:
            iterator = iter(self.loader)
            while True:
                started = time.perf_counter()
                batch = next(iterator, _END)
                if self._firsts is not None and self.stream is not None and self.train:
                    self._check_shares(batch)
                if self.group is not None and self.train:
                    if not self._all_have_batch(batch is not _END):
                        break
                elif batch is _END:
                    break
                self.data_wait_s += time.perf_counter() - started
                self.samples += _batch_len(batch)
                if self.train:
                    self.position.samples += batch_size * self.world_size
                self.hooks.on_batch()
                if not self.train:
                    faults.emit("eval_batch")
                with record_function("paratrain: batch to device"):
                    moved = to_device(batch, self.device, non_blocking=non_blocking)
                yield moved
            if self.train:
                self.position.finished = True
        finally:
            self.in_progress = False
            if sharded is not None:
                sharded.set_start(0)

    # -- streams: shares and a common end ------------------------------------------------------
    def _check_shares(self, batch: Any) -> None:
        """First pass: the first batch of every rank, and of every worker, must differ. The
        ranks compare at their first fetch (each rank exactly one collective, at the same
        point); the workers' first batches are compared locally."""
        assert self._firsts is not None
        workers = max(self.loader.num_workers, 1)
        digest = None if batch is _END else fingerprint(batch)
        if not self._firsts and self.group is not None:
            shares: list[Any] = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(shares, (self.data_rank, digest), group=self.group)
            ranks: dict[str, set[int]] = {}
            for data_rank, first in shares:
                if first is not None:
                    ranks.setdefault(first, set()).add(data_rank)
            if any(len(r) > 1 for r in ranks.values()):
                self.hooks.warn(
                    f"{self.name}: several ranks got the same first batch, so the dataset does "
                    "not split itself by rank: every rank trains on the same examples. Let "
                    "paratrain split it (run.loader(..., shard=True)) or split by rank in the "
                    "dataset (webdataset: nodesplitter=wds.split_by_node)."
                )
        if digest is not None:
            self._firsts.append(digest)
        if digest is not None and len(self._firsts) < workers:
            return
        mine, self._firsts = self._firsts, None
        if len(set(mine)) < len(mine):
            dataset = type(self.stream.dataset).__name__ if self.stream else "the dataset"
            self.hooks.warn(
                f"{self.name}: {workers} DataLoader workers gave identical first batches, so "
                f"{dataset} does not split itself by worker: every example is read once per "
                "worker. Split in the dataset with torch.utils.data.get_worker_info() "
                "(webdataset: workersplitter=wds.split_by_worker), or pass "
                "run.loader(..., shard=True)."
            )

    def _all_have_batch(self, has: bool) -> bool:
        """All ranks fetched a batch (else every rank ends the pass here, together)."""
        flags = torch.tensor([int(has), -int(has)])
        dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=self.group)
        every, some = int(flags[0]) == 1, int(flags[1]) == -1
        if not every and some and not self._warned_uneven:
            self._warned_uneven = True
            self.hooks.warn(
                f"{self.name}: the ranks' shares of the stream ended at different batches; every "
                "rank ended the pass at the first end, so all run the same number of steps (the "
                "rest of the longer shares is not used in this pass). Shards of equal size, or a "
                "number of files the world size divides, avoid the loss."
            )
        return every


_END: Any = object()


def _batch_len(batch: Any) -> int:
    while isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    if isinstance(batch, Mapping) and batch:
        return _batch_len(next(iter(batch.values())))
    return len(batch) if isinstance(batch, torch.Tensor) and batch.dim() else 0


def _length(loader: DataLoader[Any]) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def check_batch_size(batch_size: object) -> int:
    """Return ``batch_size`` or raise the error that explains per-rank batches."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ConfigError(
            f"batch_size must be a positive integer, got {batch_size!r}. It is the per-rank "
            "batch: with 4 ranks, batch_size=32 gives a global batch of 128."
        )
    return batch_size


def default_workers(device: torch.device, local_world_size: int) -> int:
    """0 on CPU (workers would compete with compute for cores), else min(4, cores per rank)."""
    if device.type == "cpu":
        return 0
    return max(0, min(4, (os.cpu_count() or 1) // max(local_world_size, 1) - 1))


def _defaults(
    kwargs: dict[str, Any],
    device: torch.device,
    topology: Topology,
    num_workers: int | None,
    *,
    persistent: bool,
) -> tuple[int, bool]:
    """Fill the DataLoader defaults into ``kwargs``; (workers, whether the run owns the
    generator that seeds them)."""
    workers = (
        default_workers(device, topology.local_world_size) if num_workers is None else num_workers
    )
    kwargs.setdefault("pin_memory", device.type == "cuda")
    kwargs.setdefault("persistent_workers", persistent and workers > 0)
    owns_generator = "generator" not in kwargs
    kwargs.setdefault("generator", torch.Generator())
    return workers, owns_generator


def _pass_seed(seed: int, rank: int) -> Any:
    """``epoch -> seed`` of a loader's own generator (its workers' seeds), per rank."""
    return lambda epoch: ((seed * 1_000_003 + epoch) * 4099 + rank) % 2**63


def make_loader(
    dataset: Dataset[Any],
    batch_size: int,
    *,
    train: bool,
    shuffle: bool,
    drop_last: bool,
    seed: int,
    topology: Topology,
    data_rank: int,
    data_size: int,
    device: torch.device,
    num_workers: int | None,
    hooks: LoaderHooks,
    name: str,
    kwargs: dict[str, Any],
) -> DeviceLoader[Any]:
    """The DataLoader behind ``run.loader`` / ``run.eval_loader``, wrapped in a DeviceLoader.

    ``kwargs`` go to the DataLoader, except ``shard`` (streams only: how to split an
    ``IterableDataset``, see :mod:`paratrain.streaming`)."""
    check_batch_size(batch_size)
    shard = kwargs.pop("shard", "auto")
    if isinstance(dataset, IterableDataset):
        return _stream_loader(
            dataset, batch_size, train=train, drop_last=drop_last, seed=seed, topology=topology,
            data_rank=data_rank, data_size=data_size, device=device, num_workers=num_workers,
            hooks=hooks, name=name, kwargs=kwargs, shard=shard,
        )  # fmt: skip
    if shard != "auto":
        raise ConfigError(
            f"run.loader(shard={shard!r}) is for an IterableDataset (a stream); "
            f"{type(dataset).__name__} is map-style, which paratrain always splits by rank with "
            "its sampler. Drop shard=."
        )
    for reserved in ("sampler", "batch_sampler"):
        if reserved in kwargs:
            raise ConfigError(
                f"run.loader chooses the {reserved} itself, so ranks get disjoint data. Drop "
                f"{reserved}=..., or build your own DataLoader and skip run.loader."
            )
    workers, owns_generator = _defaults(kwargs, device, topology, num_workers, persistent=True)
    rank, world = data_rank, data_size  # ranks of one tp group read the same share
    if train:
        sampler = build_sampler(
            dataset,
            train=True,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=seed,
            rank=rank,
            world_size=world,
        )
        loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=workers,
            drop_last=drop_last,
            **kwargs,
        )
    else:
        batches = EvenBatchSampler(
            dataset_size(dataset), rank=rank, world_size=world, batch_size=batch_size
        )
        loader = DataLoader(dataset, batch_sampler=batches, num_workers=workers, **kwargs)
    device_loader: DeviceLoader[Any] = DeviceLoader(
        loader, device, hooks=hooks, train=train, world_size=world, name=name
    )
    if owns_generator:
        device_loader.pass_seed = _pass_seed(seed, rank)
    return device_loader


def _stream_loader(
    dataset: IterableDataset[Any],
    batch_size: int,
    *,
    train: bool,
    drop_last: bool,
    seed: int,
    topology: Topology,
    data_rank: int,
    data_size: int,
    device: torch.device,
    num_workers: int | None,
    hooks: LoaderHooks,
    name: str,
    kwargs: dict[str, Any],
    shard: object,
) -> DeviceLoader[Any]:
    """A loader over this rank's share of a stream; training ones resume where they stopped."""
    stream, how = shard_stream(dataset, rank=data_rank, world=data_size, shard=shard)
    for reserved in ("sampler", "batch_sampler"):
        if reserved not in kwargs:
            continue
        raise ConfigError(
            f"run.loader got {reserved}= for {type(dataset).__name__}, an IterableDataset: a "
            "stream has no indices to sample. Drop the argument; split and shuffle in the "
            "dataset (HF datasets: .shuffle(seed=, buffer_size=); webdataset: .shuffle(n))."
        )
    # Workers keep their copy of the dataset for the life of a persistent iterator, so a new
    # epoch (set_epoch, reshuffled buffers) would not reach them: streams start workers per pass.
    workers, owns_generator = _defaults(kwargs, device, topology, num_workers, persistent=False)
    loader: DataLoader[Any]
    if train:
        from torchdata.stateful_dataloader import StatefulDataLoader  # type: ignore[import-untyped]

        with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, now deprecated
            warnings.filterwarnings("ignore", message=".*set_vital")
            loader = StatefulDataLoader(
                stream, batch_size=batch_size, num_workers=workers, drop_last=drop_last, **kwargs
            )
    else:
        loader = DataLoader(
            stream, batch_size=batch_size, num_workers=workers, drop_last=drop_last, **kwargs
        )
    device_loader: DeviceLoader[Any] = DeviceLoader(
        loader, device, hooks=hooks, train=train, world_size=data_size, name=name
    )
    device_loader.stream = stream
    device_loader.data_rank = data_rank
    if train and topology.world_size > 1:
        device_loader.group = hooks.stream_group()
    if owns_generator:
        device_loader.pass_seed = _pass_seed(seed, data_rank)
    if stream.split and (data_size > 1 or workers > 1):
        hooks.warn(how)
    return device_loader
