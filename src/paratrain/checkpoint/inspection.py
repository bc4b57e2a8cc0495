"""Understand, check, convert and compare checkpoints; every function returns data.

    inspect("runs/exp/checkpoints")          # the run's checkpoints and which are valid
    verify("model.pt")                       # (True, ["ok: ..."]) or (False, [problems])
    convert("old_dp.pth", "model.safetensors", to="safetensors")
    convert("runs/exp/checkpoints/step-100", "hf-out", to="hf", rename=Path("names.json"))
    diff("a.pt", "b.safetensors")
    verify("s3://bucket/run1")               # URLs too: downloaded, one checkpoint at a time

A URL is read through a temporary local copy (credentials and endpoint from the environment);
``convert`` to a URL writes locally, then uploads (a folder's ``model.safetensors.index.json`` or
``.metadata`` last: a folder is whole once it is there).

Anything that is not a readable checkpoint raises :class:`~paratrain.errors.CheckpointError`
(``verify`` reports it as a problem instead). ``paratrain ckpt`` renders the results.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from paratrain.checkpoint.backends import fetched, open_storage
from paratrain.checkpoint.formats import FORMATS, describe
from paratrain.checkpoint.hf_folder import (
    DEFAULT_SHARD_BYTES,
    INDEX,
    key_mapping,
    renamed,
)
from paratrain.checkpoint.loading import (
    WRAPPER_PARTS,
    read_state_dict,
    require_bool,
    strip_wrappers,
)
from paratrain.checkpoint.manifest import MANIFEST, Manifest
from paratrain.checkpoint.object_storage import is_url, relabel
from paratrain.checkpoint.restore import load_trainer
from paratrain.checkpoint.safetensors_io import SAFETENSORS_DTYPES
from paratrain.checkpoint.storage import url_of
from paratrain.checkpoint.store import PREFIX
from paratrain.checkpoint.streamed import Source, streamed_source, write_streamed
from paratrain.core.paths import check_new, existing
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
    if not path.is_dir() or (path / MANIFEST).exists():
        return []
    return sorted((p for p in path.glob(f"{PREFIX}*") if p.is_dir()), reverse=True)


def remote_checkpoints_in(url: str) -> list[str]:
    """URLs of the ``step-*`` folders at ``url``, newest name first ([]: not such a folder)."""
    storage = open_storage(url, what="The checkpoint URL", error=CheckpointError)
    objects = storage.list()
    if MANIFEST in objects:
        return []
    names = {rel.split("/", 1)[0] for rel in objects if "/" in rel and rel.startswith(PREFIX)}
    return [url_of(storage, name) for name in sorted(names, reverse=True)]


def inspect(path: str | Path, *, trust: bool = False) -> dict[str, Any]:
    """Format, tensors, prefixes, and for paratrain checkpoints the saved run and resume state.

    A folder of paratrain checkpoints (``step-*``) gives each one's validity instead.
    """
    require_bool("trust", trust)
    folders: list[str] | list[Path]
    if is_url(path):
        folders = remote_checkpoints_in(str(path))
        if not folders:
            with fetched(str(path)) as local:
                return relabel(inspect(local, trust=trust), local, str(path).rstrip("/"))
    else:
        path = existing(path, "The checkpoint path", CheckpointError)
        folders = _checkpoints_in(path)
    if folders:
        entries = []
        for folder in folders:
            ok, problems = verify(folder)
            entries.append({"path": str(folder), "valid": ok, "problems": [] if ok else problems})
        return {
            "path": str(path),
            "format": "paratrain checkpoint directory",
            "checkpoints": entries,
        }
    path = Path(path)
    state, fmt = read_state_dict(path, trust=trust)
    report: dict[str, Any] = {"path": str(path), "format": fmt, **_summary(state)}
    if (path / MANIFEST).is_file():
        report.update(_saved_run(path))
    return report


def _saved_run(folder: Path) -> dict[str, Any]:
    manifest = Manifest.read(folder)
    trainer = load_trainer(folder)
    if not isinstance(trainer, dict):
        raise CheckpointError(
            f"{folder / 'trainer.pt'} holds a {type(trainer).__name__}, not the trainer state "
            "paratrain writes; the checkpoint is damaged. Use another checkpoint."
        )
    rng, extras = trainer.get("rng"), trainer.get("extras")
    schedulers = trainer.get("schedulers")
    if not isinstance(schedulers, dict):  # format 1: one scheduler or none
        schedulers = {"scheduler": 1} if trainer.get("scheduler") is not None else {}
    return {
        "saved_by": {
            "strategy": manifest.strategy,
            "world_size": manifest.world_size,
            "mesh": _mesh_words(manifest.mesh, manifest.world_size),
            "layout": manifest.layout,
            "global_batch": manifest.global_batch,
            **(
                {
                    "trained_by": (
                        f"{manifest.trained['strategy']}, "
                        f"{_mesh_words(*manifest.trained_at[::-1])} (tensors resharded offline "
                        "by paratrain ckpt reshard)"
                    )
                }
                if manifest.trained
                else {}
            ),
            "paratrain": manifest.paratrain_version,
            "torch": manifest.torch_version,
        },
        "resume_state": {
            "epoch": manifest.epoch,
            "step": manifest.step,
            "samples_in_epoch": manifest.samples_in_epoch,
            "optimizer": (folder / "optimizer.safetensors").is_file() or (folder / "dcp").is_dir(),
            "models": list(manifest.models),
            "schedulers": sorted(map(str, schedulers)),
            "loaders": _names(trainer.get("loaders")),
            "tracked": _names(trainer.get("objects")),
            "grad_scaler": trainer.get("scaler") is not None,
            "rng_ranks": len(rng) if isinstance(rng, list) else 0,
            "extras": sorted(map(str, extras)) if isinstance(extras, dict) else [],
        },
        "resumes_under": _resumes_under(manifest, trainer),
    }


LAYOUTS = (
    "one process, ddp, fsdp, tp, fsdp+tp, hsdp, pipeline (1f1b, gpipe, interleaved), "
    "pp x dp, pp x tp"
)
"""Every layout resumes from every other (tests/test_layout_matrix.py proves each pair)."""


def _resumes_under(manifest: Manifest, trainer: dict[str, Any]) -> dict[str, str]:
    """The layouts and world sizes a resume from this checkpoint works under."""
    per_rank = trainer.get("objects_per_rank")
    differing = sorted(map(str, per_rank)) if isinstance(per_rank, dict) else []
    world = (
        f"{manifest.trained_at[0]} only: run.track state that differs by rank ({differing}); "
        "track it with replicated=True if one rank's copy serves all"
        if differing
        else "any"
    )
    return {
        "layouts": LAYOUTS,
        "world_size": world,
        "tp": "a tp size that divides every split layer's width (and head count)",
        "global_batch": (
            f"{manifest.global_batch} (per-rank batch x data-parallel ranks x grad_accum); "
            "another is reported at resume, kept with keep_global_batch=True"
            if manifest.global_batch
            else "as saved"
        ),
    }


def _mesh_words(mesh: dict[str, int] | None, world_size: int) -> str:
    """``dp 2 x tp 2``: the axes larger than one (every rank on dp when none was recorded)."""
    axes = [f"{a} {n}" for a, n in (mesh or {"dp": world_size}).items() if n > 1]
    return " x ".join(axes) or "one rank"


def _names(entry: object) -> list[str]:
    return sorted(map(str, entry)) if isinstance(entry, dict) else []


def verify(path: str | Path) -> tuple[bool, list[str]]:
    """Check checksums (paratrain checkpoints) or read everything (other formats)."""
    folders: list[str] | list[Path]
    if is_url(path):
        folders = remote_checkpoints_in(str(path))
        if not folders:
            with fetched(str(path)) as local:
                ok, lines = verify(local)
            return ok, relabel(lines, local, str(path).rstrip("/"))
    else:
        path = existing(path, "The checkpoint path", CheckpointError)
        folders = _checkpoints_in(path)
    if folders:
        lines, any_ok = [], False
        for folder in folders:
            ok, problems = verify(folder)
            any_ok |= ok
            lines.append(
                f"{'ok' if ok else 'BAD'}: {PurePosixPath(str(folder)).name}"
                + ("" if ok else f" ({'; '.join(problems)})")
            )
        return any_ok, lines
    path = Path(path)
    if (path / MANIFEST).is_file():
        try:
            problems = Manifest.read(path).verify(path)
        except CheckpointError as err:
            return False, [str(err)]
        if problems:
            return False, problems
        return True, [f"ok: {path} ({len(Manifest.read(path).files)} files match their checksums)"]
    try:
        state, fmt = read_state_dict(path)
    except CheckpointError as err:
        return False, [str(err)]
    return True, [f"ok: {path} ({fmt}, {len(state)} tensors read in full)"]


def convert(
    src: str | Path,
    dst: str | Path,
    *,
    to: str,
    trust: bool = False,
    rename: Path | None = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Rewrite ``src`` as ``to`` at ``dst``, keys without wrapper prefixes (then through the
    ``rename`` mapping file, see :func:`~paratrain.checkpoint.hf_folder.key_mapping`); ``hf``
    shards hold at most ``max_shard_bytes`` each; ``progress(done, total)`` gets the bytes
    written, tensor by tensor, when the conversion is streamed. Never overwrites; nothing is
    left at ``dst`` on an error."""
    require_bool("trust", trust)
    if to not in FORMATS:
        raise CheckpointError(f"Unknown target format {to!r}. Available: {', '.join(FORMATS)}.")
    if is_url(dst):
        return _convert_to_url(
            src, str(dst), to=to, trust=trust, rename=rename, max_shard_bytes=max_shard_bytes,
            progress=progress,
        )  # fmt: skip
    dst = check_new(dst, "The output path", CheckpointError)
    source = (
        None
        if is_url(src)
        else streamed_source(existing(src, "The checkpoint path", CheckpointError))
    )
    if source is None:  # a torch.save zip file (mapped, not copied), a legacy pickle, a URL
        state, fmt = read_state_dict(src, trust=trust, lazy=True)
        source = replace(Source.of(state), fmt=fmt)
    names = _output_names(list(source.entries), src, rename)
    if to in ("safetensors", "hf"):
        _safetensors_can_hold(source, names, src, to)
    try:
        write_streamed(
            source, names, dst, to=to, max_shard_bytes=max_shard_bytes, progress=progress
        )
    except OSError as err:
        raise CheckpointError(
            f"Converting {src} to {dst} failed ({describe(err)}). Check that the input can be "
            "read, that the output's folder is writable and that the disk has room; nothing "
            "was written."
        ) from None
    return {
        "from": source.fmt,
        "to": to,
        "tensors": len(names),
        "path": str(dst),
        "stripped": sum(k != strip_wrappers(k) for k in source.entries),
    }


