"""Streaming (iterable) datasets: every rank and DataLoader worker reads its own share, and each
checkpoint holds where every worker's stream stands.

    stream = shard_stream(dataset, rank=1, world=4, shard="auto")     # a StreamShard
    loader = StatefulDataLoader(stream, batch_size=32, num_workers=2)
    state = loader.state_dict()          # this rank's position: every worker's, plus the order
    loader.load_state_dict(state)        # a resumed run continues exactly there

How a stream is split (``run.loader(dataset, shard=...)``):

* HF ``datasets`` iterable datasets: ``datasets.distributed.split_dataset_by_node`` (whole files
  per rank when their number divides, else every world-th example); ``datasets`` then splits the
  files over the DataLoader workers itself.
* ``shard=True`` (the default for a dataset that shows no sign of splitting itself): worker ``w``
  of rank ``r`` keeps example ``i`` when ``i % (ranks x workers) == r x workers + w``. Every
  worker reads the whole stream to do that, so a dataset that splits by files is faster.
* ``shard=False`` (the default for webdataset, and for datasets whose methods call
  ``get_worker_info``/``get_rank``): the dataset yields each rank's and worker's share itself.
  paratrain compares the first batches and says so when two ranks or two workers got the same.

``shard=True`` needs every rank and worker to read the stream in one order: each worker digests
the first examples of its pass (:func:`order_digest`), and the loader refuses ranks or workers
whose digests differ (a shuffle from Python's global ``random`` inside workers does that).

Position: a dataset with ``state_dict``/``load_state_dict`` (HF ``datasets``, your own) is saved
and restored through torchdata's ``StatefulDataLoader``; one without is counted instead, and a
resume reads and discards the examples each worker had consumed (printed as a note). A resume at
another layout gives the shards the examples consumed before the save as *stages*
(:class:`StreamShard`, :mod:`paratrain.data.stream_resume`).
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Iterator
from typing import Any

import torch
import xxhash
from torch.utils.data import IterableDataset, get_worker_info

from paratrain.errors import ConfigError

__all__ = [
    "SHARD_CHOICES",
    "StreamShard",
    "fingerprint",
    "order_digest",
    "order_problem",
    "shard_stream",
    "splits_itself",
]

SHARD_CHOICES = ("auto", True, False)
_SPLIT_CALLS = {"get_worker_info", "get_rank", "split_by_worker", "split_by_node"}


def is_hf_iterable(dataset: object) -> bool:
    """True for a ``datasets.IterableDataset`` (checked without importing ``datasets``)."""
    return any(
        k.__name__ == "IterableDataset" and k.__module__.split(".")[0] == "datasets"
        for k in type(dataset).__mro__
    )


def splits_itself(dataset: object) -> bool:
    """True when ``dataset`` visibly yields a different share per rank or worker: webdataset
    (its node and worker splitters), or a class whose own methods call ``get_worker_info``,
    ``get_rank`` or webdataset's splitters."""
    if type(dataset).__module__.split(".")[0] == "webdataset":
        return True
    for klass in type(dataset).__mro__:
        if klass.__module__.split(".")[0] in ("torch", "builtins", "typing"):
            continue
        for value in vars(klass).values():
            code = getattr(getattr(value, "__func__", value), "__code__", None)
            if isinstance(code, types.CodeType) and _names(code) & _SPLIT_CALLS:
                return True
    return False


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _stateful(obj: object) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def _buffer_shuffled(dataset: object) -> bool:
    """True for an HF ``datasets`` stream with a shuffle buffer (``.shuffle(buffer_size=)``),
    whose own ``state_dict`` loses the buffered examples on resume (and, in datasets 5.2, fails
    to load in DataLoader workers)."""
    todo, seen = [getattr(dataset, "_ex_iterable", None)], 0
    while todo and seen < 1000:
        node = todo.pop()
        seen += 1
        if node is None:
            continue
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            return True
        todo.append(getattr(node, "ex_iterable", None))
        todo.extend(getattr(node, "ex_iterables", None) or [])
    return False


