"""Read weights from any common checkpoint format, without executing pickled code.

    report = paratrain.load_weights(model, "old_run/model_dp.pth")      # prefixes stripped
    state, fmt = read_state_dict("ckpt_dir/step-00000300")               # without a model
    paratrain.load_weights(model, "s3://bucket/run1/step-00000300")     # any fsspec URL

Formats: plain state dicts (.pt/.pth/.bin/.ckpt), nested ones (``{"state_dict": ...}``,
``{"model": ...}``, Lightning), ``module.``/``_orig_mod.``/FSDP prefixes at any depth, safetensors,
Accelerate ``save_state`` folders, DCP folders and paratrain checkpoints. ``torch.load`` always runs
with ``weights_only=True``; a pickled ``nn.Module`` needs ``trust=True`` (a real ``bool``).
A URL (``s3://...``) is downloaded into a temporary folder first (credentials and endpoint from
the environment, or ``storage_options``); a paratrain checkpoint's checksums are verified there.
Anything else, damaged files and files that are not checkpoints at all, raises
:class:`~paratrain.errors.CheckpointError` saying what the file is not and what is accepted.
The model given to :func:`load_weights` may be wrapped in ``DataParallel``,
``DistributedDataParallel`` or ``torch.compile``, or sharded with FSDP2's ``fully_shard``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from paratrain.checkpoint.backends import fetched
from paratrain.checkpoint.dcp_io import read_dcp_tensors
from paratrain.checkpoint.formats import ACCEPTED
from paratrain.checkpoint.hf_folder import is_hf_folder, read_hf_folder
from paratrain.checkpoint.manifest import MANIFEST, Manifest
from paratrain.checkpoint.object_storage import is_url
from paratrain.checkpoint.weight_files import (
    MapLocation,
    move_to,
    read_safetensors,
    read_weights_file,
)
from paratrain.core.paths import existing
from paratrain.errors import CheckpointError, ConfigError, ModelError

WRAPPER_PARTS = ("module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
ACCELERATE_FILES = ("model.safetensors", "pytorch_model.bin", "model.bin", "pytorch_model.pt")


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
    model: nn.Module,
    path: str | Path,
    *,
    map_location: MapLocation = "cpu",
    trust: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> LoadReport:
    """Load weights from ``path`` (a file, a folder or a URL) into ``model`` strictly; explain
    any mismatch. ``storage_options`` go to ``fsspec.url_to_fs`` for a URL.

    ``model`` may be wrapped (``DataParallel``, ``DistributedDataParallel``, ``torch.compile``)
    or sharded with FSDP2 (then every rank calls this; each loads its own shards).
    """
    require_bool("trust", trust)
    if not isinstance(model, nn.Module):
        raise ModelError(
            f"load_weights(model=...) takes the torch.nn.Module to load into, got "
            f"{type(model).__name__}. Build the model first, then load_weights(model, path)."
        )
    state, fmt = read_state_dict(
        path, map_location=map_location, trust=trust, storage_options=storage_options
    )
    target = unwrap(model)
    expected = target.state_dict()
    state, stripped = match_keys(state, set(expected))
    problems = mismatch_report(state, expected)
    if problems:
        raise CheckpointError(f"{path} does not match {type(target).__name__}: {problems}")
    _load_into(target, state, expected, path)
    return LoadReport(format=fmt, keys=len(state), stripped=stripped)


def require_bool(name: str, value: object) -> bool:
    """``value`` if it is a real ``bool``; a ConfigError naming ``name`` otherwise.

    Guards such as ``trust`` must not accept ``"no"`` or ``0``: any non-empty string is truthy.
    """
    if not isinstance(value, bool):
        raise ConfigError(
            f"{name} must be True or False, got {value!r} ({type(value).__name__}). Pass "
            f"{name}=True or {name}=False; other values are refused because a string such as "
            "'no' would count as true."
        )
    return value


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside ``DataParallel``/``DistributedDataParallel``/``torch.compile`` wrappers.

    FSDP2 (``fully_shard``) changes the module in place, so it has nothing to unwrap.
    """
    # Imported by torch.compile itself; importing it here would cost ~2 s on every load.
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    while True:
        if isinstance(model, (nn.DataParallel, DistributedDataParallel)):
            model = model.module
        elif eval_frame is not None and isinstance(model, eval_frame.OptimizedModule):
            model = model._orig_mod
        else:
            return model


