"""Facts about the machine, gathered without trusting torch to import.

    facts = gather()          # a plain dict: python, torch, gpus, cpu, memory, shm, env, ...

``torch`` is imported inside :func:`torch_facts` and any failure is recorded, so a broken install
is reported instead of crashing the report.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any

ENV_PREFIXES = (
    "NCCL_",
    "TORCH_NCCL_",
    "MASTER_",
    "OMP_",
    "CUDA_",
    "SLURM_",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "GLOO_",
    "TORCHELASTIC_",
)


def gather() -> dict[str, Any]:
    """Everything the checks and the report need."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_cores": os.cpu_count() or 1,
        "memory_gb": _meminfo_gb(),
        "shm_gb": shm_size_gb(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "nvidia_smi": nvidia_smi(),
        "torch": torch_facts(),
    }


def _meminfo_gb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def shm_size_gb(path: str = "/dev/shm") -> float | None:
    """Size of the shared-memory filesystem DataLoader workers pass batches through."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize / 2**30


def nvidia_smi() -> dict[str, Any] | None:
    """What the driver sees (independent of torch), or None without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    query = "--query-gpu=index,name,driver_version,memory.total"
    try:
        out = subprocess.run(
            [exe, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"error": str(err), "gpus": []}
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip()[:300], "gpus": []}
    gpus = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4:
            gpus.append(
                {"index": parts[0], "name": parts[1], "driver": parts[2], "memory_mb": parts[3]}
            )
    return {"gpus": gpus, "driver": gpus[0]["driver"] if gpus else None}


def torch_facts() -> dict[str, Any]:
    """torch version and build, CUDA devices, backends; ``{"error": ...}`` when it is broken."""
    try:
        import torch
        import torch.distributed as dist
    except Exception as err:  # a broken install can raise anything at import
        return {"error": f"{type(err).__name__}: {err}"}
    facts: dict[str, Any] = {
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
        "cuda_available": False,
        "gpus": [],
        "backends": {
            "gloo": dist.is_available() and dist.is_gloo_available(),
            "nccl": dist.is_available() and dist.is_nccl_available(),
            "mpi": dist.is_available() and dist.is_mpi_available(),
        },
    }
    try:
        facts["cuda_available"] = torch.cuda.is_available()
        if facts["cuda_available"]:
            facts["cudnn"] = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
            facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
            facts["gpus"] = [_gpu(i) for i in range(torch.cuda.device_count())]
            facts["p2p"] = [
                [
                    i == j or torch.cuda.can_device_access_peer(i, j)
                    for j in range(len(facts["gpus"]))
                ]
                for i in range(len(facts["gpus"]))
            ]
    except Exception as err:
        facts["cuda_error"] = f"{type(err).__name__}: {err}"
    return facts


def _gpu(index: int) -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(index)
    free, total = torch.cuda.mem_get_info(index)
    gpu: dict[str, Any] = {
        "index": index,
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_total_gb": total / 2**30,
        "memory_free_gb": free / 2**30,
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
        mem_clock = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        gpu["memory_bandwidth_gbs"] = 2 * mem_clock * 1e6 * bus_bits / 8 / 1e9
    except Exception:  # nvidia-ml-py missing or the query unsupported: leave it out
        pass
    return gpu
