"""A checkpoint's manifest: what it holds, who wrote it, and a checksum per file.

    manifest = Manifest.read(folder)          # CheckpointError if missing or malformed
    problems = manifest.verify(folder)        # [] when every file is present and intact

The manifest is written last, after every other file is durable; a folder without one was never
committed.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from dataclasses import dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import Any

import torch
import xxhash

from paratrain.checkpoint.verified_reads import (
    blocks_problem,
    file_problem,
    read_blocks_verified,
    read_verified,
)
from paratrain.errors import CheckpointError

FORMAT_VERSION = 7
"""1: one model and optimizer; 2: named models, schedulers, objects, loader positions;
3: XXH3-64 checksums instead of CRC32; 4: files checked per block (``blocks``); 5: a mesh;
6: tensors rewritten for another layout (``trained``); 7: ``blocks`` written packed (base64 of
little-endian 64-bit checksums: sharded files are checked per 32 KiB, thousands per file)."""
MANIFEST = "manifest.json"
MANIFEST_CHECKSUM = "manifest.xxh3"
"""XXH3-64 of manifest.json's bytes, in hex: a damaged manifest is skipped like a damaged file.
A file of its own (not a field), so paratrain versions that predate it still read the manifest."""


@dataclass(kw_only=True, slots=True)
class FileRecord:
    """One file of a checkpoint: its size and its checksum (one of three kinds).

    record.problem(folder / name)            # None, or what is wrong with the file
    record.read(folder / name)               # its bytes, verified (CheckpointDamagedError)
    record.read(path, wanted=[(0, 100)])     # with blocks: only the blocks covering the ranges
    """

    bytes: int
    """Size of the file."""
    xxh3_64: int | None = None
    """xxHash XXH3-64 of the file's bytes (formats 3 and 4)."""
    crc32: int | None = None
    """zlib CRC32 of the file's bytes (formats 1 and 2)."""
    block_bytes: int | None = None
    """With ``blocks``: bytes per block (format 4)."""
    blocks: list[int] | None = None
    """XXH3-64 of each ``block_bytes`` of the file, the last block possibly short."""

    @property
    def checksum(self) -> tuple[str, int]:
        """(algorithm, value) of a whole-file checksum (not for a record with ``blocks``)."""
        if self.xxh3_64 is not None:
            return "xxh3_64", self.xxh3_64
        assert self.crc32 is not None  # checked when the manifest is read
        return "crc32", self.crc32

    def problem(self, path: Path) -> str | None:
        """What is wrong with ``path`` (missing, resized, corrupted, unreadable), or None."""
        if self.blocks is not None:
            assert self.block_bytes is not None  # checked when the manifest is read
            return blocks_problem(path, self.bytes, self.block_bytes, self.blocks)
        return file_problem(path, *self.checksum, self.bytes)

    def read(self, path: Path, wanted: list[tuple[int, int]] | None = None) -> torch.Tensor:
        """The verified bytes of ``path`` (all of them, or with ``blocks`` only those covering
        ``wanted``); CheckpointDamagedError when what was read is damaged."""
        if self.blocks is not None:
            assert self.block_bytes is not None
            return read_blocks_verified(path, self.bytes, self.block_bytes, self.blocks, wanted)
        return read_verified(path, *self.checksum, self.bytes)


