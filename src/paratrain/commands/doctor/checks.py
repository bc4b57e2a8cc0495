"""Each check turns facts into OK / WARN / FAIL with a one-line fix.

results = run_checks(gather())
[c for c in results if c.status == "FAIL"]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from paratrain.distributed.ports import free_port, port_is_free

# Oldest Linux driver that runs each CUDA major version (CUDA minor-version compatibility).
MIN_DRIVER = {11: (450, 80), 12: (525, 60), 13: (580, 65)}
SHM_MIN_GB = 1.0


@dataclass(frozen=True)
class Check:
    """One verdict."""

    name: str
    status: str
    """``OK``, ``WARN`` or ``FAIL``."""
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        """JSON-ready form."""
        return asdict(self)


Facts = dict[str, Any]


def check_torch(f: Facts) -> Check:
    t = f["torch"]
    if "error" in t:
        return Check(
            "torch import", "FAIL", t["error"], "reinstall it: pip install --force-reinstall torch"
        )
    build = f"CUDA {t['cuda_build']}" if t["cuda_build"] else "CPU-only build"
    return Check("torch import", "OK", f"torch {t['version']} ({build})")


def check_cpu_build_with_driver(f: Facts) -> Check:
    t, smi = f["torch"], f["nvidia_smi"]
    if "error" in t or not smi or not smi.get("gpus"):
        return Check("torch build matches driver", "OK", "no NVIDIA driver, or torch broken")
    if t["cuda_build"] is None:
        return Check(
            "torch build matches driver",
            "FAIL",
            f"nvidia-smi sees {len(smi['gpus'])} GPU(s) but torch {t['version']} is a "
            "CPU-only build",
            "install a CUDA build: pip install torch (Linux wheels "
            "from PyPI include CUDA), not the +cpu wheel",
        )
    return Check("torch build matches driver", "OK", f"CUDA build {t['cuda_build']}")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isascii() and p.isdigit())


def check_driver_age(f: Facts) -> Check:
    t, smi = f["torch"], f["nvidia_smi"]
    if "error" in t or not t.get("cuda_build") or not smi or not smi.get("driver"):
        return Check("driver new enough", "OK", "not applicable")
    need = MIN_DRIVER.get(_version(t["cuda_build"])[0])
    have = _version(smi["driver"])
    if need and have < need:
        return Check(
            "driver new enough",
            "FAIL",
            f"driver {smi['driver']} is older than {need[0]}.{need[1]}, the minimum for "
            f"CUDA {t['cuda_build']}",
            "update the NVIDIA driver, or install a torch wheel built for an older CUDA",
        )
    return Check("driver new enough", "OK", f"driver {smi['driver']}")


def check_gpus_visible(f: Facts) -> Check:
    t, smi = f["torch"], f["nvidia_smi"]
    seen = len(smi["gpus"]) if smi else 0
    usable = len(t.get("gpus", [])) if "error" not in t else 0
    visible = f["env"].get("CUDA_VISIBLE_DEVICES")
    if seen and not usable and t.get("cuda_build"):
        hint = (
            f"CUDA_VISIBLE_DEVICES={visible!r} hides them; unset it or list valid indices"
            if visible is not None
            else "check that the container was started with --gpus all and that the driver "
            "matches (see above)"
        )
        return Check(
            "GPUs visible to torch",
            "FAIL",
            f"nvidia-smi sees {seen} GPU(s), torch sees none"
            + (f" ({t['cuda_error']})" if "cuda_error" in t else ""),
            hint,
        )
    if visible is not None and usable:
        return Check(
            "GPUs visible to torch",
            "OK",
            f"{usable} GPU(s); CUDA_VISIBLE_DEVICES={visible} maps cuda:0.. to physical {visible}",
        )
    return Check("GPUs visible to torch", "OK", f"{usable} GPU(s)")


def check_shm(f: Facts) -> Check:
    size = f["shm_gb"]
    if size is None:
        return Check("/dev/shm size", "WARN", "no /dev/shm", "DataLoader workers need it")
    if size < SHM_MIN_GB:
        return Check(
            "/dev/shm size",
            "WARN",
            f"{size * 1024:.0f} MiB: DataLoader workers fail with 'bus error' when "
            "batches outgrow it",
            "start the container with --shm-size=8g or --ipc=host (or num_workers=0)",
        )
    return Check("/dev/shm size", "OK", f"{size:.1f} GiB")


def _whole(text: str) -> int | None:
    """``text`` as a whole number of ASCII digits, else None ('²'.isdigit() is true)."""
    return int(text) if text.isascii() and text.isdigit() else None


def check_master_port(f: Facts) -> Check:
    port = f["env"].get("MASTER_PORT")
    if port is None or "RANK" in f["env"]:  # inside a launched job the port is meant to be taken
        return Check("MASTER_PORT free", "OK", "not set" if port is None else "in a job")
    addr = f["env"].get("MASTER_ADDR", "127.0.0.1")
    if _whole(port) is None or not port_is_free(addr, int(port)):
        return Check(
            "MASTER_PORT free",
            "FAIL",
            f"port {port} cannot be bound here",
            f"pick a free port, e.g. MASTER_PORT={free_port()}",
        )
    return Check("MASTER_PORT free", "OK", f"port {port} is free")


def check_nccl_env(f: Facts) -> Check:
    off = [
        k
        for k in ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_SHM_DISABLE")
        if f["env"].get(k) not in (None, "0")
    ]
    if off:
        return Check(
            "NCCL transports",
            "WARN",
            f"{', '.join(off)} set: slower collectives",
            "unset them unless they work around a known hardware fault",
        )
    return Check("NCCL transports", "OK", "no transport disabled")


def check_omp(f: Facts) -> Check:
    env = f["env"]
    local = env.get("LOCAL_WORLD_SIZE", "1") or "1"
    if _whole(local) is None:
        return Check(
            "LOCAL_WORLD_SIZE",
            "FAIL",
            f"LOCAL_WORLD_SIZE={local!r} is not a whole number",
            "unset it; torchrun and `paratrain run` set it for their ranks",
        )
    ranks = max(
        int(local),
        len(f["torch"].get("gpus", [])) if "error" not in f["torch"] else 1,
    )
    if ranks > 1 and "OMP_NUM_THREADS" not in env:
        return Check(
            "OMP_NUM_THREADS",
            "WARN",
            f"unset with {ranks} ranks per machine: each rank starts one thread per "
            "core and they fight",
            f"export OMP_NUM_THREADS={max(1, f['cpu_cores'] // ranks)}",
        )
    return Check("OMP_NUM_THREADS", "OK", env.get("OMP_NUM_THREADS", "unset (one rank)"))


def check_gloo(f: Facts) -> Check:
    t = f["torch"]
    if "error" in t:
        return Check("gloo backend", "FAIL", "torch does not import", "fix torch first")
    if not t["backends"]["gloo"]:
        return Check(
            "gloo backend",
            "FAIL",
            "torch.distributed has no gloo",
            "install a standard torch wheel; CPU ranks and control traffic need gloo",
        )
    return Check("gloo backend", "OK", ", ".join(k for k, v in t["backends"].items() if v))


CHECKS: tuple[Callable[[Facts], Check], ...] = (
    check_torch,
    check_cpu_build_with_driver,
    check_driver_age,
    check_gpus_visible,
    check_shm,
    check_master_port,
    check_nccl_env,
    check_omp,
    check_gloo,
)


def run_checks(facts: Facts) -> list[Check]:
    """Every check, in order."""
    return [check(facts) for check in CHECKS]