def _load_into(
    target: nn.Module, state: dict[str, torch.Tensor], expected: dict[str, Any], path: str | Path
) -> None:
    try:
        if any(isinstance(v, DTensor) for v in expected.values()):  # FSDP2: shard the full ones
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, strict=True)
            set_model_state_dict(target, dict[str, Any](state), options=options)
        else:
            target.load_state_dict(state, strict=True)
    except RuntimeError as err:  # load_state_dict collects copy errors (dtype, layout) into one
        raise CheckpointError(
            f"{path} matches {type(target).__name__} by name and shape, but its tensors cannot "
            f"be copied into the model ({err}). Check the file's dtypes with `paratrain ckpt "
            "inspect`."
        ) from None


def check_map_location(map_location: MapLocation) -> None:
    """Refuse a device this machine does not have, before reading (not as a 'corrupt' file)."""
    try:
        device = (
            torch.device(map_location) if isinstance(map_location, (str, torch.device)) else None
        )
    except (RuntimeError, TypeError):
        raise CheckpointError(
            f"map_location={map_location!r} is not a device. Use 'cpu', 'cuda', 'cuda:0', ..."
        ) from None
    if device is not None and device.type == "cuda":
        count = torch.cuda.device_count()
        index = device.index or 0
        if index >= count:
            raise CheckpointError(
                f"map_location={map_location!r}, but this machine has {count} visible GPU(s). "
                "Use map_location='cpu' (the default), or a GPU that exists."
            )


def read_state_dict(
    path: str | Path,
    *,
    map_location: MapLocation = "cpu",
    trust: bool = False,
    storage_options: dict[str, Any] | None = None,
    lazy: bool = False,
) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors stored at ``path`` (file, folder or URL) and the name of the format.
    ``lazy``: a torch.save zip file's tensors are mapped from the file, read as they are used
    (a conversion then holds no copy of the whole state).

    Raises CheckpointError for anything that is not a readable checkpoint.
    """
    require_bool("trust", trust)
    check_map_location(map_location)
    if is_url(path):
        with fetched(str(path), storage_options) as local:
            return read_state_dict(local, map_location=map_location, trust=trust)
    path = existing(path, "The checkpoint path", CheckpointError)
    if path.is_dir():
        state, fmt = _read_dir(path, map_location, trust)
    elif path.is_file():
        state, fmt = read_weights_file(path, map_location, trust=trust, lazy=lazy)
    else:
        raise CheckpointError(f"{path} is not a regular file or a folder. {ACCEPTED}")
    odd = [k for k, v in state.items() if v.layout != torch.strided or v.is_quantized or v.is_meta]
    if odd:
        raise CheckpointError(
            f"{path} holds sparse, quantized or data-less (meta) tensors ({odd[:5]}); paratrain "
            "reads dense weights only. Re-save them dense, e.g. {k: v.to_dense() ...}."
        )
    return state, fmt


def _read_dir(path: Path, map_location: MapLocation, trust: bool) -> tuple[dict[str, Any], str]:
    if (path / MANIFEST).is_file():
        problems = Manifest.read(path).verify(path)
        if problems:
            raise CheckpointError(f"{path} is damaged: {'; '.join(problems)}.")
        if (path / "model.safetensors").is_file():
            return read_safetensors(path / "model.safetensors", map_location), "paratrain"
        state = read_dcp_tensors(path / "dcp", prefix="model.")
        return move_to(state, map_location), "paratrain (sharded)"
    if (path / ".metadata").is_file():
        return move_to(read_dcp_tensors(path, prefix=None), map_location), "dcp"
    if is_hf_folder(path):
        return move_to(read_hf_folder(path), map_location), "hf folder"
    for name in ACCELERATE_FILES:
        if (path / name).is_file():
            state, _ = read_weights_file(path / name, map_location, trust=trust)
            return state, f"accelerate folder ({name})"
    listing = ", ".join(sorted(p.name for p in path.iterdir())[:8]) or "nothing"
    raise CheckpointError(
        f"{path} is a directory but not a checkpoint folder paratrain knows (it holds: "
        f"{listing}). Point at the weights file itself, or at a paratrain, DCP or Accelerate "
        f"checkpoint folder. {ACCEPTED}"
    )


def strip_wrappers(key: str) -> str:
    """``module._orig_mod.layer.0.weight`` -> ``layer.0.weight``."""
    return ".".join(part for part in key.split(".") if part not in WRAPPER_PARTS)


def match_keys(
    state: dict[str, torch.Tensor], expected: set[str]
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Remove wrapper prefixes, then one common leading prefix if that makes more keys match."""
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