@dataclass(kw_only=True, slots=True)
class Manifest:
    """Everything needed to trust and interpret a checkpoint folder."""

    format_version: int = FORMAT_VERSION
    """Layout version of paratrain checkpoints."""
    paratrain_version: str
    """paratrain version that wrote it."""
    torch_version: str
    """torch version that wrote it."""
    layout: str
    """``replicated`` (one full copy, safetensors) or ``sharded`` (DCP folder)."""
    strategy: str
    """Strategy of the run that wrote it."""
    world_size: int
    """Ranks of the run that wrote it."""
    per_rank_batch: int | None
    """Per-rank batch of the training loader (None when no loader was made)."""
    grad_accum: int
    """Micro-batches per step."""
    epoch: int
    """Epoch in progress when saved."""
    step: int
    """Optimizer steps taken."""
    samples_in_epoch: int
    """Samples of the current epoch consumed by all ranks together."""
    created: float
    """Unix time of the save."""
    run_id: str = ""
    """The job that wrote it (torchrun's run id, Slurm's job id, or a fresh id)."""
    lineage: str = ""
    """The run id of the fresh start that this chain of resumes began with. Rotation
    (``keep_last``) deletes only checkpoints of its own lineage."""
    mesh: dict[str, int] | None = None
    """Mesh axes of the run that wrote it (``pp``, ``dp_replicate``, ``dp``, ``tp``), when it split
    layers or replicated shard groups (format 5); None: every rank on ``dp``."""
    trained: dict[str, Any] | None = None
    """When ``paratrain ckpt reshard`` rewrote the tensors for this layout (format 6): the
    layout of the run that trained them (``strategy``, ``world_size``, ``mesh``), to which the
    per-rank state (random generators, stream positions, per-rank objects) and the global batch
    belong. None: the run that wrote the checkpoint trained it."""
    models: list[str] = field(default_factory=lambda: ["model"])
    """Names of the models it holds, in ``run.setup`` order."""
    files: dict[str, FileRecord] = field(default_factory=dict)
    """Every file of the checkpoint (relative path) with its checksum."""

    @property
    def global_batch(self) -> int | None:
        """Samples per optimizer step over all ranks."""
        if self.per_rank_batch is None:
            return None
        return self.per_rank_batch * self.data_size * self.grad_accum

    @property
    def data_size(self) -> int:
        """Ranks that read different data (the world size without the pp and tp axes) in the
        run that trained it."""
        world, mesh = self.trained_at
        if not mesh:
            return world
        return world // (mesh.get("tp", 1) * mesh.get("pp", 1))

    @property
    def trained_at(self) -> tuple[int, dict[str, int] | None]:
        """(world size, mesh) of the run whose ranks' state it holds: the run that wrote it,
        or the one it was resharded from (``trained``)."""
        if self.trained is None:
            return self.world_size, self.mesh
        return int(self.trained["world_size"]), self.trained.get("mesh")

    def to_json(self) -> str:
        """The manifest as JSON text (a file record's unused checksum kinds left out)."""
        # Field by field, not dataclasses.asdict: that deep-copies every block checksum (32768
        # per GiB of a sharded checkpoint), enough garbage to start a full collection mid-save.
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        for newer in ("mesh", "trained"):  # left out when unused: older paratrain reads it
            if data[newer] is None:
                del data[newer]
        packed = self.format_version >= 7
        data["files"] = {
            name: {
                f.name: pack_digests(value) if f.name == "blocks" and packed else value
                for f in fields(record)
                if (value := getattr(record, f.name)) is not None
            }
            for name, record in self.files.items()
        }
        return json.dumps({**data, "global_batch": self.global_batch}, indent=1)

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        """Load ``folder/manifest.json``."""
        path = folder / MANIFEST
        if not path.is_file():
            raise CheckpointError(
                f"{folder} has no {MANIFEST}: it is not a committed paratrain checkpoint (an "
                "interrupted save leaves such a folder). Use an older checkpoint, or "
                "`paratrain ckpt inspect` to see what it is."
            )
        try:
            text = path.read_bytes()
            try:
                recorded: bytes | None = (folder / MANIFEST_CHECKSUM).read_bytes()
            except FileNotFoundError:
                recorded = None
        except OSError as err:
            raise CheckpointError(f"{path} is corrupt ({err}). Use another checkpoint.") from None
        return cls.parse(text, recorded, where=str(path), folder=str(folder))

    @classmethod
    def parse(cls, text: bytes, recorded: bytes | None, *, where: str, folder: str) -> Manifest:
        """The manifest in ``text`` (the bytes of ``manifest.json``), checked against
        ``recorded`` (the bytes of ``manifest.xxh3``; None: a save that predates it). ``where``
        and ``folder`` name the file and its checkpoint in errors."""
        try:
            if recorded is not None and recorded != manifest_checksum(text):
                raise ValueError(f"it does not match its checksum in {MANIFEST_CHECKSUM}")
            raw = json.loads(text)
            if not isinstance(raw, dict):
                raise TypeError(f"it holds a JSON {type(raw).__name__}, not an object")
            raw.pop("global_batch", None)
            files = raw.get("files", {})
            if not isinstance(files, dict):
                raise TypeError("'files' is not an object")
            if raw.get("format_version", 0) >= 7:
                for record in files.values():
                    if isinstance(record, dict) and "blocks" in record:
                        record["blocks"] = unpack_digests(record["blocks"])
            raw["files"] = {k: FileRecord(**v) for k, v in files.items()}
            manifest = cls(**raw)
            _check_types(manifest)
        except RecursionError:
            raise CheckpointError(
                f"{where} is corrupt (nested too deeply to be a manifest). Use another checkpoint."
            ) from None
        except (ValueError, TypeError) as err:
            raise CheckpointError(f"{where} is corrupt ({err}). Use another checkpoint.") from None
        if manifest.format_version > FORMAT_VERSION:
            raise CheckpointError(
                f"{folder} uses checkpoint format {manifest.format_version}, newer than this "
                f"paratrain reads ({FORMAT_VERSION}). Upgrade paratrain."
            )
        return manifest

    def verify(self, folder: Path) -> list[str]:
        """Problems found (missing, resized or corrupted files); empty when intact."""
        problems = []
        for name, record in self.files.items():
            problem = record.problem(folder / name)
            if problem:
                problems.append(problem.replace((folder / name).name, name, 1))
        return problems


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "format_version": (int,),
    "paratrain_version": (str,),
    "torch_version": (str,),
    "layout": (str,),
    "strategy": (str,),
    "world_size": (int,),
    "per_rank_batch": (int, type(None)),
    "grad_accum": (int,),
    "epoch": (int,),
    "step": (int,),
    "samples_in_epoch": (int,),
    "created": (int, float),
}


