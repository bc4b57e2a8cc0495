"""Where a resumed pass over a stream starts when the checkpoint was written by another layout
(another world size, or another number of DataLoader workers per rank).

    workers = saved_workers(state)          # workers per rank in a rank's saved loader state
    shards = worker_states(state)           # every worker's StreamShard position in it
    stages = consumed_stages(every_rank)    # what all of them consumed, or None
    state, note = resume_elsewhere(shard, every_rank, epoch=3, samples=96, ranks=2, workers=4)
    shard.load_state_dict(state)            # the main process's copy: its workers get it

At the saved layout torchdata's ``StatefulDataLoader`` restores every worker exactly. At another
one its state cannot be loaded (torchdata asserts on the worker count), so the stream is split
anew: a stream split by paratrain (``shard=True``) records each worker's split and position,
from which :func:`consumed_stages` gives the examples consumed before the save; every new worker
reads the stream, skips those and keeps its share of the rest. Exact for the default
``snapshot_every_n_steps=1`` (a rarer snapshot is older than the save: the examples read after it
are seen again). A stream that splits itself cannot be mapped: :func:`approximate_skip` has every
worker skip about its share of the examples consumed.
"""

from __future__ import annotations

from typing import Any

from paratrain.data.streaming import StreamShard

__all__ = [
    "approximate_skip",
    "consumed_stages",
    "resume_elsewhere",
    "saved_workers",
    "worker_states",
]

_SPLIT_KEYS = ("every", "keep", "stages", "counters")


def saved_workers(state: Any) -> int | None:
    """DataLoader workers per rank of a ``StatefulDataLoader`` state (None: not one)."""
    if not isinstance(state, dict):
        return None
    if "_num_yielded" in state:
        return 0
    main = state.get("_snapshot", {}).get("_main_snapshot", {})
    workers = main.get("_num_workers") if isinstance(main, dict) else None
    return workers if isinstance(workers, int) else None


def worker_states(state: Any) -> list[dict[str, Any]] | None:
    """The StreamShard state of every worker in a rank's loader state (None: unknown format)."""
    workers = saved_workers(state)
    if workers is None:
        return None
    if workers == 0:
        shards = [state.get("dataset_state")]
    else:
        snapshots = state["_snapshot"].get("_worker_snapshots", {})
        shards = [(snapshots.get(f"worker_{w}") or {}).get("dataset_state") for w in range(workers)]
    return shards if all(isinstance(s, dict) for s in shards) else None


def consumed_stages(every_rank: list[Any]) -> list[list[list[int]]] | None:
    """The stages (see :class:`paratrain.data.streaming.StreamShard`) of what the workers of every
    rank consumed before the save; None when a state lacks the split (a stream that splits
    itself, a checkpoint of an older paratrain) or a rank's state is missing."""
    shards: list[dict[str, Any]] = []
    for state in every_rank:
        workers = worker_states(state)
        if workers is None:
            return None
        shards += workers
    if not shards or not all(all(k in s for k in _SPLIT_KEYS) for s in shards):
        return None
    earlier = shards[0]["stages"]
    if any(s["stages"] != earlier for s in shards):
        return None
    rules = sorted({(int(s["every"]), int(s["keep"]), int(s["counters"][-1])) for s in shards})
    return [[list(rule) for rule in stage] for stage in earlier] + [[list(r) for r in rules]]


def approximate_skip(samples: int, *, split: bool, shares: int) -> dict[str, Any]:
    """A StreamShard resume state that skips about each worker's share of ``samples`` examples
    consumed in all: the first ``samples`` of a stream paratrain splits (``split``), else
    ``samples // shares`` of each worker's own stream (``shares``: ranks x workers)."""
    if split:
        return {"stages": [[[1, 0, samples]]], "consumed": 0, "dataset": None}
    return {"consumed": samples // max(shares, 1), "dataset": None}


def resume_elsewhere(
    shard: StreamShard,
    every_rank: list[Any],
    *,
    epoch: int,
    samples: int,
    ranks: int,
    workers: int,
) -> tuple[dict[str, Any], str]:
    """The resume state for ``shard`` (this rank's, at ``ranks`` x ``workers``) of a pass of
    ``epoch`` saved by another layout whose ranks' loader states are ``every_rank`` and which
    consumed ``samples`` examples in all; and a note for the user naming both layouts."""
    before = {saved_workers(s) for s in every_rank} - {None}
    was = f"{len(every_rank)} rank(s) x {before.pop()}" if len(before) == 1 else "another"
    change = (
        f"saved by {was} DataLoader worker(s) per rank, resumed by {ranks} x {workers} "
        "(another layout)"
    )
    stages = consumed_stages(every_rank) if shard.split else None
    if stages is not None:
        note = (
            f"{change}: the rest of epoch {epoch} is split anew over this layout; every worker "
            "reads the stream from its start and skips the examples consumed before the save, "
            "so none is seen twice."
        )
        return {"stages": stages, "dataset": None, "epoch": epoch}, note
    skip = approximate_skip(samples, split=shard.split, shares=ranks * max(workers, 1))
    why = (
        "the checkpoint does not record how the stream was split"
        if shard.split
        else f"{type(shard.dataset).__name__} splits itself"
    )
    note = (
        f"{change}, and {why}, so the stream's position cannot be mapped exactly: in epoch "
        f"{epoch} only, every worker skips about its share of the {samples} examples consumed. "
        "Resume with the saved world size and num_workers for an exact continuation."
    )
    return {**skip, "epoch": epoch}, note
