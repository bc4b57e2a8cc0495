"""The device mesh of a run: named axes, their sizes, and what each rank's coordinates mean.

    shape = MeshShape.resolve({"dp": -1, "tp": 2}, world_size=8)   # dp 4 x tp 2
    shape.sizes                     # {"pp": 1, "dp_replicate": 1, "dp": 4, "tp": 2}
    shape.data_rank(rank=5)         # 2: ranks 4 and 5 hold the same batch (one tp group)
    mesh = shape.build("cuda")      # a DeviceMesh with all four axes (size-1 ones too)

Axes, outermost first (the order torchtitan uses, so ``tp`` groups are neighbouring ranks, on one
machine when it has at least ``tp`` GPUs):

- ``pp``: pipeline parallel, each rank along it holds different layers (stages) and every rank
  of a pipeline sees the same batch;
- ``dp_replicate``: data parallel, a full copy of the (dp-sharded) state per group — with ``dp``
  this is HSDP (replicate across groups, shard within);
- ``dp``: data parallel, state sharded with FSDP2 (``fully_shard``);
- ``tp``: tensor parallel (DTensor ``parallelize_module``), every rank of a group sees the
  same batch.

``-1`` for one axis means "whatever the world size leaves". Every mistake is a
:class:`~paratrain.errors.ConfigError` that shows the arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from paratrain.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

AXES = ("pp", "dp_replicate", "dp", "tp")
"""Every axis name, outermost first."""
DATA_AXES = ("dp_replicate", "dp")
"""Axes over which ranks see different data."""


def check_mesh_setting(name: str, value: object) -> None:
    """The config-time check: a dict of known axis names to sizes (``-1`` at most once)."""
    if value is None:
        return
    example = f"{name}={{'dp': 2, 'tp': 2}}"
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(
            f"{name} must be None or a dict of axis name to size, e.g. {example}; got {value!r}."
        )
    for axis, size in value.items():
        if axis not in AXES:
            raise ConfigError(
                f"{name} has an unknown axis {axis!r}. Axes: {', '.join(AXES)} (pp pipelines "
                "stages, dp shards with FSDP, dp_replicate replicates, tp splits layers), e.g. "
                f"{example}."
            )
        if isinstance(size, bool) or not isinstance(size, int) or not (size >= 1 or size == -1):
            raise ConfigError(
                f"{name}[{axis!r}] must be a whole number >= 1, or -1 for 'what the world size "
                f"leaves'; got {size!r}."
            )
    if sum(1 for size in value.values() if size == -1) > 1:
        raise ConfigError(
            f"{name}={dict(value)!r} has more than one -1; only one axis can take what the "
            "world size leaves. Give the other sizes."
        )


@dataclass(frozen=True)
class MeshShape:
    """The size of every axis (1 for an axis not asked for), checked against the world size."""

    sizes: dict[str, int]

    @classmethod
    def resolve(cls, mesh: Mapping[str, int] | None, world_size: int) -> MeshShape:
        """The shape of ``mesh`` on ``world_size`` ranks (None: every rank on ``dp``)."""
        asked = dict(mesh) if mesh else {"dp": world_size}
        check_mesh_setting("mesh", asked)
        known = math.prod(size for size in asked.values() if size != -1)
        free = [axis for axis, size in asked.items() if size == -1]
        arithmetic = " x ".join(f"{axis} {size}" for axis, size in asked.items() if size != -1)
        if free:
            if world_size % known:
                raise ConfigError(
                    f"mesh={asked!r}: {arithmetic or '1'} = {known} does not divide world size "
                    f"{world_size}, so {free[0]!r} cannot be -1. Launch a multiple of {known} "
                    f"ranks, or choose sizes whose product divides {world_size}."
                )
            asked[free[0]] = world_size // known
        elif known != world_size:
            raise ConfigError(
                f"mesh={asked!r}: {arithmetic} = {known} ranks, but the world size is "
                f"{world_size}. The sizes must multiply to the number of ranks launched: "
                f"launch {known} ranks (paratrain run --nproc {known}), or set one axis to -1 "
                "to take what the world size leaves."
            )
        return cls({axis: asked.get(axis, 1) for axis in AXES})

    @property
    def world_size(self) -> int:
        return math.prod(self.sizes.values())

    @property
    def data_size(self) -> int:
        """Ranks that see different data: dp_replicate x dp."""
        return math.prod(self.sizes[a] for a in DATA_AXES)

    @property
    def copies(self) -> int:
        """Ranks that read each share of the data: one pipeline x one tp group."""
        return self.sizes["pp"] * self.sizes["tp"]

    def data_rank(self, rank: int) -> int:
        """Which share of the data ``rank`` reads (the ranks of one pipeline and of one ``tp``
        group read the same)."""
        return (rank % (self.data_size * self.sizes["tp"])) // self.sizes["tp"]

    def axes(self) -> dict[str, int]:
        """The axes larger than 1 (every axis if all are 1), outermost first."""
        used = {axis: size for axis, size in self.sizes.items() if size > 1}
        return used or {"dp": 1}

    def describe(self) -> str:
        """``dp_replicate 2 x dp 2 x tp 2``: the axes larger than 1."""
        return " x ".join(f"{axis} {size}" for axis, size in self.axes().items())

    def recorded(self) -> dict[str, int]:
        """The sizes a checkpoint records (``pp`` only when it is used: older checkpoints
        record three axes, and a size-1 ``pp`` must compare equal to them)."""
        return {axis: size for axis, size in self.sizes.items() if axis != "pp" or size > 1}

    def build(self, device_type: str) -> DeviceMesh:
        """The DeviceMesh over all ranks with every axis, size-1 ones included, so that
        ``mesh["pp"]``, ``mesh["tp"]`` and ``mesh["dp_replicate", "dp"]`` always exist
        (collective)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, tuple(self.sizes.values()), mesh_dim_names=AXES)

    def data_submesh(self, mesh: DeviceMesh) -> DeviceMesh | None:
        """The part of ``mesh`` FSDP shards over: ``dp``, or ``(dp_replicate, dp)`` for HSDP
        (replicate-only: shards of one rank, which is replication). None for pp/tp alone."""
        if self.data_size == 1:
            return None
        if self.sizes["dp_replicate"] > 1:
            return mesh["dp_replicate", "dp"]
        return mesh["dp"]
