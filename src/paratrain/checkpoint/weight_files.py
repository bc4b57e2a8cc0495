"""Read one weights file, recognised by its content (never its name), without running pickled code.

    state, fmt = read_weights_file(Path("model.pth"), "cpu", trust=False)
    state = read_safetensors(Path("model.safetensors"), "cpu")

Formats: safetensors, torch.save's zip format and its legacy pickle format (plain, nested or
Lightning state dicts; a whole pickled ``nn.Module`` only with ``trust=True``). Anything else, or a
damaged file, raises :class:`~paratrain.errors.CheckpointError` that says what the file is not and
what is accepted. Parser errors are caught only around the parser calls themselves.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn

from paratrain.checkpoint.formats import ACCEPTED, MALFORMED, describe
from paratrain.checkpoint.safetensors_io import tie, tied_in
from paratrain.errors import CheckpointError

NESTED_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "weights")
MapLocation = str | torch.device | dict[str, str] | None
# torch.save's legacy format is a pickle (protocol 2 unless changed) that starts with PROTO.
_PICKLE_HEAD = re.compile(rb"\x80[\x02-\x05]")
_MAX_NESTING = 8


def read_weights_file(
    path: Path, map_location: MapLocation, *, trust: bool, lazy: bool = False
) -> tuple[dict[str, Any], str]:
    """The tensors of the weights file ``path`` and the name of its format. ``lazy``: the
    tensors of a torch.save zip file are mapped from the file (``torch.load(mmap=True)``), read
    as they are used; its records' CRCs are checked first, in one pass."""
    if path.suffix == ".distcp":  # many torch.save archives end to end, read only by offset
        raise CheckpointError(
            f"{path} is one rank's file of a DCP (sharded) checkpoint, not a checkpoint of its "
            f"own: its tensors are found through the folder's .metadata. Give the folder "
            f"({path.parent}) or the paratrain checkpoint folder that holds it."
        )
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(16)
    except OSError as err:
        raise CheckpointError(
            f"{path} cannot be read ({describe(err)}). Check its permissions."
        ) from None
    if size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes): the save was interrupted or failed.")
    if len(head) >= 9 and head[8:9] == b"{":
        return read_safetensors(path, map_location), "safetensors"
    fmt = "torch.save (legacy pickle)"
    if head[:2] == b"PK":
        fmt = "torch.save (zip)"
        _check_zip(path, size)
    elif not _PICKLE_HEAD.match(head):
        raise CheckpointError(
            f"{path} is not a checkpoint: it is neither a torch.save file (zip or pickle) nor "
            f"a safetensors file (it starts with {head[:8]!r}). {ACCEPTED}"
        )
    if lazy and fmt == "torch.save (zip)":  # legacy pickles cannot be mapped
        try:
            return _extract(_torch_load(path, map_location, trust, mmap=True), path), fmt
        except CheckpointError:  # a file torch cannot map: read whole, its own error if any
            pass
    return _extract(_torch_load(path, map_location, trust), path), fmt


