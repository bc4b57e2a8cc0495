"""Hugging Face-style folders of sharded safetensors: read any, write size-capped shards.

    state = read_hf_folder(Path("gpt2-ft"))                     # model.safetensors.index.json
    write_hf_folder(state, Path("out"), max_shard_bytes=5 * 10**9)   # paratrain.checkpoint.streamed
    rename = key_mapping(Path("names.json"))                    # or a .py with rename(key)

A folder holds ``model-00001-of-00003.safetensors``... and ``model.safetensors.index.json``,
whose ``weight_map`` names the shard of every tensor and whose ``metadata.total_size`` is the
bytes of all tensors. Tied weights (two names, one storage: a GPT's embedding and output layer)
are written once, under the first name; the index's ``metadata.tied`` maps each dropped name to
the kept one, and :func:`read_hf_folder` gives both names back. ``safetensors.torch.load_file``
of each shard is all a reader needs; a model whose tied weights share a parameter loads with
``strict=False`` (the tied name is the only one missing).

A damaged folder is refused before anything is returned: a shard the index names that is missing
or unreadable (truncated), a tensor in two shards, a tensor the index places in a shard that lacks
it. The output folder appears whole or not at all (written beside it under a temporary name,
then renamed).
"""

from __future__ import annotations

import json
import runpy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import torch

from paratrain.checkpoint.safetensors_io import file_entries, tie
from paratrain.checkpoint.weight_files import read_safetensors
from paratrain.errors import CheckpointError

INDEX = "model.safetensors.index.json"
Value = TypeVar("Value")
DEFAULT_SHARD_BYTES = 5 * 10**9
"""The shard size cap ``save_pretrained`` uses by default (5 GB)."""


def is_hf_folder(path: Path) -> bool:
    """Whether ``path`` is a folder with a sharded-safetensors index."""
    return (path / INDEX).is_file()


def hf_shards(path: Path) -> tuple[list[Path], dict[str, str]]:
    """The folder's shard files, checked against its index from their headers alone (see the
    module docstring), and its tied names (each dropped name to the kept one)."""
    weight_map, tied = _read_index(path)
    by_shard: dict[str, list[str]] = {}
    for key, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(key)
    missing = sorted(shard for shard in by_shard if not (path / shard).is_file())
    if missing:
        raise CheckpointError(
            f"{path / INDEX} names {len(missing)} shard(s) the folder does not have: "
            f"{', '.join(missing[:5])} (holding {sum(len(by_shard[s]) for s in missing)} tensors). "
            "Copy the missing shards into the folder (a download cut short?), or use a complete "
            "copy."
        )
    seen: dict[str, str] = {}
    for shard in sorted(by_shard):
        try:
            entries, _ = file_entries(path / shard)
        except CheckpointError as err:
            raise CheckpointError(
                f"{err} It is a shard of {path}: it is damaged or truncated; use another copy."
            ) from None
        names = {e.name for e in entries}
        for key in sorted(names):
            if key in seen:
                raise CheckpointError(
                    f"{path}: the tensor {key!r} is in two shards, {seen[key]} and {shard}; a "
                    "folder holds each tensor once. Remove it from the shard the index does not "
                    f"name (the index names {weight_map.get(key, 'neither')})."
                )
            seen[key] = shard
        absent = sorted(set(by_shard[shard]) - names)
        if absent:
            raise CheckpointError(
                f"{path / INDEX} places {len(absent)} tensor(s) in {shard} that it does not hold: "
                f"{', '.join(absent[:5])}. The index and the shards are from different saves; use "
                "a consistent copy of the folder."
            )
    return [path / shard for shard in sorted(by_shard)], tied


