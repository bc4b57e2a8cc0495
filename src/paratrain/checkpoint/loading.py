"""Read weights from any common checkpoint format, without executing pickled code.

    report = paratrain.load_weights(model, "old_run/model_dp.pth")      # prefixes stripped
    state, fmt = read_state_dict("ckpt_dir/step-00000300")               # without a model

Formats: plain state dicts (.pt/.pth/.bin/.ckpt), nested ones (``{"state_dict": ...}``,
``{"model": ...}``, Lightning), ``module.``/``_orig_mod.``/FSDP prefixes at any depth, safetensors,
Accelerate ``save_state`` folders, DCP folders and paratrain checkpoints. ``torch.load`` always runs
with ``weights_only=True``; a pickled ``nn.Module`` needs ``trust=True``.
"""

from __future__ import annotations

import pickle
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from paratrain.checkpoint.dcp_io import SafePlanner, SafeReader, read_metadata
from paratrain.checkpoint.manifest import MANIFEST, Manifest
from paratrain.errors import CheckpointError

WRAPPER_PARTS = ("module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
NESTED_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "weights")
ACCELERATE_FILES = ("model.safetensors", "pytorch_model.bin", "model.bin", "pytorch_model.pt")
MapLocation = str | torch.device | dict[str, str] | None


@dataclass(kw_only=True)
class LoadReport:
    """What :func:`load_weights` found and did."""

    format: str
    """Detected format, e.g. ``torch.save (zip)``, ``safetensors``, ``dcp``."""
    keys: int
    """Tensors loaded."""
    stripped: list[str] = field(default_factory=list)
    """Prefixes that were removed from the keys (``module.``, ``model.``, ...)."""


def load_weights(
    model: nn.Module, path: str | Path, *, map_location: MapLocation = "cpu", trust: bool = False
) -> LoadReport:
    """Load weights from ``path`` into ``model`` strictly; explain any mismatch."""
    state, fmt = read_state_dict(path, map_location=map_location, trust=trust)
    target = model.module if isinstance(model, (nn.DataParallel,)) else model
    expected = target.state_dict()
    state, stripped = match_keys(state, set(expected))
    problems = mismatch_report(state, expected)
    if problems:
        raise CheckpointError(f"{path} does not match {type(target).__name__}: {problems}")
    target.load_state_dict(state, strict=True)
    return LoadReport(format=fmt, keys=len(state), stripped=stripped)


def read_state_dict(
    path: str | Path, *, map_location: MapLocation = "cpu", trust: bool = False
) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors stored at ``path`` (file or folder) and the name of the format."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist. Check the path.")
    if path.is_dir():
        return _read_dir(path, map_location, trust)
    return _read_file(path, map_location, trust)


def _read_dir(path: Path, map_location: MapLocation, trust: bool) -> tuple[dict[str, Any], str]:
    if (path / MANIFEST).is_file():
        problems = Manifest.read(path).verify(path)
        if problems:
            raise CheckpointError(f"{path} is damaged: {'; '.join(problems)}.")
        if (path / "model.safetensors").is_file():
            return _move(load_file(str(path / "model.safetensors")), map_location), "paratrain"
        state = _read_dcp(path / "dcp", prefix="model.")
        return _move(state, map_location), "paratrain (sharded)"
    if (path / ".metadata").is_file():
        return _move(_read_dcp(path, prefix=""), map_location), "dcp"
    for name in ACCELERATE_FILES:
        if (path / name).is_file():
            state, _ = _read_file(path / name, map_location, trust)
            return state, f"accelerate folder ({name})"
    listing = ", ".join(sorted(p.name for p in path.iterdir())[:8]) or "nothing"
    raise CheckpointError(
        f"{path} is a directory but not a checkpoint folder paratrain knows (it holds: "
        f"{listing}). Point at the weights file itself, or at a paratrain, DCP or Accelerate "
        "checkpoint folder."
    )


def _read_dcp(folder: Path, *, prefix: str) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    meta = read_metadata(folder)
    state = {
        fqn: torch.empty(m.size, dtype=m.properties.dtype)
        for fqn, m in meta.state_dict_metadata.items()
        if isinstance(m, TensorStorageMetadata) and fqn.startswith(prefix)
    }
    try:
        with warnings.catch_warnings():  # "assuming ... a single process": that is the intent
            warnings.simplefilter("ignore", UserWarning)
            reader = SafeReader(str(folder))
            dcp_load(state, storage_reader=reader, planner=SafePlanner(), no_dist=True)
    except Exception as err:
        raise CheckpointError(f"{folder} could not be read as a DCP checkpoint: {err}") from None
    return {k[len(prefix) :]: v for k, v in state.items()}