def pack_digests(digests: list[int]) -> str:
    """64-bit checksums as text: base64 of their little-endian bytes (11 characters each, half
    of a JSON list of numbers)."""
    return base64.b64encode(struct.pack(f"<{len(digests)}Q", *digests)).decode("ascii")


def unpack_digests(text: object) -> list[int]:
    """The checksums :func:`pack_digests` wrote (ValueError/TypeError when ``text`` is not)."""
    if not isinstance(text, str):
        raise TypeError(f"packed blocks are a {type(text).__name__}, not text")
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    if len(raw) % 8:
        raise ValueError(f"packed blocks hold {len(raw)} bytes, not 8 per checksum")
    return list(struct.unpack(f"<{len(raw) // 8}Q", raw))


def manifest_checksum(text: bytes) -> bytes:
    """The content of ``manifest.xxh3`` for a manifest's bytes."""
    return f"{xxhash.xxh3_64_intdigest(text):016x}\n".encode()


def _check_types(manifest: Manifest) -> None:
    """Raise TypeError/ValueError for a field of the wrong type or a file outside the folder."""
    for name, types in _FIELD_TYPES.items():
        value = getattr(manifest, name)
        if isinstance(value, bool) or not isinstance(value, types):
            raise TypeError(f"{name} is {value!r}, not {' or '.join(t.__name__ for t in types)}")
    mesh = manifest.mesh
    if mesh is not None and not (
        isinstance(mesh, dict)
        and all(isinstance(k, str) and type(v) is int and v >= 1 for k, v in mesh.items())
        and math.prod(mesh.values()) == manifest.world_size
    ):
        raise ValueError(f"mesh {mesh!r} is not axis sizes whose product is the world size")
    trained = manifest.trained
    if trained is not None and not (
        isinstance(trained, dict)
        and isinstance(trained.get("strategy"), str)
        and type(trained.get("world_size")) is int
        and trained["world_size"] >= 1
        and (trained.get("mesh") is None or isinstance(trained["mesh"], dict))
    ):
        raise ValueError(f"trained {trained!r} is not a layout (strategy, world_size, mesh)")
    for name, record in manifest.files.items():
        parts = PurePosixPath(name).parts
        if not parts or name.startswith("/") or ".." in parts or "\0" in name:
            raise ValueError(f"it lists {name!r}, which is not a file inside the checkpoint")
        for key in ("xxh3_64", "crc32", "bytes", "block_bytes"):
            value = getattr(record, key)
            if value is None and key != "bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TypeError(f"{key} of {name} is {value!r}, not a whole number")
        kinds = [k for k in ("xxh3_64", "crc32", "blocks") if getattr(record, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"{name} needs exactly one checksum (xxh3_64, crc32 or blocks)")
        if record.blocks is not None:
            _check_blocks(name, record)


def _check_blocks(name: str, record: FileRecord) -> None:
    blocks, size = record.blocks, record.block_bytes
    if not isinstance(blocks, list) or not all(type(b) is int and 0 <= b < 2**64 for b in blocks):
        raise TypeError(f"blocks of {name} is not a list of 64-bit checksums")
    if not size:
        raise ValueError(f"{name} lists blocks without a positive block_bytes")
    if len(blocks) != -(-record.bytes // size):
        raise ValueError(
            f"{name} lists {len(blocks)} block checksums for {record.bytes} bytes "
            f"in blocks of {size}"
        )
