"""Where this process sits in the job: rank, local rank, world size, and the rendezvous address.

Read from torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT),
from Slurm's (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE, SLURM_JOB_NODELIST),
or, with neither, a single process. A launcher that sets only RANK, WORLD_SIZE and MASTER_* (a
Kubeflow PyTorchJob without torchrun) must also set LOCAL_RANK or LOCAL_WORLD_SIZE unless all
ranks meet on a loopback MASTER_ADDR (one machine); otherwise the local rank is unknown::

    topo = Topology.from_env()
    topo.rank, topo.world_size, topo.source    # 0, 1, "none" for `python train.py`

The GPU of a rank is chosen by its **local** rank: rank 9 on 8-GPU machines uses cuda:1, not cuda:9.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from paratrain.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class Topology:
    """The process layout of a job, as seen from one process."""

    rank: int
    """Index of this process in the job (0 is the main process)."""
    local_rank: int
    """Index of this process on its machine; selects the GPU."""
    world_size: int
    """Number of processes in the job."""
    local_world_size: int
    """Number of processes on this machine."""
    master_addr: str
    """Host of rank 0, used for the rendezvous."""
    master_port: int
    """Port of the rendezvous store on ``master_addr``."""
    source: str
    """Where the values came from: ``"torchrun"``, ``"slurm"`` or ``"none"``."""

    @property
    def is_main(self) -> bool:
        """True on rank 0, the process that prints and writes shared files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when the job has more than one process."""
        return self.world_size > 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Topology:
        """Build the topology from ``env`` (default ``os.environ``); torchrun wins over Slurm."""
        env = os.environ if env is None else env
        if "RANK" in env and "WORLD_SIZE" in env:
            return _from_torchrun(env)
        if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
            return _from_slurm(env)
        return cls(
            rank=0,
            local_rank=0,
            world_size=1,
            local_world_size=1,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=env_int(env, "MASTER_PORT", 29500),
            source="none",
        )

    @classmethod
    def from_env_or_group(cls) -> Topology:
        """:meth:`from_env`; without launcher variables, the layout of a process group the
        caller already built (a notebook, a test harness)."""
        topo = cls.from_env()
        import torch.distributed as dist

        if topo.source != "none" or not (dist.is_available() and dist.is_initialized()):
            return topo
        rank, world = dist.get_rank(), dist.get_world_size()
        return cls(
            rank=rank,
            local_rank=rank,
            world_size=world,
            local_world_size=world,
            master_addr=topo.master_addr,
            master_port=topo.master_port,
            source="process group",
        )


def env_int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    """The whole number in ``env[key]`` (Slurm's "4(x2)" form too), else ``default``."""
    raw = env.get(key)
    if raw is None:
        if default is None:
            raise ConfigError(
                f"{key} is not set. Launch with `paratrain run` or torchrun, which set it."
            )
        return default
    try:
        return int(raw.split("(")[0])
    except ValueError:
        raise ConfigError(
            f"{key}={raw!r} is not an integer. Unset it or launch with `paratrain run`/torchrun, "
            "which set it correctly."
        ) from None


def _from_torchrun(env: Mapping[str, str]) -> Topology:
    rank, world = env_int(env, "RANK"), env_int(env, "WORLD_SIZE")
    master = env.get("MASTER_ADDR", "127.0.0.1")
    local_rank, local_world = _local(env, rank, world, master)
    topo = Topology(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        master_addr=master,
        master_port=env_int(env, "MASTER_PORT", 29500),
        source="torchrun",
    )
    _check(topo)
    return topo


def _local(env: Mapping[str, str], rank: int, world: int, master: str) -> tuple[int, int]:
    """(local rank, local world size), also for launchers that set only RANK and WORLD_SIZE.

    LOCAL_RANK wins; else LOCAL_WORLD_SIZE gives ``rank % local world``. Without either, the
    layout is known only for one process or a group that meets on loopback (one machine);
    anything else (a Kubeflow PyTorchJob without torchrun, a hand-rolled launcher on several
    machines) would put ranks on the wrong GPU, so it is an error that names the fix.
    """
    single_node = world == 1 or _is_loopback(master)
    if "LOCAL_RANK" in env:
        local_rank = env_int(env, "LOCAL_RANK")
        # Without LOCAL_WORLD_SIZE on several machines: at least this many ranks share it.
        fallback = world if single_node else local_rank + 1
        return local_rank, env_int(env, "LOCAL_WORLD_SIZE", fallback)
    if "LOCAL_WORLD_SIZE" in env:
        local_world = env_int(env, "LOCAL_WORLD_SIZE")
        if local_world < 1:
            raise ConfigError(f"LOCAL_WORLD_SIZE={local_world} must be >= 1. Unset or fix it.")
        return rank % local_world, local_world
    if single_node:
        return rank, world
    raise ConfigError(
        f"RANK and WORLD_SIZE are set (rank {rank} of {world}) but LOCAL_RANK and "
        f"LOCAL_WORLD_SIZE are not, and MASTER_ADDR={master!r} is not a loopback address, so "
        "the ranks may span several machines and this process's local rank (its GPU) is "
        "unknown. Set LOCAL_RANK and LOCAL_WORLD_SIZE in the launcher (LOCAL_RANK=0 "
        "LOCAL_WORLD_SIZE=1 for one process per machine, as in a Kubeflow PyTorchJob without "
        "torchrun), or launch with torchrun or `paratrain run`, which set them."
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def slurm_rendezvous_port(env: Mapping[str, str]) -> int:
    """The rendezvous port of a Slurm job: one per job id, so two jobs on a node do not collide.

    >>> slurm_rendezvous_port({"SLURM_JOB_ID": "123456"})
    23456
    """
    return 20000 + env_int(env, "SLURM_JOB_ID", 9500) % 10000


def _from_slurm(env: Mapping[str, str]) -> Topology:
    world = env_int(env, "SLURM_NTASKS")
    nodes = env_int(env, "SLURM_NNODES", 1)
    # SLURM_NTASKS_PER_NODE looks like "4" or "4(x2)"; _int keeps the part before "(".
    per_node = env_int(env, "SLURM_NTASKS_PER_NODE", max(1, world // max(nodes, 1)))
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
    topo = Topology(
        rank=env_int(env, "SLURM_PROCID"),
        local_rank=env_int(env, "SLURM_LOCALID", 0),
        world_size=world,
        local_world_size=per_node,
        master_addr=env.get("MASTER_ADDR") or first_host(nodelist),
        master_port=env_int(env, "MASTER_PORT", slurm_rendezvous_port(env)),
        source="slurm",
    )
    _check(topo)
    return topo


def _check(topo: Topology) -> None:
    if not 0 <= topo.rank < topo.world_size:
        raise ConfigError(
            f"rank {topo.rank} is outside world size {topo.world_size} ({topo.source} variables). "
            "Launch with `paratrain run` or torchrun instead of setting RANK/WORLD_SIZE by hand."
        )
    if not 0 <= topo.local_rank < max(topo.local_world_size, 1):
        raise ConfigError(
            f"local rank {topo.local_rank} is outside local world size {topo.local_world_size} "
            f"({topo.source} variables). Check LOCAL_RANK/LOCAL_WORLD_SIZE or SLURM_LOCALID."
        )


def first_host(nodelist: str) -> str:
    """First host of a Slurm node list: ``"gpu[03-05,9],cpu1"`` -> ``"gpu03"``.

    >>> first_host("node[007-009]")
    'node007'
    """
    head = re.split(r",(?![^\[]*\])", nodelist.strip())[0]
    match = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", head)
    if match is None:
        return head
    prefix, ranges, suffix = match.groups()
    first = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{first}{suffix}"