def _read_file(path: Path, map_location: MapLocation, trust: bool) -> tuple[dict[str, Any], str]:
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes): the save was interrupted or failed.")
    with path.open("rb") as f:
        head = f.read(16)
    if len(head) >= 9 and head[8:9] == b"{":
        try:
            return _move(load_file(str(path)), map_location), "safetensors"
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{path} is a damaged safetensors file ({err}).") from None
    fmt = "torch.save (legacy pickle)"
    if zipfile.is_zipfile(path):
        fmt = "torch.save (zip)"
        _check_zip(path)
    elif head[:2] == b"PK":
        raise CheckpointError(
            f"{path} is truncated: its zip directory is missing ({size} bytes). Re-save it or "
            "use an earlier copy."
        )
    return _extract(_torch_load(path, map_location, trust)), fmt


def _check_zip(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise CheckpointError(f"{path} is truncated or corrupt ({err}).") from None
    if bad is not None:
        raise CheckpointError(
            f"{path} is corrupt: the record {bad} fails its CRC check (a flipped or damaged "
            "byte). Use another copy of the file."
        )


def _torch_load(path: Path, map_location: MapLocation, trust: bool) -> Any:
    try:
        return torch.load(path, map_location=map_location, weights_only=not trust)
    except pickle.UnpicklingError as err:
        if "weights_only" not in str(err) and "Unsupported global" not in str(err):
            raise CheckpointError(f"{path} is truncated or corrupt ({err}).") from None
        raise CheckpointError(
            f"{path} contains pickled Python objects, not just tensors (e.g. a whole model "
            "saved with torch.save(model)); loading it would run code from the file. "
            "paratrain refused. If you trust its origin, pass trust=True (CLI: --trust); "
            "better, re-save it as model.state_dict()."
        ) from None
    except (RuntimeError, EOFError, ValueError) as err:
        raise CheckpointError(f"{path} is truncated or corrupt ({err}).") from None


def _extract(obj: Any) -> dict[str, torch.Tensor]:
    if isinstance(obj, nn.Module):
        return dict(obj.state_dict())
    if isinstance(obj, dict):
        tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if tensors and len(tensors) == len(obj):
            return tensors
        for key in NESTED_KEYS:
            if key in obj and isinstance(obj[key], (dict, nn.Module)):
                return _extract(obj[key])
        if tensors:
            return tensors
    raise CheckpointError(
        f"Found no weights in the file (top level: {type(obj).__name__}"
        + (f" with keys {sorted(obj)[:8]}" if isinstance(obj, dict) else "")
        + "). Save model.state_dict(), or a dict holding it under 'state_dict' or 'model'."
    )


def _move(state: dict[str, torch.Tensor], map_location: MapLocation) -> dict[str, torch.Tensor]:
    if map_location is None or map_location == "cpu":
        return state
    if isinstance(map_location, dict):
        return {k: v.to(map_location.get(str(v.device), str(v.device))) for k, v in state.items()}
    return {k: v.to(map_location) for k, v in state.items()}


def strip_wrappers(key: str) -> str:
    """``module._orig_mod.layer.0.weight`` -> ``layer.0.weight``."""
    return ".".join(part for part in key.split(".") if part not in WRAPPER_PARTS)


def match_keys(
    state: dict[str, torch.Tensor], expected: set[str]
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Remove wrapper prefixes, then one common leading prefix if that makes the keys match."""
    stripped: list[str] = []
    clean = {strip_wrappers(k): v for k, v in state.items()}
    if clean.keys() != state.keys():
        stripped.append("wrapper prefixes (" + ", ".join(f"{p}." for p in WRAPPER_PARTS) + ")")
    if set(clean) != expected:
        heads = {k.split(".", 1)[0] for k in clean}
        if len(heads) == 1 and all("." in k for k in clean):
            head = heads.pop()
            trimmed = {k.split(".", 1)[1]: v for k, v in clean.items()}
            if set(trimmed) == expected or len(set(trimmed) & expected) > len(
                set(clean) & expected
            ):
                clean = trimmed
                stripped.append(f"{head}.")
    return clean, stripped


def mismatch_report(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> str:
    """Missing, unexpected and shape-mismatched keys, with likely renamings; '' when none."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [
        f"{k} {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in sorted(set(state) & set(expected))
        if state[k].shape != expected[k].shape
    ]
    if not (missing or unexpected or shapes):
        return ""
    renames = [
        f"{u} -> {m}?"
        for u in unexpected
        for m in missing
        if u.split(".")[-1] == m.split(".")[-1] and state[u].shape == expected[m].shape
    ][:5]
    parts = []
    if missing:
        parts.append(f"missing {len(missing)} key(s) {missing[:5]}")
    if unexpected:
        parts.append(f"unexpected {len(unexpected)} key(s) {unexpected[:5]}")
    if shapes:
        parts.append(f"shape mismatch {shapes[:5]}")
    if renames:
        parts.append(f"likely renamed: {', '.join(renames)}")
    return "; ".join(parts) + ". Load into the model class that wrote the file, or rename keys."
