"""Quick measurements (about 2 s on a laptop CPU): matmul, host->device copies, all-reduce.

results = measure_all(facts)      # [{"name", "value", "unit", "expected", "status"}, ...]

``status`` is OK or WARN against the expectation, FAIL when the measurement could not run (with
a ``detail``), INFO when there is nothing to judge against (an unknown GPU).
"""

from __future__ import annotations

import os
import time
from typing import Any

from paratrain.commands.doctor.peaks import bf16_peak

GLOO_MIN_GBS = 0.5  # loopback gloo below this points at a misconfigured or overloaded host
PCIE_MIN_GBS = 10.0  # pinned host->device copies on PCIe 3 x16 or better
MATMUL_PEAK_FRACTION = 0.5  # a large bf16 matmul reaches 60-80% of the datasheet peak


def _result(name: str, value: float, unit: str, expected: str, ok: bool) -> dict[str, Any]:
    return {
        "name": name,
        "value": round(value, 2),
        "unit": unit,
        "expected": expected,
        "status": "OK" if ok else "WARN",
    }


def matmul_flops(device: str, dtype: Any = None, *, seconds: float = 0.3) -> float:
    """FLOP/s of a large square matmul on ``device`` (fp32 on CPU, bf16 on GPU by default):
    the measured peak that ``paratrain bench`` reports model FLOP utilisation against.

    matmul_flops("cuda", torch.float16) / 1e12     # TFLOP/s of this GPU's fp16 matmul
    """
    import torch

    if dtype is None:
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
    n = 1024 if device == "cpu" else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    a @ a  # the first call picks kernels and allocates
    _sync(device)
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ a
        _sync(device)
        reps += 1
    return 2 * n**3 * reps / (time.perf_counter() - start)


def matmul(device: str) -> dict[str, Any]:
    """Dense matmul throughput: fp32 on CPU, bf16 on GPU (judged against the GPU's peak)."""
    flops = matmul_flops(device)
    if device == "cpu":
        return _result(
            "matmul fp32 (cpu)",
            flops / 1e9,
            "GFLOP/s",
            "> 1 GFLOP/s per core",
            flops / 1e9 > (os.cpu_count() or 1),
        )
    import torch

    return gpu_matmul_verdict(torch.cuda.get_device_properties(0), flops / 1e12)


def _sync(device: str) -> None:
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


def gpu_matmul_verdict(props: Any, tflops: float) -> dict[str, Any]:
    """Judge a bf16 matmul rate against the datasheet peak of the GPU ``props`` describes.

    ``props`` is what ``torch.cuda.get_device_properties`` returns (``name``, ``major``,
    ``minor``). An unknown GPU gets the measurement without a verdict (status ``INFO``).
    """
    name = "matmul bf16 (cuda:0)"
    peak = bf16_peak(props.name, (props.major, props.minor))
    if peak is None:
        return {
            "name": name,
            "value": round(tflops, 2),
            "unit": "TFLOP/s",
            "expected": f"unknown GPU {props.name!r} (cc {props.major}.{props.minor}): no verdict",
            "status": "INFO",
        }
    need = MATMUL_PEAK_FRACTION * peak.tflops
    return _result(
        name,
        tflops,
        "TFLOP/s",
        f">= {need:.0f} TFLOP/s ({MATMUL_PEAK_FRACTION:.0%} of the {peak.name}'s "
        f"{peak.tflops:.0f} TFLOP/s peak)",
        tflops >= need,
    )


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


def _allreduce_bandwidth(backend: str) -> float | None:
    """One rank of the measurement (the spawner built the group); rank 0 returns bytes/s."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    t = torch.ones(8 * 2**20, device=device)  # 32 MiB of fp32
    dist.all_reduce(t)
    if backend == "nccl":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        dist.all_reduce(t)
    if backend == "nccl":
        torch.cuda.synchronize()
    return 5 * t.numel() * 4 / (time.perf_counter() - start) if rank == 0 else None


def allreduce(backend: str) -> dict[str, Any]:
    """All-reduce bus bandwidth over 2 local ranks (busbw = 2(n-1)/n x bytes / time)."""
    from paratrain.distributed.ranks import FileGroup, RankFailedError, spawn_ranks

    name = f"all-reduce {backend}, 2 ranks"
    try:
        # fork starts in ~0.1 s (CPU only); CUDA cannot be used in a forked child.
        values = spawn_ranks(
            _allreduce_bandwidth,
            2,
            (backend,),
            start_method="spawn" if backend == "nccl" else "fork",
            group=FileGroup(backend=backend, timeout_s=30),
            timeout_s=60,
            threads=1,
            results="main",
        )
    except RankFailedError as err:
        last = str(err).strip().splitlines()[-1]
        return {
            "name": name,
            "value": None,
            "unit": "GB/s",
            "expected": "",
            "status": "FAIL",
            "detail": f"rank {err.rank}: {last}",
        }
    busbw = values[0] / 1e9  # 2(n-1)/n == 1 for n = 2
    expected = GLOO_MIN_GBS if backend == "gloo" else PCIE_MIN_GBS
    return _result(name, busbw, "GB/s", f">= {expected} GB/s", busbw >= expected)


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