def read_safetensors(path: Path, map_location: MapLocation) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; CheckpointError if it is not a readable one."""
    try:
        state = load_file(str(path))
        with safe_open(str(path), "pt") as opened:
            metadata = opened.metadata() or {}
    except (SafetensorError, *MALFORMED) as err:
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({describe(err)}): it is damaged, "
            f"truncated or not safetensors at all. Use another copy. {ACCEPTED}"
        ) from None
    tie(state, tied_in(metadata))
    return move_to(state, map_location)


def _check_zip(path: Path, size: int) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            bad = _first_bad_record(archive)
            names = archive.namelist()
    except (*MALFORMED, RuntimeError) as err:  # RuntimeError: "encrypted, password required"
        raise CheckpointError(
            f"{path} starts like a zip archive (torch.save's format) but is truncated or corrupt "
            f"({size} bytes; {describe(err)}). Re-save it or use an earlier copy."
        ) from None
    if bad is not None:
        raise CheckpointError(
            f"{path} is corrupt: the record {bad} fails its CRC check (a flipped or damaged "
            "byte). Use another copy of the file."
        )
    if not any(name.endswith("data.pkl") for name in names):
        raise CheckpointError(
            f"{path} is a zip archive but not a torch.save file (it has no data.pkl). {ACCEPTED}"
        )


def _first_bad_record(archive: zipfile.ZipFile) -> str | None:
    """The first record whose bytes fail their CRC-32 (``testzip``'s check), leaving out records
    written without one: torch records 0 while ``torch.serialization.set_crc32_options(False)``
    is in effect, and ``torch.load`` reads such files as any other."""
    for info in archive.infolist():
        if info.CRC == 0 and info.file_size:  # no CRC was computed (an empty record's is 0)
            continue
        try:
            with archive.open(info) as member:
                while member.read(2**20):
                    pass
        except zipfile.BadZipFile:
            return info.filename
    return None


def _torch_load(path: Path, map_location: MapLocation, trust: bool, *, mmap: bool = False) -> Any:
    try:
        return torch.load(path, map_location=map_location, weights_only=not trust, mmap=mmap)
    except pickle.UnpicklingError as err:
        text = str(err)
        refused = re.search(r"GLOBAL (\S+)", text)
        if trust or refused is None:
            inner = re.search(r"WeightsUnpickler error: ([^\n]+)", text)  # under torch's advice
            reason = inner.group(1) if inner else describe(err)
            raise CheckpointError(f"{path} is truncated or corrupt ({reason}).") from None
        raise CheckpointError(
            f"{path} contains pickled Python objects, not just tensors (it refers to "
            f"{refused.group(1)}; e.g. a whole model saved with torch.save(model)); loading it "
            "would run code from the file. paratrain refused. If you trust its origin, pass "
            "trust=True (CLI: --trust); better, re-save it as model.state_dict()."
        ) from None
    except ImportError as err:  # trust=True: the pickle names a class this process cannot import
        raise CheckpointError(
            f"{path} needs code that is not importable here ({describe(err)}). Install or import "
            "the package that defined the pickled objects, or re-save the weights as a "
            "state_dict."
        ) from None
    except (*MALFORMED, RuntimeError) as err:
        raise CheckpointError(
            f"{path} is truncated or corrupt ({describe(err)}). Use another copy."
        ) from None


def _extract(obj: Any, path: Path, depth: int = 0) -> dict[str, torch.Tensor]:
    """The state dict inside what torch.load returned (plain, nested, Lightning or a module)."""
    if isinstance(obj, nn.Module):
        return dict(obj.state_dict())
    if isinstance(obj, dict):
        tensors = {
            k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)
        }
        if tensors and len(tensors) == len(obj):
            return tensors
        for key in NESTED_KEYS:
            # A pickle can nest a dict in itself: stop where no real checkpoint goes.
            if key in obj and isinstance(obj[key], (dict, nn.Module)) and depth < _MAX_NESTING:
                return _extract(obj[key], path, depth + 1)
        if tensors:
            return tensors
    keys = f" with keys {sorted(map(str, obj))[:8]}" if isinstance(obj, dict) else ""
    raise CheckpointError(
        f"Found no weights in {path} (top level: {type(obj).__name__}{keys}). Save "
        "model.state_dict(), or a dict holding it under 'state_dict' or 'model'."
    )


def move_to(state: dict[str, torch.Tensor], map_location: MapLocation) -> dict[str, torch.Tensor]:
    """``state`` with its tensors moved as ``torch.load(map_location=...)`` would."""
    if map_location is None or map_location == "cpu":
        return state
    if isinstance(map_location, dict):
        return {k: v.to(map_location.get(str(v.device), str(v.device))) for k, v in state.items()}
    return {k: v.to(map_location) for k, v in state.items()}