def _safetensors_can_hold(
    source: Source, names: Mapping[str, str], src: str | Path, to: str
) -> None:
    """Refuse, before anything is written, a tensor safetensors cannot hold: its dtype, or the
    name its header keeps for metadata."""
    what = "safetensors shards" if to == "hf" else "safetensors"
    for new, old in names.items():
        if new == "__metadata__":
            raise CheckpointError(
                f"{src} cannot be written as {what}: a tensor is named __metadata__, which the "
                "format keeps for its header. Rename it with --map (a JSON object "
                '{"__metadata__": "new_name"}), or convert with --to pt or --to dcp; nothing '
                "was written."
            )
        dtype = source.entries[old].dtype
        if dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(
                f"{src} cannot be written as {what}: {new} is a {dtype} tensor, which the "
                f"format cannot hold. Convert it with --to pt or --to dcp, or leave that tensor "
                "out with --map (null drops it); nothing was written."
            )


def _output_names(keys: list[str], src: str | Path, rename: Path | None) -> dict[str, str]:
    """Each output name -> its key in ``src``: wrapper prefixes stripped, then ``rename``d."""
    names = {strip_wrappers(k): k for k in keys}
    if len(names) != len(keys):
        raise CheckpointError(
            f"{src}: stripping wrapper prefixes would merge keys; convert "
            "it with the prefixes kept by loading it into its model first."
        )
    return names if rename is None else renamed(names, key_mapping(rename), str(src))


