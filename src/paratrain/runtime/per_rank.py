"""Registry objects per rank: gathered at a save, each rank's state restored to the same rank.

    trainer.update(objects_of_every_rank(tracked, extras))   # collective, inside a save
    restore = per_rank_restorer(tracked, "hidden", states, rank)   # rank None: another layout
    restore(obj)

A state equal on every rank (an EMA under DDP) is kept once under ``"objects"`` and resumes at
any layout; states that differ go under ``"objects_per_rank"`` and resume at the layout that
saved them, or, for an object declared ``replicated``, with rank 0's state everywhere.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import xxhash
from torch.utils._pytree import tree_map_only

from paratrain.checkpoint.plain_data import plain
from paratrain.checkpoint.store import distributed
from paratrain.errors import CheckpointError
from paratrain.runtime.registry import Registry


def objects_of_every_rank(tracked: Registry, extras: dict[str, Any]) -> dict[str, Any]:
    """``{"objects": {name: state}, "objects_per_rank": {name: [state of rank 0, 1, ...]},
    "extras_per_rank": [extras of rank 0, 1, ...]}``.

    A state equal on every rank (compared by digest; one tiny all-gather) is kept once under
    ``objects``; states that differ are gathered to rank 0, which writes them. The extras of
    ``run.save(extras=)`` are handled alike: ``extras_per_rank`` is there only when they differ
    (a rank's own best loss), and each rank then resumes with its own. Collective when objects
    are tracked or extras given in a multi-rank run.
    """
    states = {k: plain(v.state_dict(), f"run.track({k!r})") for k, v in tracked.objects.items()}
    shared = {k: v for k, v in states.items() if k in tracked.replicated}
    own = {k: v for k, v in states.items() if k not in tracked.replicated}
    if extras:
        own[_EXTRAS] = extras
    if not own or not distributed():
        return {"objects": states, "objects_per_rank": {}}
    digests = {k: _digest(v) for k, v in own.items()}
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, digests)
    differ = sorted(k for k in own if len({d[k] for d in every}) > 1)
    shared.update({k: v for k, v in own.items() if k not in differ and k != _EXTRAS})
    if not differ:
        return {"objects": shared, "objects_per_rank": {}}
    mine = _on_cpu({k: own[k] for k in differ})
    gathered: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    per_rank = {k: [g[k] for g in gathered] for k in differ} if gathered is not None else {}
    saved: dict[str, Any] = {"objects": shared}
    if _EXTRAS in per_rank:
        saved["extras_per_rank"] = per_rank.pop(_EXTRAS)
    saved["objects_per_rank"] = per_rank
    return saved


_EXTRAS = "\x1fextras"  # not a name run.track accepts


def extras_of_rank(trainer: dict[str, Any], rank: int | None, warn: Callable[[str], None]) -> Any:
    """This rank's extras from a checkpoint's trainer state (``rank`` None: saved at another
    layout, where rank 0's serve every rank, and a warning says so when they differed)."""
    every: list[Any] = trainer.get("extras_per_rank") or []
    if not every:
        return dict(trainer.get("extras", {}))
    if rank is not None and rank < len(every):
        return dict(every[rank])
    warn(
        f"the extras of run.save(extras=) differed across the {len(every)} ranks that saved "
        "them, and this run has another layout: every rank resumes with rank 0's. Save "
        "per-rank values in a run.track()ed object, or make them agree (run.reduce) before "
        "saving, to resume them at any world size."
    )
    return dict(every[0])


def _digest(state: Any) -> str:
    buffer = io.BytesIO()
    torch.save(_on_cpu(state), buffer)
    return xxhash.xxh3_128_hexdigest(buffer.getvalue())


def per_rank_restorer(
    tracked: Registry, name: str, states: list[Any], rank: int | None
) -> Callable[[Any], None]:
    """Apply this rank's saved state of ``name`` (``rank`` None: saved at another layout)."""

    def restore(obj: Any) -> None:
        if rank is not None and rank < len(states):
            obj.load_state_dict(states[rank])
        elif name in tracked.replicated:
            obj.load_state_dict(states[0])
        else:
            raise CheckpointError(
                f"run.track({name!r}) holds a different state on each of the {len(states)} "
                "ranks that saved it, and this run has another layout, so no state belongs to "
                f"this rank. Resume at world size {len(states)}; or, if one state serves every "
                f"rank, declare it with run.track(obj, {name!r}, replicated=True) (rank 0's "
                "state is then restored everywhere); or track it under a new name to start it "
                "afresh."
            )

    return restore


def _on_cpu(tree: Any) -> Any:
    return tree_map_only(torch.Tensor, lambda t: t.detach().cpu(), tree)