class StreamShard(IterableDataset[Any]):
    """One rank's share of a stream, split further over DataLoader workers, with a position.

    ``split=True``: worker ``w`` of ``workers`` on rank ``rank`` of ``world`` keeps examples
    ``i % (world x workers) == rank x workers + w``; ``split=False``: every example the dataset
    yields (it splits itself). ``state_dict()`` is the worker's position: the examples of the
    dataset it consumed, the dataset's own state when it has one, and its split.

    A pass resumed at another layout (world size or worker count) carries *stages*: the examples
    the earlier layouts consumed before the save, as rules ``[every, keep, upto]`` (example ``j``
    of the stage was consumed when ``j < upto and j % every == keep``). Each stage numbers only
    the examples the stages before it left; the shard then splits what is left, so no example is
    seen twice and the new shares differ by at most one example. The stages hold for the resumed
    epoch only (``epoch``).
    """

    def __init__(self, dataset: IterableDataset[Any], *, rank: int, world: int, split: bool):
        self.dataset = dataset
        self.rank, self.world, self.split = rank, world, split
        # A shuffle buffer's state is not exact: such a stream is counted and replayed instead
        # (its shuffle is seeded by seed and epoch, so replaying it gives the same order).
        shuffled = _stateful(dataset) and _buffer_shuffled(dataset)
        self.stateful = _stateful(dataset) and not shuffled
        self.replayed_because = (
            "its shuffle buffer cannot be saved exactly (datasets' own state drops the buffered "
            "examples)"
            if shuffled
            else "it has no state_dict()/load_state_dict()"
        )
        """Why a resume replays this stream instead of loading its state."""
        self.epoch: int | None = None
        """The epoch of the pass (``set_epoch``); a resume made for another epoch is ignored."""
        self.every, self.keep = 1, 0
        """This worker's split: it keeps example ``j`` of its stage when ``j % every == keep``."""
        self.stages: list[list[list[int]]] = []
        """Examples of this pass consumed by earlier layouts (see the class docstring)."""
        self.counters = [0]
        """Examples that reached each stage in this pass (the last: this worker's stage)."""
        self.order: str | None = None
        """Digest of the first examples of the pass, read from the stream's start (None: not
        read from the start, or examples without a content digest). Equal on every rank and
        worker when the stream's order is, which ``split=True`` needs."""
        self.resume_at: dict[str, Any] | None = None
        """Where the next pass starts (set by ``load_state_dict``); None: the beginning."""

    def set_epoch(self, epoch: int) -> None:
        """The pass's epoch; passed on to the dataset (shuffle buffers of HF ``datasets`` and
        webdataset)."""
        self.epoch = epoch
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """This worker's position (plain data)."""
        inner = self.dataset.state_dict() if self.stateful else None  # type: ignore[attr-defined]
        return {
            "consumed": self.counters[-1],
            "dataset": inner,
            "epoch": self.epoch,
            "every": self.every,
            "keep": self.keep,
            "stages": self.stages,
            "counters": list(self.counters),
            "order": self.order,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start the next pass where ``state`` was taken (``consumed`` alone: after that many
        examples of the dataset; ``stages``: what earlier layouts consumed, see above)."""
        self.resume_at = dict(state)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        if self.split:
            self.every, self.keep = self.world * workers, self.rank * workers + worker
        resume, self.resume_at = self.resume_at, None
        if resume is not None and None not in (resume.get("epoch"), self.epoch):
            resume = resume if resume["epoch"] == self.epoch else None  # another epoch's
        resume = resume or {}
        self.stages = [list(map(list, rules)) for rules in resume.get("stages") or []]
        saved = list(resume.get("counters") or [int(resume.get("consumed", 0))])
        skip = 0
        if self.stateful and resume.get("dataset") is not None:
            self.dataset.load_state_dict(resume["dataset"])  # type: ignore[attr-defined]
            self.counters = saved
        else:  # no state of its own: read and discard up to there
            self.counters, skip = [0] * (len(self.stages) + 1), saved[-1]
        it: Iterator[Any] = iter(self.dataset)
        self.order = None
        if self.split and self.counters[0] == 0:  # read from its start: its order is checked
            it = self._ordered(it)
        return self._examples(it, skip)

    def _ordered(self, it: Iterator[Any]) -> Iterator[Any]:
        """``it``, with ``order`` set from its first examples: read ahead, so that the first
        batch already carries it, unless the dataset has a state of its own (reading ahead
        would move it past what was consumed): then as they are read."""
        if self.stateful:
            return self._digest_as_read(it)
        head = list(itertools.islice(it, ORDER_PREFIX))
        self.order = order_digest(head)
        return itertools.chain(head, it)

    def _digest_as_read(self, it: Iterator[Any]) -> Iterator[Any]:
        head: list[Any] = []
        for example in it:
            if len(head) < ORDER_PREFIX:
                head.append(example)
                if len(head) == ORDER_PREFIX:
                    self.order = order_digest(head)
            yield example
        if len(head) < ORDER_PREFIX:
            self.order = order_digest(head)

    def _examples(self, it: Iterator[Any], skip: int) -> Iterator[Any]:
        counters, stages, every, keep = self.counters, self.stages, self.every, self.keep
        for example in it:
            index = counters[0]
            counters[0] += 1
            for level, rules in enumerate(stages):
                if any(index < upto and index % e == k for e, k, upto in rules):
                    break  # consumed by an earlier layout
                index = counters[level + 1]
                counters[level + 1] += 1
            else:
                if index >= skip and index % every == keep:
                    yield example


ORDER_PREFIX = 8
"""Examples at the start of a pass whose digest every rank and worker compares."""


def order_digest(examples: list[Any]) -> str | None:
    """A digest of ``examples`` in their order, from their contents (None when one has no
    content digest, e.g. an object whose ``repr`` holds its address)."""
    digest = xxhash.xxh3_64()
    for example in examples:
        if not _feed_content(example, digest):
            return None
    return digest.hexdigest()


def order_problem(who: str, dataset: str) -> str:
    """Why a stream whose ``who`` (ranks, workers) read it in different orders is refused."""
    return (
        f"the {who} read the stream ({dataset}) in different orders (its first {ORDER_PREFIX} "
        "examples differ). paratrain splits a stream by position (each rank and worker keeps "
        "every (ranks x workers)-th example), so examples would be read twice or never. Give "
        "every rank and worker the same order: shuffle with a generator seeded by a seed and the "
        "epoch (random.Random(seed + epoch), the epoch from set_epoch), not Python's global "
        "random or an unseeded numpy/torch generator (each worker and rank seeds those "
        "differently); or split in the dataset (torch.utils.data.get_worker_info(), "
        "torch.distributed.get_rank()) and pass run.loader(..., shard=False)."
    )


def _feed_content(value: Any, digest: Any) -> bool:
    if isinstance(value, torch.Tensor):
        _feed(value, digest)
    elif isinstance(value, (str, bytes, int, float, bool, type(None))):
        digest.update(f"{type(value).__name__}:{value!r}".encode())
    elif isinstance(value, dict):
        keys = sorted(value, key=repr)
        if not all(isinstance(k, (str, int)) for k in keys):
            return False
        digest.update(repr(keys).encode())
        return all(_feed_content(value[k], digest) for k in keys)
    elif isinstance(value, (list, tuple)):
        digest.update(f"[{len(value)}".encode())
        return all(_feed_content(item, digest) for item in value)
    elif callable(getattr(value, "tobytes", None)):  # numpy arrays, PIL images
        digest.update(type(value).__name__.encode())
        digest.update(str(getattr(value, "shape", getattr(value, "size", ""))).encode())
        digest.update(value.tobytes())
    else:
        return False
    return True


def shard_stream(
    dataset: IterableDataset[Any], *, rank: int, world: int, shard: object
) -> tuple[StreamShard, str]:
    """``dataset`` split for ``rank`` of ``world`` as ``shard`` says; and how, in words."""
    if shard not in SHARD_CHOICES or not isinstance(shard, (str, bool)):
        raise ConfigError(
            f"run.loader(shard={shard!r}): use 'auto' (split as the dataset allows), True "
            "(paratrain keeps every N-th example on each rank and worker) or False (the dataset "
            "yields each rank's and worker's share itself)."
        )
    name = type(dataset).__name__
    if is_hf_iterable(dataset) and shard is not True:
        if getattr(dataset, "_distributed", None) is not None:  # split_dataset_by_node already
            how = f"{name}: already split by datasets.distributed.split_dataset_by_node"
        elif shard == "auto" and world > 1:
            from datasets.distributed import split_dataset_by_node  # type: ignore[import-untyped]

            dataset = split_dataset_by_node(dataset, rank=rank, world_size=world)
            how = f"{name}: split by datasets.distributed.split_dataset_by_node"
        else:
            how = f"{name}: the dataset splits itself"
        return StreamShard(dataset, rank=rank, world=world, split=False), how
    if shard is True or (shard == "auto" and not splits_itself(dataset)):
        how = (
            f"{name}: every rank and worker reads the whole stream and keeps 1 example in "
            f"{world} x (workers per rank); a dataset that splits by files itself is faster "
            "(then pass shard=False)"
        )
        return StreamShard(dataset, rank=rank, world=world, split=True), how
    return StreamShard(dataset, rank=rank, world=world, split=False), (
        f"{name}: the dataset splits itself by rank and worker"
    )


def fingerprint(batch: Any) -> str:
    """A digest of a batch's contents (tensors by their bytes, anything else by ``repr``)."""
    digest = xxhash.xxh3_64()
    _feed(batch, digest)
    return digest.hexdigest()


def _feed(value: Any, digest: Any) -> None:
    if isinstance(value, torch.Tensor):
        digest.update(str((value.dtype, tuple(value.shape))).encode())
        flat = value.detach().cpu().contiguous().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    elif isinstance(value, dict):
        for key in sorted(value, key=repr):
            digest.update(repr(key).encode())
            _feed(value[key], digest)
    elif isinstance(value, (list, tuple)):
        digest.update(f"[{len(value)}".encode())
        for item in value:
            _feed(item, digest)
    else:
        digest.update(repr(value).encode())