MARKERS = {"hf": INDEX, "dcp": ".metadata"}
"""The file of a folder written last to a URL: a reader takes the folder for whole once it is
there (an object store has no rename; one object's PUT is atomic)."""


def _convert_to_url(src: str | Path, dst: str, *, to: str, **options: Any) -> dict[str, Any]:
    """:func:`convert` to a local folder, then uploaded to ``dst`` (a file's object, or a
    folder's objects with its marker file last); refused when ``dst`` holds anything."""
    parent, _, name = dst.rstrip("/").rpartition("/")
    if not name or "://" not in parent + "/":
        raise CheckpointError(f"The output URL {dst} names no object. Give e.g. s3://bucket/out.")
    folder = to in MARKERS
    storage = open_storage(dst if folder else parent, what="The output URL", error=CheckpointError)
    taken = storage.list("") if folder else storage.get(name, start=0, end=1) is not None
    if taken:
        raise CheckpointError(
            f"The output URL {dst} already exists. Choose a new one; nothing was written."
        )
    with tempfile.TemporaryDirectory(prefix="paratrain-convert-") as tmp:
        result = convert(src, Path(tmp) / name, to=to, **options)
        local = Path(tmp) / name
        if folder:
            files = sorted(p for p in local.rglob("*") if p.is_file())
            marker = local / MARKERS[to]
            storage.put([(p, p.relative_to(local).as_posix()) for p in files if p != marker])
            storage.commit(MARKERS[to], marker.read_bytes())
        else:
            storage.put([(local, name)])
    return {**result, "path": dst}


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference of two tensors of one shape and dtype; inf if not numeric."""
    if a.numel() == 0 or torch.equal(_raw(a), _raw(b)):
        return 0.0
    if a.dtype in _NOT_NUMERIC:
        return float("inf")
    wide = torch.complex128 if a.dtype.is_complex else torch.float64
    return float((a.to(wide) - b.to(wide)).abs().max())


def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


# Bit containers and packed 4-bit floats: torch compares their bytes but has no arithmetic.
_NOT_NUMERIC = {
    getattr(torch, name)
    for name in ("bits1x8", "bits2x4", "bits4x2", "bits8", "bits16", "float4_e2m1fn_x2")
    if hasattr(torch, name)
}


def diff(a: str | Path, b: str | Path, *, trust: bool = False) -> dict[str, Any]:
    """Keys only in one side, shape/dtype changes, and the largest value differences.

    Tensors are equal when their bytes are; ``inf`` marks a difference in a dtype torch has no
    arithmetic for (``bits8``, packed 4-bit floats).
    """
    require_bool("trust", trust)
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
            (_max_abs_diff(sa[k], sb[k]), k)
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
