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
repeating the same order. Samplers: :mod:`paratrain.data.samplers`.

A stream (an ``IterableDataset``, split by :mod:`paratrain.data.streaming`) keeps every rank's
position in each checkpoint. The ranks agree after each fetch whether all got a batch (a tiny
all-reduce on a gloo side group), so uneven shares end the pass on every rank at once; ranks or
workers that got the same data or read in different orders are reported. Loaders are built by
:mod:`paratrain.data.build`.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch.autograd import profiler
from torch.autograd.profiler import record_function
from torch.utils.data import DataLoader, DistributedSampler

from paratrain.core import faults
from paratrain.data.samplers import (
    EvenBatchSampler,
    ExactOnceSampler,
    ShardedSampler,
    build_sampler,
)
from paratrain.data.stream_resume import resume_elsewhere, saved_workers, worker_states
from paratrain.data.streaming import StreamShard, fingerprint, order_problem
from paratrain.errors import DataError

__all__ = [
    "DeviceLoader",
    "EvenBatchSampler",
    "ExactOnceSampler",
    "LoaderHooks",
    "ShardedSampler",
    "build_sampler",
    "to_device",
]

T = TypeVar("T")
_PASSES = itertools.count()


def to_device(batch: T, device: torch.device, *, non_blocking: bool = False) -> T:
    """Move every tensor in ``batch`` (tensors, lists, tuples, namedtuples, dicts, dataclasses)."""
    moved: Any
    if isinstance(batch, torch.Tensor):
        moved = batch.to(device, non_blocking=non_blocking)
    elif type(batch) is tuple or type(batch) is list:  # the common case first: (x, y)
        items: Any = batch
        moved = type(items)(to_device(v, device, non_blocking=non_blocking) for v in items)
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

    def current_step(self) -> int:
        """The run's optimizer steps so far (``run.global_step``)."""
        ...

    def on_pass_start(self, loader: DeviceLoader[Any]) -> None:
        """A pass begins (training: the loop starts; evaluation: sync buffers)."""
        ...

    def on_batch(self) -> None:
        """A batch arrived (progress for the hang watchdog)."""
        ...

    def safe_point(self) -> None:
        """A training batch is about to be fetched: a checkpoint here resumes exactly (where a
        preemption signal is turned into a save and an exit)."""
        ...

    def warn(self, message: str) -> None:
        """A warning from the main process."""
        ...

    def note(self, message: str) -> None:
        """A line of information from the main process."""
        ...

    def stream_group(self) -> Any:
        """A gloo process group of all ranks for streams to agree on (None: one process)."""
        ...

    def worker_signals(self) -> tuple[int, ...]:
        """Signals the loader's worker processes ignore: the run's preemption signals, which
        the training process turns into a save (it stops its workers itself)."""
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
    """True while that pass is being iterated, or when it was left before its end (``break``)
    after the run stepped on its batches: the next pass of the epoch, and a resume, continue it
    after the samples consumed.
    A pass left before any step (a peek: ``next(iter(loader))``) is over: the next pass of the
    same epoch starts that epoch's order from the beginning, as torch's DistributedSampler does."""


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
        self._live: Any = None  # the DataLoader iterator of the latest pass
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
        self._read_again = False
        """The restored pass was read before any step (data read once): the resumed script
        reads it again, from its start, without a second draw of the pass's seed (which a pass
        continued after a resume skips too)."""
        self._pass_first_step = 0
        self._pass_steps = 0  # steps taken while the last pass was being iterated
        self._warned_second_pass = False
        self.stream: StreamShard | None = None
        """The dataset as split for this rank (an ``IterableDataset`` was given)."""
        self.group: Any = None
        """Side group on which the ranks' streams agree to end a pass together (None: don't)."""
        self.data_rank = 0
        self._stream_state: Any = None
        self._stream_states: list[Any] = []
        self._firsts: list[str] | None = []  # fingerprints of the first pass's first batches
        self._warned_uneven = False
        self._order_problem: str | None = None

    # -- position ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The loader's position (plain data)."""
        saved = {**dataclasses.asdict(self.position), "running": self.continues}
        if self.position.finished and self.read_before_steps:
            saved["read_once"] = True  # a resume reads that pass again, as the script will
        return saved

    @property
    def read_before_steps(self) -> bool:
        """The last pass ended before any step was taken on its batches: data read once
        (``next(iter(loader))`` for full-batch training), not a pass the loop trains on."""
        return not self.in_progress and self._pass_steps == 0

    @property
    def left_after_steps(self) -> bool:
        """The current epoch's pass (or a later one shuffled as the next epoch) was left before
        its end (``break``) after the run stepped on its batches: ``for x, y in loader: ...; if
        run.global_step == n: break``. The next pass of the same epoch, and a resume, continue
        it after those batches."""
        return (
            not self.in_progress
            and not self.position.finished
            and self.position.epoch >= self.hooks.current_epoch()
            and self._pass_steps > 0
        )

    @property
    def continues(self) -> bool:
        """A resume continues this pass after the samples it consumed (see ``Position``). A
        stream continues only a pass in progress: its workers' positions die with the
        iterator."""
        return self.in_progress or (self.stream is None and self.left_after_steps)

    def stream_state(self) -> dict[str, Any] | None:
        """This rank's stream position (every worker's), or None for a map-style dataset."""
        if self.stream is None or not self.train:
            return None
        return self.loader.state_dict()  # type: ignore[attr-defined, no-any-return]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` at the next pass (a resumed run). A stream's ``state`` may
        carry this rank's ``"stream"`` position (absent: saved at another world size) and every
        saved rank's, ``"streams"`` (to split the stream anew at another layout)."""
        fields = {k: v for k, v in state.items() if k not in ("stream", "streams", "read_once")}
        self.position = Position(**fields)
        self._restored = Position(**fields)
        self._read_again = bool(state.get("read_once"))
        self._stream_state = state.get("stream")
        self._stream_states = list(state.get("streams") or [])

    def _next_pass(self) -> tuple[int, int]:
        """(epoch, samples to skip) of the pass about to start."""
        run_epoch = self.hooks.current_epoch()
        last, restored = self.position, self._restored
        if restored is not None and restored.epoch >= run_epoch:
            if self._read_again:
                return restored.epoch, 0
            if restored.running and not restored.finished:  # saved mid-pass: continue it
                return restored.epoch, restored.samples
            if restored.finished and restored.epoch == run_epoch:
                # Saved while another loader was mid-pass, after this one's pass of the epoch
                # ended: that pass was consumed before the save, so it is empty now.
                return restored.epoch, self._size()
        if last.epoch >= run_epoch and last.finished:
            return last.epoch + 1, 0  # another full pass in one epoch: shuffled as the next
        if last.epoch >= run_epoch and self.stream is None and self.left_after_steps:
            return last.epoch, last.samples  # left with `break` after steps: go on after them
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

    def __getattr__(self, name: str) -> Any:
        # What else a DataLoader has (batch_size: the per-rank batch, drop_last, num_workers,
        # pin_memory, collate_fn, ...) reads as on the DataLoader inside; only names not above.
        if name.startswith("__") or name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def shutdown_workers(self) -> None:
        """Stop this loader's worker processes (persistent ones, or those of a pass left
        unfinished), as the run closes. Left to the garbage collector, a worker iterator of a
        closed run may be collected inside the worker processes of a later loader (they are
        forked with a copy of it), where it prints "can only test a child process"."""
        for iterator in (getattr(self.loader, "_iterator", None), self._live):
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
        if getattr(self.loader, "_iterator", None) is not None:
            self.loader._iterator = None
        self._live = None

    def _end_unfinished_pass(self) -> None:
        """Stop the workers of an earlier pass left unfinished (every rank ends a pass at the
        first rank's end; a ``break``) before new ones start. The DataLoader would drop that
        iterator only after forking the new workers: for a moment twice the processes, and
        children forked with a copy of a live worker iterator. Persistent workers are kept (the
        next pass reuses them), and so is the iterator a state_dict() call made for the pass
        to come."""
        if self.loader.persistent_workers or getattr(
            self.loader, "_initial_iter_for_state_dict", False
        ):
            return
        kept = getattr(self.loader, "_iterator", None)  # a StatefulDataLoader keeps its last
        for old in {id(it): it for it in (kept, self._live) if it is not None}.values():
            shutdown = getattr(old, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
        if kept is not None:
            self.loader._iterator = None
        self._live = None

    # -- iteration -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        # First: a restarted run resumes here (loop_action), so the pass chosen below starts
        # where the checkpoint stopped, even for `it = iter(loader)` before the loop's first step.
        self.hooks.on_pass_start(self)
        if not self.train:
            return self._iterate(self.hooks.current_epoch(), 0)
        going_on = self.stream is None and self.left_after_steps
        epoch, start = self._next_pass()
        restored, self._restored = self._restored, None
        again, self._read_again = self._read_again and restored is not None, False
        if restored is not None and restored.running and not restored.finished:
            again = True  # saved inside this pass (even before its first batch): drawn before
        if restored is None and not going_on and self.position.epoch >= self.hooks.current_epoch():
            self._warn_second_pass(epoch, abandoned=not self.position.finished)
        if self.stream is not None:
            return self._stream_pass(epoch, restored)
        return self._iterate(epoch, start, again=again)

    def _stream_pass(self, epoch: int, restored: Position | None) -> Iterator[Any]:
        """A pass over the stream: from its start, or from the saved position of a resume."""
        assert self.stream is not None
        self.stream.set_epoch(epoch)
        state, self._stream_state = self._stream_state, None
        every_rank, self._stream_states = self._stream_states, []
        if restored is None or restored.epoch != epoch:
            return self._iterate(epoch, 0)
        if restored.finished:  # consumed before the save: an empty pass
            self.position = Position(epoch=epoch, samples=restored.samples, finished=True)
            return iter(())
        if not restored.running:  # left early before the save: the epoch starts over
            return self._iterate(epoch, 0)
        if state is not None and saved_workers(state) == self.loader.num_workers:
            self.loader.load_state_dict(state)  # type: ignore[attr-defined]
            if not self.stream.stateful and restored.samples:
                self.hooks.warn(
                    f"{self.name}: {type(self.stream.dataset).__name__}: "
                    f"{self.stream.replayed_because}, so resuming reads and discards the "
                    "examples each worker had consumed before the save (exact, but slow for a "
                    "long stream)."
                )
        elif restored.samples:
            self._split_anew(epoch, restored.samples, every_rank)
        return self._iterate(epoch, restored.samples)

    def _split_anew(self, epoch: int, samples: int, every_rank: list[Any]) -> None:
        """Resumed at another layout (world size, workers): the rest of the pass is split over
        this one (:func:`paratrain.data.stream_resume.resume_elsewhere`)."""
        assert self.stream is not None
        state, note = resume_elsewhere(
            self.stream, every_rank, epoch=epoch, samples=samples, ranks=self.world_size,
            workers=self.loader.num_workers,
        )  # fmt: skip
        self.stream.load_state_dict(state)
        self.hooks.warn(f"{self.name}: {note}")

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
        self.hooks.note(
            f"paratrain: {self.name} started a new pass while epoch {now} already had one: it is "
            f"shuffled as epoch {epoch}, so the order does not repeat, and a resume continues it "
            "exactly. (A `while` loop that starts a new pass when one ends needs nothing more; "
            "in a `for epoch in range(N)` loop, use `for epoch in run.epochs(N):` so that "
            "run.epoch and the checkpoints name the epoch.)"
        )

    def _iterate(self, epoch: int, start: int, *, again: bool = False) -> Iterator[Any]:
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
            if (start == 0 and not again) or not self.train:
                # A DataLoader without a generator draws its base seed from the global one at
                # every iter(), even with num_workers=0. Draw it too, so a one-process port of
                # a DataLoader script keeps every later random number (dropout masks). A pass
                # continued after a resume (or read again) made this draw before the save: not
                # again.
                torch.empty((), dtype=torch.int64).random_()
        self.pass_id = next(_PASSES)
        self.pass_length = _length(self.loader)
        if self.train:
            self.position = Position(epoch=epoch, samples=start)
            self._pass_first_step, self._pass_steps = self.hooks.current_step(), 0
        batch_size = self.loader.batch_size or 1
        non_blocking = bool(self.loader.pin_memory) and self.device.type == "cuda"
        move = self.device.type != "cpu"  # a DataLoader's batches are on the CPU already
        train, hooks = self.train, self.hooks
        self.in_progress = True
        batches = 0
        try:
            self._end_unfinished_pass()
            iterator = self._live = iter(self.loader)
            if self.stream is not None:  # the workers have their copies: a resume is for one pass
                self.stream.resume_at = None
            while True:
                if train:
                    hooks.safe_point()
                started = time.perf_counter()
                batch = next(iterator, _END)
                if self._firsts is not None and self.stream is not None and self.train:
                    self._check_shares(batch)
                if self.group is not None and self.train:
                    if not self._all_have_batch(batch is not _END):
                        break
                elif self._order_problem is not None:
                    raise DataError(self._order_problem)
                elif batch is _END:
                    break
                self.data_wait_s += time.perf_counter() - started
                self.samples += _batch_len(batch)
                if train:
                    self.position.samples += batch_size * self.world_size
                hooks.on_batch()
                if not train:
                    faults.emit("eval_batch")
                if move and profiler._is_profiler_enabled:  # record_function costs 6 µs, unseen
                    with record_function("paratrain: batch to device"):
                        batch = to_device(batch, self.device, non_blocking=non_blocking)
                elif move:
                    batch = to_device(batch, self.device, non_blocking=non_blocking)
                batches += 1
                yield batch
            if self.train:
                self.position.finished = True
        finally:
            self.in_progress = False
            self._live = None
            if self.train:  # `next(iter(loader))` ends its pass before the step: none counted
                self._pass_steps = self.hooks.current_step() - self._pass_first_step
                if self.pass_length is not None and batches >= self.pass_length:
                    # Left with `break` after its last batch: the pass has ended all the same
                    # (the next one is a whole pass, and len() says so).
                    self.position.finished = True
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
            own = (self.data_rank, digest, self._stream_orders()[0])
            dist.all_gather_object(shares, own, group=self.group)
            self._check_orders([order for _, _, order in shares], "ranks")
            ranks: dict[str, set[int]] = {}
            for data_rank, first, _ in shares:
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
        self._check_orders(self._stream_orders(), f"{workers} DataLoader workers")
        if len(set(mine)) < len(mine):
            dataset = type(self.stream.dataset).__name__ if self.stream else "the dataset"
            self.hooks.warn(
                f"{self.name}: {workers} DataLoader workers gave identical first batches, so "
                f"{dataset} does not split itself by worker: every example is read once per "
                "worker. Split in the dataset with torch.utils.data.get_worker_info() "
                "(webdataset: workersplitter=wds.split_by_worker), or pass "
                "run.loader(..., shard=True)."
            )

    def _stream_orders(self) -> list[str | None]:
        """Each worker's digest of the stream's first examples (None: not known)."""
        assert self.stream is not None
        if self.loader.num_workers == 0:
            return [self.stream.order]
        shards = worker_states(self.loader.state_dict())  # type: ignore[attr-defined]
        return [s.get("order") for s in shards] if shards else [None]

    def _check_orders(self, orders: list[str | None], who: str) -> None:
        """paratrain's split keeps examples by position: every reader must see one order."""
        assert self.stream is not None
        if not self.stream.split or len(set(orders) - {None}) < 2:
            return
        dataset = type(self.stream.dataset).__name__
        self._order_problem = f"{self.name}: {order_problem(who, dataset)}"

    def _all_have_batch(self, has: bool) -> bool:
        """All ranks fetched a batch (else every rank ends the pass here, together). A stream
        order problem found by any rank stops every rank here, together."""
        problem = self._order_problem
        flags = torch.tensor([int(has), -int(has), -int(problem is not None)])
        dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=self.group)
        if int(flags[2]) == -1:
            raise DataError(problem or f"{self.name}: {_ANOTHER_RANKS_ORDER}")
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
_ANOTHER_RANKS_ORDER = (
    "another rank's DataLoader workers read the stream in different orders (its message says "
    "more): paratrain's split (shard=True) needs one order in every rank and worker."
)


def _batch_len(batch: Any) -> int:
    while isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    if isinstance(batch, torch.Tensor):  # the usual case, before the slower Mapping check
        return len(batch) if batch.dim() else 0
    if isinstance(batch, Mapping) and batch:
        return _batch_len(next(iter(batch.values())))
    return 0


def _length(loader: DataLoader[Any]) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None
