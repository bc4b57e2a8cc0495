"""What a finished run leaves to compare: each rank's final state, the last checkpoint, and the
files the user named.

    state = run_state(result, world_size=2, compare_files="best.pt")
    state["rank 0"]["models"]["model"]["0.weight"]        # from PARATRAIN_FINAL_STATE
    state["last checkpoint"]["step"], state["files"]["best.pt"]

The last checkpoint is read with the checkpoint store's own code (the newest valid one): its
manifest step and epoch, its loop counters and extras. A named file is compared by its tensors
when ``torch.load(weights_only=True)`` or safetensors reads it, else by its bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from paratrain.checkpoint.restore import load_trainer
from paratrain.checkpoint.store import CheckpointStore
from paratrain.commands.verify.runs import RunFiles, RunResult, reported_dirs
from paratrain.errors import CheckpointError

MISSING = "<missing>"
"""Stands for a file the run did not write (so the comparison names it)."""


def run_state(result: RunResult, *, world_size: int, compare_files: str | None) -> dict[str, Any]:
    """The run's comparable state: ``rank <r>`` sections, ``last checkpoint``, ``files``."""
    state: dict[str, Any] = {}
    for rank in range(world_size):
        final = final_state(result.files, rank)
        state[f"rank {rank}"] = (
            MISSING if final is None else {k: v for k, v in final.items() if k != "meta"}
        )
    _, ckpt_dir = reported_dirs(result.report)
    state["last checkpoint"] = last_checkpoint(Path(ckpt_dir)) if ckpt_dir else None
    if compare_files:
        state["files"] = named_files(result.files, compare_files)
    return state


def final_state(files: RunFiles, rank: int) -> dict[str, Any] | None:
    """Rank ``rank``'s final state (None: not written or unreadable)."""
    path = files.final_state / f"rank{rank}.pt"
    try:
        loaded = torch.load(path, weights_only=True, map_location="cpu")
    except Exception:
        return None
    return loaded if isinstance(loaded, dict) else None


def last_checkpoint(directory: Path) -> dict[str, Any] | None:
    """Step, epoch, loop and extras of the newest valid checkpoint in ``directory`` (None: none)."""
    store = CheckpointStore(directory, keep_last=None, check_timeout_s=60.0, warn=lambda _: None)
    newest = store.latest_valid()
    if newest is None:
        return None
    folder, manifest = newest
    try:
        trainer = load_trainer(folder)
    except CheckpointError as err:
        return {"step": manifest.step, "epoch": manifest.epoch, "trainer": f"unreadable: {err}"}
    return {
        "step": manifest.step,
        "epoch": manifest.epoch,
        "loop": trainer.get("loop"),
        "extras": trainer.get("extras"),
    }


def named_files(files: RunFiles, pattern: str) -> dict[str, Any]:
    """Every file matching ``pattern`` under the run dir (verify-resume's own files left out),
    as tensors where they load as such, else as bytes."""
    found: dict[str, Any] = {}
    root = files.run_dir
    for path in sorted(root.glob(pattern)):
        if not path.is_file() or files.own in path.parents:
            continue
        found[str(path.relative_to(root))] = file_content(path)
    return found


def file_content(path: Path) -> Any:
    """Tensors of a torch or safetensors file, else its bytes."""
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file

            return load_file(str(path))
        except Exception:
            return path.read_bytes()
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception:
        return path.read_bytes()