def read_hf_folder(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's shards, checked against its index first (:func:`hf_shards`);
    tied names given back as the same tensor."""
    shards, tied = hf_shards(path)
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(read_safetensors(shard, "cpu"))
    tie(state, tied)
    return state


def _read_index(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The index's weight map, and its tied names (each dropped name to the kept one)."""
    try:
        index = json.loads((path / INDEX).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(
            f"{path / INDEX} is not a readable index ({type(err).__name__}: {err}). Use a complete "
            "copy of the folder."
        ) from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and "/" not in v and v not in ("", ".", "..")
        for k, v in weight_map.items()
    ):
        raise CheckpointError(
            f"{path / INDEX} has no weight_map of tensor names to shard files in the folder. Use "
            "a complete copy of the folder."
        )
    metadata = index.get("metadata")
    tied = metadata.get("tied") if isinstance(metadata, dict) else None
    if not isinstance(tied, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tied.items()
    ):
        tied = {}
    return dict(weight_map), dict(tied)


def key_mapping(path: Path) -> Callable[[str], str | None]:
    """The renaming of ``--map``: a JSON object of source names (or prefixes ending in ``.``) to
    target names (or prefixes; ``null`` drops), the longest matching entry winning; or a Python
    file defining ``rename(key) -> str | None``. A key no JSON entry matches is an error."""
    if path.suffix == ".py":
        try:
            namespace = runpy.run_path(str(path))
        except Exception as err:  # the user's mapping file failed: name it, with its error
            raise CheckpointError(
                f"--map {path} failed to run ({type(err).__name__}: {err}). Fix it; it must "
                "define rename(key) -> str | None."
            ) from None
        rename = namespace.get("rename")
        if not callable(rename):
            raise CheckpointError(
                f"--map {path} defines no rename(key) function. Add `def rename(key: str) -> str "
                "| None:` returning the new name (None drops the tensor)."
            )
        return _checked(rename, path)
    try:
        table = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(
            f"--map {path} is not a readable JSON object ({type(err).__name__}: {err}). Write it "
            'as {"old.name": "new.name", "old.prefix.": "new.prefix."}, or give a .py file with '
            "rename(key)."
        ) from None
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in table.items()
    ):
        raise CheckpointError(
            f"--map {path} must be one JSON object of names to names (or null to drop), e.g. "
            '{"transformer.wte.weight": "tok.weight", "transformer.h.": "blocks."}.'
        )
    prefixes = sorted((k for k in table if k.endswith(".")), key=len, reverse=True)

    def by_table(key: str) -> str | None:
        if key in table:
            return table[key]  # type: ignore[no-any-return]
        for prefix in prefixes:
            if key.startswith(prefix):
                target = table[prefix]
                return None if target is None else target + key[len(prefix) :]
        raise _Unmapped(key)

    return by_table


class _Unmapped(Exception):
    """A key no entry of a JSON ``--map`` matches."""


def _checked(rename: Callable[[str], object], path: Path) -> Callable[[str], str | None]:
    def call(key: str) -> str | None:
        try:
            new = rename(key)
        except Exception as err:  # the user's function failed on this key
            raise CheckpointError(
                f"--map {path}: rename({key!r}) raised {type(err).__name__}: {err}. Fix the "
                "function; nothing was written."
            ) from None
        if new is not None and not isinstance(new, str):
            raise CheckpointError(
                f"--map {path}: rename({key!r}) returned {new!r}; return a str, or None to drop "
                "the tensor. Nothing was written."
            )
        return new

    return call


def renamed(
    state: Mapping[str, Value], rename: Callable[[str], str | None], source: str
) -> dict[str, Value]:
    """``state`` with every key passed through ``rename`` (None drops it); an unmapped key or
    two keys given one name is an error that names them."""
    out: dict[str, Value] = {}
    origin: dict[str, str] = {}
    unmapped: list[str] = []
    for key, tensor in state.items():
        try:
            new = rename(key)
        except _Unmapped:
            unmapped.append(key)
            continue
        if new is None:
            continue
        if new in origin:
            raise CheckpointError(
                f"--map gives {origin[new]!r} and {key!r} of {source} the same name {new!r}. Map "
                "them to different names (or drop one with null). Nothing was written."
            )
        origin[new] = key
        out[new] = tensor
    if unmapped:
        shown = ", ".join(unmapped[:5]) + (f" and {len(unmapped) - 5} more" if unmapped[5:] else "")
        first = unmapped[0]
        prefix = first.rpartition(".")[0]
        under = f', or a prefix such as "{prefix}." maps all under it' if prefix else ""
        raise CheckpointError(
            f"--map leaves {len(unmapped)} tensor(s) of {source} unmapped: {shown}. Add an entry "
            f'for each (e.g. "{first}": "{first}" keeps the name, null drops it{under}). '
            "Nothing was written."
        )
    return out
