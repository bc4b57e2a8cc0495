"""Quick measurements (about 2 s on a laptop CPU): matmul, host->device copies, all-reduce.

results = measure_all(facts)      # [{"name", "value", "unit", "expected", "status"}, ...]
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import tempfile
import time
from typing import Any

GLOO_MIN_GBS = 0.5  # loopback gloo below this points at a misconfigured or overloaded host
PCIE_MIN_GBS = 10.0  # pinned host->device copies on PCIe 3 x16 or better


def _result(name: str, value: float, unit: str, expected: str, ok: bool) -> dict[str, Any]:
    return {
        "name": name,
        "value": round(value, 2),
        "unit": unit,
        "expected": expected,
        "status": "OK" if ok else "WARN",
    }


def matmul(device: str) -> dict[str, Any]:
    """Dense matmul throughput: fp32 on CPU, bf16 on GPU."""
    import torch

    n, dtype = (1024, torch.float32) if device == "cpu" else (8192, torch.bfloat16)
    a = torch.randn(n, n, device=device, dtype=dtype)
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.3:
        a @ a
        reps += 1
    if device != "cpu":
        torch.cuda.synchronize()
    flops = 2 * n**3 * reps / (time.perf_counter() - start)
    if device == "cpu":
        return _result(
            "matmul fp32 (cpu)",
            flops / 1e9,
            "GFLOP/s",
            "> 1 GFLOP/s per core",
            flops / 1e9 > (os.cpu_count() or 1),
        )
    return _result("matmul bf16 (cuda:0)", flops / 1e12, "TFLOP/s", "> 50% of the GPU's peak", True)


def host_to_device() -> list[dict[str, Any]]:
    """Pageable vs pinned copies to cuda:0."""
    import torch

    out = []
    for pinned in (False, True):
        src = torch.empty(64 * 2**20, dtype=torch.uint8, pin_memory=pinned)
        dst = torch.empty_like(src, device="cuda")
        dst.copy_(src, non_blocking=pinned)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(5):
            dst.copy_(src, non_blocking=pinned)
        torch.cuda.synchronize()
        gbs = 5 * src.numel() / (time.perf_counter() - start) / 1e9
        name = "host->device, pinned" if pinned else "host->device, pageable"
        out.append(
            _result(
                name,
                gbs,
                "GB/s",
                f">= {PCIE_MIN_GBS} GB/s pinned",
                gbs >= PCIE_MIN_GBS or not pinned,
            )
        )
    return out


def _allreduce_rank(rank: int, init: str, backend: str, out: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    dist.init_process_group(
        backend,
        init_method=f"file://{init}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=30),
    )
    t = torch.ones(8 * 2**20, device=device)  # 32 MiB of fp32
    dist.all_reduce(t)
    if backend == "nccl":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        dist.all_reduce(t)
    if backend == "nccl":
        torch.cuda.synchronize()
    if rank == 0:
        out.put(5 * t.numel() * 4 / (time.perf_counter() - start))
    dist.destroy_process_group()


def allreduce(backend: str) -> dict[str, Any]:
    """All-reduce bus bandwidth over 2 local ranks (busbw = 2(n-1)/n x bytes / time)."""
    # fork starts in ~0.1 s (CPU only); CUDA cannot be used in a forked child.
    ctx: Any = mp.get_context("spawn" if backend == "nccl" else "fork")
    out = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        procs = [
            ctx.Process(target=_allreduce_rank, args=(r, init, backend, out)) for r in range(2)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
    if out.empty():
        return {
            "name": f"all-reduce {backend}, 2 ranks",
            "value": None,
            "unit": "GB/s",
            "expected": "",
            "status": "FAIL",
        }
    busbw = out.get() / 1e9  # 2(n-1)/n == 1 for n = 2
    expected = GLOO_MIN_GBS if backend == "gloo" else PCIE_MIN_GBS
    return _result(
        f"all-reduce {backend}, 2 ranks", busbw, "GB/s", f">= {expected} GB/s", busbw >= expected
    )


def measure_all(facts: dict[str, Any]) -> list[dict[str, Any]]:
    """The measurements that apply to this machine (none when torch is broken)."""
    t = facts["torch"]
    if "error" in t:
        return []
    gpus = len(t.get("gpus", []))
    results = [matmul("cpu")]
    if gpus:
        results += [matmul("cuda"), *host_to_device()]
    results.append(allreduce("nccl" if gpus >= 2 else "gloo"))
    return results
