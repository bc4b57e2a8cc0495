"""Understand, check, convert and compare checkpoints; every function returns data.

    inspect("runs/exp/checkpoints")          # the run's checkpoints and which are valid
    verify("model.pt")                       # (True, ["ok: ..."]) or (False, [problems])
    convert("old_dp.pth", "model.safetensors", to="safetensors")
    diff("a.pt", "b.safetensors")

``paratrain ckpt`` renders these; see :mod:`paratrain.checkpoint.command`.
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from paratrain.checkpoint.command import FORMATS
from paratrain.checkpoint.files import atomic_replace, atomic_torch_save, write_safetensors
from paratrain.checkpoint.loading import WRAPPER_PARTS, read_state_dict, strip_wrappers
from paratrain.checkpoint.manifest import MANIFEST, Manifest
from paratrain.checkpoint.store import PREFIX, load_trainer
from paratrain.errors import CheckpointError


def _summary(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    prefixes = Counter(p for k in state for p in k.split(".") if p in WRAPPER_PARTS)
    return {
        "tensors": len(state),
        "parameters": sum(t.numel() for t in state.values()),
        "bytes": sum(t.numel() * t.element_size() for t in state.values()),
        "dtypes": dict(Counter(str(t.dtype).replace("torch.", "") for t in state.values())),
        "wrapper_prefixes": {f"{p}.": n for p, n in prefixes.items()},
        "first_keys": sorted(state)[:5],
    }


def _checkpoints_in(path: Path) -> list[Path]:
    return sorted((p for p in path.glob(f"{PREFIX}*") if p.is_dir()), reverse=True)


def inspect(path: str | Path, *, trust: bool = False) -> dict[str, Any]:
    """Format, tensors, prefixes, and for paratrain checkpoints the saved run and resume state."""
    path = Path(path)
    if path.is_dir() and not (path / MANIFEST).exists() and _checkpoints_in(path):
        entries = []
        for folder in _checkpoints_in(path):
            ok, problems = verify(folder)
            entries.append({"path": str(folder), "valid": ok, "problems": [] if ok else problems})
        return {
            "path": str(path),
            "format": "paratrain checkpoint directory",
            "checkpoints": entries,
        }
    state, fmt = read_state_dict(path, trust=trust)
    report: dict[str, Any] = {"path": str(path), "format": fmt, **_summary(state)}
    if (path / MANIFEST).is_file():
        manifest = Manifest.read(path)
        trainer = load_trainer(path)
        report["saved_by"] = {
            "strategy": manifest.strategy,
            "world_size": manifest.world_size,
            "layout": manifest.layout,
            "global_batch": manifest.global_batch,
            "paratrain": manifest.paratrain_version,
            "torch": manifest.torch_version,
        }
        report["resume_state"] = {
            "epoch": manifest.epoch,
            "step": manifest.step,
            "samples_in_epoch": manifest.samples_in_epoch,
            "optimizer": (path / "optimizer.safetensors").is_file() or (path / "dcp").is_dir(),
            "scheduler": trainer.get("scheduler") is not None,
            "grad_scaler": trainer.get("scaler") is not None,
            "rng_ranks": len(trainer.get("rng", [])),
            "extras": sorted(trainer.get("extras", {})),
        }
    return report


def verify(path: str | Path) -> tuple[bool, list[str]]:
    """Check checksums (paratrain checkpoints) or read everything (other formats)."""
    path = Path(path)
    if path.is_dir() and not (path / MANIFEST).exists() and _checkpoints_in(path):
        lines, any_ok = [], False
        for folder in _checkpoints_in(path):
            ok, problems = verify(folder)
            any_ok |= ok
            lines.append(
                f"{'ok' if ok else 'BAD'}: {folder.name}"
                + ("" if ok else f" ({'; '.join(problems)})")
            )
        return any_ok, lines
    if (path / MANIFEST).is_file():
        try:
            problems = Manifest.read(path).verify(path)
        except CheckpointError as err:
            return False, [str(err)]
        if problems:
            return False, problems
        return True, [f"ok: {path} ({len(Manifest.read(path).files)} files match their CRC32)"]
    try:
        state, fmt = read_state_dict(path)
    except CheckpointError as err:
        return False, [str(err)]
    return True, [f"ok: {path} ({fmt}, {len(state)} tensors read in full)"]


def convert(src: str | Path, dst: str | Path, *, to: str, trust: bool = False) -> dict[str, Any]:
    """Rewrite ``src`` as ``to`` at ``dst``, keys without wrapper prefixes; never overwrites."""
    if to not in FORMATS:
        raise CheckpointError(f"Unknown target format {to!r}. Available: {', '.join(FORMATS)}.")
    dst = Path(dst)
    if dst.exists():
        raise CheckpointError(
            f"{dst} already exists. Choose a new output path (nothing was written)."
        )
    state, fmt = read_state_dict(src, trust=trust)
    clean = {strip_wrappers(k): v.contiguous() for k, v in state.items()}
    if len(clean) != len(state):
        raise CheckpointError(
            f"{src}: stripping wrapper prefixes would merge keys; convert "
            "it with the prefixes kept by loading it into its model first."
        )
    if to == "pt":
        atomic_torch_save(clean, dst)
    elif to == "safetensors":
        atomic_replace(dst, lambda tmp: write_safetensors(tmp, clean))
    else:
        from torch.distributed.checkpoint.filesystem import FileSystemWriter
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        with warnings.catch_warnings():  # "assuming ... a single process": that is the intent
            warnings.simplefilter("ignore", UserWarning)
            writer = FileSystemWriter(str(dst), overwrite=False)
            dcp_save(clean, storage_writer=writer, no_dist=True)
    return {
        "from": fmt,
        "to": to,
        "tensors": len(clean),
        "path": str(dst),
        "stripped": sum(k != strip_wrappers(k) for k in state),
    }


def diff(a: str | Path, b: str | Path, *, trust: bool = False) -> dict[str, Any]:
    """Keys only in one side, shape/dtype changes, and the largest value differences."""
    sa, _ = read_state_dict(a, trust=trust)
    sb, _ = read_state_dict(b, trust=trust)
    sa = {strip_wrappers(k): v for k, v in sa.items()}
    sb = {strip_wrappers(k): v for k, v in sb.items()}
    common = sorted(set(sa) & set(sb))
    changed_shape = [
        f"{k}: {tuple(sa[k].shape)}/{sa[k].dtype} vs {tuple(sb[k].shape)}/{sb[k].dtype}"
        for k in common
        if sa[k].shape != sb[k].shape or sa[k].dtype != sb[k].dtype
    ]
    deltas = sorted(
        (
            (float((sa[k].double() - sb[k].double()).abs().max()) if sa[k].numel() else 0.0, k)
            for k in common
            if sa[k].shape == sb[k].shape and sa[k].dtype == sb[k].dtype
        ),
        reverse=True,
    )
    only_a, only_b = sorted(set(sa) - set(sb)), sorted(set(sb) - set(sa))
    return {
        "identical": not (only_a or only_b or changed_shape or any(d for d, _ in deltas)),
        "only_in_a": only_a,
        "only_in_b": only_b,
        "shape_or_dtype": changed_shape,
        "max_abs_diff": {k: d for d, k in deltas[:10] if d > 0},
        "equal_tensors": sum(1 for d, _ in deltas if d == 0),
    }
