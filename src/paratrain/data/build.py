"""Building the loaders behind ``run.loader`` and ``run.eval_loader``.

    loader = make_loader(dataset, 32, train=True, shuffle=True, drop_last=False, seed=0,
                         topology=topology, data_rank=0, data_size=2, device=device,
                         num_workers=None, hooks=hooks, name="loader", kwargs={})

A map-style dataset gets a :class:`~paratrain.data.samplers.ShardedSampler` (training) or an
:class:`~paratrain.data.samplers.EvenBatchSampler` (evaluation); an ``IterableDataset`` is split by
rank and worker (:mod:`paratrain.data.streaming`) and, for training, read through torchdata's
``StatefulDataLoader``. Either is wrapped in a :class:`~paratrain.data.loader.DeviceLoader`. The
DataLoader defaults (workers, pinned memory, a generator of the run's own for worker seeds) are
chosen here, once for both kinds.
"""

from __future__ import annotations

import functools
import os
import signal
import warnings
from typing import Any

import torch
from torch.utils.data import (
    ConcatDataset,
    DataLoader,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
)

from paratrain.data.loader import DeviceLoader, LoaderHooks
from paratrain.data.samplers import EvenBatchSampler, build_sampler, dataset_size
from paratrain.data.streaming import shard_stream
from paratrain.distributed.topology import Topology
from paratrain.errors import ConfigError


def check_batch_size(batch_size: object) -> int:
    """Return ``batch_size`` or raise the error that explains per-rank batches."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ConfigError(
            f"batch_size must be a positive integer, got {batch_size!r}. It is the per-rank "
            "batch: with 4 ranks, batch_size=32 gives a global batch of 128."
        )
    return batch_size


def default_workers(
    device: torch.device, local_world_size: int, dataset: object = None
) -> tuple[int, str]:
    """How many DataLoader workers a rank gets when ``num_workers`` is not given, and why.

    default_workers(torch.device("cuda", 0), 8, TensorDataset(x, y))   # (0, "TensorDataset ...")

    0 on CPU (workers would compete with the model for the cores) and for datasets that hold
    their tensors in memory (a ``TensorDataset``, or a ``Subset``/``ConcatDataset`` of them):
    indexing one in the training process costs microseconds, less than a worker spends handing
    a batch over (pickling, a queue, a second copy). Otherwise min(4, cores per rank - 1).
    """
    if device.type == "cpu":
        return 0, "on CPU, workers would compete with the model for the cores"
    if in_memory(dataset):
        return 0, (
            f"a {type(dataset).__name__} holds its tensors in memory: indexing it here is "
            "cheaper than handing batches over from worker processes"
        )
    cores = (os.cpu_count() or 1) // max(local_world_size, 1)
    return max(0, min(4, cores - 1)), f"min(4, {cores} cores per rank - 1)"


def in_memory(dataset: object) -> bool:
    """Whether ``dataset`` is a ``TensorDataset``, or a ``Subset``/``ConcatDataset``/
    ``StackDataset`` made only of them."""
    if isinstance(dataset, TensorDataset):
        return True
    if isinstance(dataset, Subset):
        return in_memory(dataset.dataset)
    if isinstance(dataset, ConcatDataset):
        return all(in_memory(d) for d in dataset.datasets)
    if isinstance(dataset, StackDataset):
        parts = dataset.datasets
        return all(in_memory(d) for d in (parts.values() if isinstance(parts, dict) else parts))
    return False


def _defaults(
    kwargs: dict[str, Any],
    device: torch.device,
    topology: Topology,
    num_workers: int | None,
    *,
    persistent: bool,
    dataset: object = None,
    hooks: LoaderHooks | None = None,
    name: str = "loader",
) -> tuple[int, bool]:
    """Fill the DataLoader defaults into ``kwargs``; (workers, whether the run owns the
    generator that seeds them). On a GPU, the worker count chosen is said (``hooks.note``)."""
    if num_workers is None:
        workers, why = default_workers(device, topology.local_world_size, dataset)
        if hooks is not None and device.type != "cpu":
            hooks.note(
                f"paratrain: {name}: {workers} DataLoader worker(s) per rank ({why}); pass "
                "num_workers= to choose"
            )
    else:
        workers = num_workers
    kwargs.setdefault("pin_memory", device.type == "cuda")
    kwargs.setdefault("persistent_workers", persistent and workers > 0)
    signals = hooks.worker_signals() if hooks is not None and workers > 0 else ()
    if signals:  # a signal sent to the whole job must not kill a worker mid-batch
        kwargs["worker_init_fn"] = functools.partial(
            _worker_init, signals, kwargs.get("worker_init_fn")
        )
    owns_generator = "generator" not in kwargs
    kwargs.setdefault("generator", torch.Generator())
    return workers, owns_generator


def _worker_init(signals: tuple[int, ...], user_init: Any, worker_id: int) -> None:
    """In a DataLoader worker: ignore the preemption ``signals``, then run the script's own
    ``worker_init_fn``."""
    for number in signals:
        signal.signal(number, signal.SIG_IGN)
    if user_init is not None:
        user_init(worker_id)


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
    ``IterableDataset``, see :mod:`paratrain.data.streaming`)."""
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
    workers, owns_generator = _defaults(
        kwargs, device, topology, num_workers, persistent=True, dataset=dataset, hooks=hooks,
        name=name,
    )  # fmt: skip
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
