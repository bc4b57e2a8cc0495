"""Create and tear down the default process group, with a timeout on every collective.

    created = init_process_group(topology, backend="gloo", timeout_s=600)
    ...
    destroy_process_group(created)

An already initialised group (the user or a test harness made it) is adopted, not replaced, and
left for its owner to destroy. A one-process job gets an in-memory store: no port is opened.
"""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from paratrain.distributed.topology import Topology
from paratrain.errors import ConfigError, EnvironmentMismatchError


def init_process_group(
    topology: Topology, *, backend: str, timeout_s: float, trace_dir: str | None = None
) -> bool:
    """Join the job's process group; return True when this call created it.

    With nccl, the flight recorder is switched on (unless configured already): a collective
    that times out leaves a trace of the last collectives per rank in ``trace_dir``.
    """
    if backend == "nccl" and trace_dir is not None:
        os.makedirs(trace_dir, exist_ok=True)
        os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
        os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        os.environ.setdefault(
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", os.path.join(trace_dir, "nccl_trace_rank_")
        )
    if not dist.is_available():
        raise EnvironmentMismatchError(
            "torch.distributed is not available in this torch build. Install a standard torch "
            "wheel (pip install torch) to train on several ranks."
        )
    if backend == "nccl" and not dist.is_nccl_available():
        raise EnvironmentMismatchError(
            "backend 'nccl' is not in this torch build. Use backend='gloo' or install a CUDA "
            "build of torch."
        )
    if dist.is_initialized():
        if dist.get_world_size() != topology.world_size and topology.source != "none":
            raise ConfigError(
                f"A process group of world size {dist.get_world_size()} already exists, but "
                f"{topology.source} says {topology.world_size}. Create the Run before calling "
                "dist.init_process_group yourself, or launch with matching sizes."
            )
        return False
    timeout = datetime.timedelta(seconds=timeout_s)
    if topology.world_size == 1 and topology.source == "none":
        dist.init_process_group(
            backend,
            store=dist.HashStore(),  # type: ignore[attr-defined]
            rank=0,
            world_size=1,
            timeout=timeout,
        )
        return True
    # env:// lets torchrun's agent-hosted store be reused; Slurm jobs get the variables set here.
    os.environ.setdefault("MASTER_ADDR", topology.master_addr)
    os.environ.setdefault("MASTER_PORT", str(topology.master_port))
    try:
        store = _restart_safe_store(topology, timeout)
        dist.init_process_group(
            backend,
            init_method=None if store is not None else "env://",
            store=store,
            rank=topology.rank,
            world_size=topology.world_size,
            timeout=timeout,
        )
    except (RuntimeError, ValueError) as err:
        raise EnvironmentMismatchError(
            f"Rank {topology.rank} could not join the process group at "
            f"{topology.master_addr}:{topology.master_port} within {timeout_s:.0f}s: {err}. Check "
            "that every rank was started with the same MASTER_ADDR/MASTER_PORT and that the port "
            "is free; `paratrain run` sets them for you."
        ) from err
    return True


def _restart_safe_store(topology: Topology, timeout: datetime.timedelta) -> Any:
    """Under torchrun, the agent's store with a prefix per restart attempt.

    Without the prefix, restarted workers can read the addresses that the previous attempt's
    (dead) ranks published, and gloo then fails with "Connection refused" in connectFullMesh.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    agent = dist.TCPStore(  # type: ignore[attr-defined]
        topology.master_addr,
        topology.master_port,
        world_size=topology.world_size,
        is_master=False,
        timeout=timeout,
    )
    return dist.PrefixStore(  # type: ignore[attr-defined]
        f"paratrain/attempt_{attempt}", agent
    )


def destroy_process_group(created: bool) -> None:
    """Destroy the default group if this process created it; safe to call twice."""
    if created and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        # Shutting gloo down wakes its worker threads, which then free the last work they ran;
        # when that work held tensors created in Python they need the GIL. If this thread went
        # straight on to free a DDP reducer (whose process-group destructor joins those
        # threads while holding the GIL), both would wait forever. Yield the GIL briefly.
        time.sleep(0.05)


def dump_flight_recorder(directory: Path, rank: int) -> Path | None:
    """With nccl, write torch's flight-recorder trace of this rank (its last collectives and
    their state, a pickle read by ``python -m torch.distributed.flight_recorder.fr_trace``) to
    ``directory/nccl_trace_rank_<rank>``, as a timeout would; the path, or None without nccl or
    where this torch has no recorder."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_backend() != "nccl":
        return None
    import torch._C._distributed_c10d as c10d

    dump = getattr(c10d, "_dump_nccl_trace", None)
    if dump is None:
        return None
    path = directory / f"nccl_trace_rank_{rank}"
    path.write_bytes(dump())
    return path
