"""One look at the machine and, given a run dir, at every rank of the job — as data.

snap = snapshot(Path("runs/exp"))
snap["ranks"]       # latest stats record per rank (step time, samples/s, data wait, memory)
snap["gpus"]        # utilisation, memory, power, temperature (nvidia-ml-py), or []
snap["gpu_note"]    # why "gpus" is empty (nvidia-ml-py missing: the pip command), or None
snap["processes"]   # CPU% and RSS of each rank's process (psutil), on any machine
snap["flags"]       # straggler, input-bound, memory imbalance, idle GPU — each with a hint
snap["notes"]       # stats files that cannot be read (a folder, a pipe), one line each
"""

from __future__ import annotations

import json
import math
import os
import stat
import statistics
import time
from pathlib import Path
from typing import Any

import psutil

from paratrain.core.run_dir import RunDir

STRAGGLER = 1.2  # a rank whose step time exceeds this multiple of the median
INPUT_BOUND = 0.30  # fraction of wall time spent waiting for batches
IMBALANCE = 1.25  # max / min peak memory across ranks or GPUs
IDLE_GPU = 10  # percent utilisation
TAIL_BYTES = 64 * 1024  # read of each stats file: its newest records, not a long run's history
HOST_SAMPLE_S = 0.1  # the shortest time over which the machine's CPU use is measured


FIELDS = {
    "rank": int,
    "pid": int,
    "step": int,
    "time": float,
    "step_time_s": float,
    "samples_per_s": float,
    "data_wait_fraction": float,
    "peak_memory_mb": float,
}
"""What a stats record may hold, and its type; anything else, or of another type, is left out."""


def latest_records(run_dir: Path, notes: list[str] | None = None) -> list[dict[str, Any]]:
    """The newest readable record of each ``stats/rank<r>.jsonl``, in rank order. A file that
    cannot be read (a folder, a pipe, no permission) is skipped with a line in ``notes``; a
    damaged line (being written right now, or not JSON) gives way to the one before it."""
    notes = [] if notes is None else notes
    records: dict[int, dict[str, Any]] = {}
    stats = RunDir(run_dir).stats
    try:
        paths = sorted(stats.glob("rank*.jsonl"))
    except OSError as err:  # the folder went away or changed while being listed
        notes.append(f"{printable(stats)} cannot be listed ({err.strerror or err})")
        paths = []
    for path in paths:
        try:
            lines = _tail(path)
        except OSError as err:
            notes.append(f"{printable(path)} cannot be read ({err.strerror or err})")
            continue
        for line in reversed(lines):
            record = _clean(line)
            if record is not None:
                records.setdefault(record["rank"], record)
                break
    return [records[rank] for rank in sorted(records)]


def _tail(path: Path) -> list[str]:
    """The lines in the last ``TAIL_BYTES`` of ``path``. Anything but a regular file is an
    OSError: a named pipe would block the monitor and a device (``/dev/zero``) never ends, so
    the file is opened without waiting and looked at before a byte is read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise OSError(f"it is {_kind(info.st_mode)}, not a regular file")
    with os.fdopen(fd, "rb") as file:
        start = max(0, info.st_size - TAIL_BYTES)
        file.seek(start)
        lines = file.read(TAIL_BYTES).split(b"\n")
    # A read that starts inside the file starts inside a line: that part is no record.
    return [line.decode(errors="replace") for line in lines[1 if start else 0 :]]


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file"


def printable(path: Path | str) -> str:
    """``path`` as text any terminal and JSON reader takes: bytes of a file name that are not
    UTF-8 become U+FFFD instead of surrogates, which fail when printed."""
    return os.fsencode(path).decode(errors="replace")


def _clean(line: str) -> dict[str, Any] | None:
    """The known fields of one JSON line with their types, or None without a rank."""
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    record: dict[str, Any] = {}
    for name, kind in FIELDS.items():
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if kind is int and (not isinstance(value, int) or value < 0):
            continue
        if kind is float and not math.isfinite(value):
            continue
        record[name] = kind(value)
    return record if "rank" in record else None


GPU_HINT = "no GPU stats: nvidia-ml-py is not installed (pip install 'paratrain[gpu]')"


def gpu_stats() -> tuple[list[dict[str, Any]], str | None]:
    """Per-GPU utilisation, memory, power and temperature, and a note when there are none.

    The note says why the list is empty: nvidia-ml-py is missing (with the command that
    installs it) or NVML cannot start (no NVIDIA driver). A machine with a driver but no GPU
    gets an empty list and no note.
    """
    try:
        import pynvml
    except ImportError:
        return [], GPU_HINT
    try:
        pynvml.nvmlInit()
    except Exception as err:  # no driver: NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return [], f"no GPU stats: NVML did not start ({err})"
    gpus = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        gpus.append(
            {
                "index": i,
                "name": pynvml.nvmlDeviceGetName(h),
                "utilization": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
                "memory_used_mb": mem.used / 2**20,
                "memory_total_mb": mem.total / 2**20,
                "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000,
                "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            }
        )
    return gpus, None


def rank_processes() -> dict[int, psutil.Process]:
    """Processes on this machine started by torchrun (or Slurm) for a job, by rank."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        rank = env.get("RANK") if "LOCAL_RANK" in env else env.get("SLURM_PROCID")
        if (
            rank is not None
            and rank.isascii()
            and rank.isdigit()
            and ("TORCHELASTIC_RUN_ID" in env or "SLURM_JOB_ID" in env)
        ):
            found[int(rank)] = proc
    return found


def process_stats(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """CPU% (over 0.2 s) and RSS of each rank's live process (from the stats, or discovered)."""
    procs: dict[int, psutil.Process] = {}
    for r in records:
        try:
            procs[r["rank"]] = psutil.Process(r["pid"])
        except (psutil.Error, KeyError, ValueError, OverflowError):
            continue
    if not records:
        procs = rank_processes()
    for proc in list(procs.values()):
        try:
            proc.cpu_percent(None)
        except psutil.Error:
            continue
    if procs:
        time.sleep(0.2)
    out = []
    for rank, proc in procs.items():
        try:
            out.append(
                {
                    "rank": rank,
                    "pid": proc.pid,
                    "cpu_percent": proc.cpu_percent(None),
                    "rss_mb": proc.memory_info().rss / 2**20,
                }
            )
        except psutil.Error:
            continue
    return out


def flags(records: list[dict[str, Any]], gpus: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Problems worth a look, each with the rank or GPU and a hint."""
    found: list[dict[str, str]] = []
    times = [r["step_time_s"] for r in records if r.get("step_time_s")]
    if len(times) >= 2:
        median = statistics.median(times)
        for r in records:
            if (r.get("step_time_s") or 0) > STRAGGLER * median:
                found.append(
                    {
                        "flag": "straggler",
                        "where": f"rank {r['rank']}",
                        "detail": f"step {r['step_time_s'] * 1000:.0f} ms vs median "
                        f"{median * 1000:.0f} ms",
                        "hint": "check that rank's GPU/CPU load, data and host",
                    }
                )
    for r in records:
        wait = r.get("data_wait_fraction") or 0.0
        if wait > INPUT_BOUND:
            found.append(
                {
                    "flag": "input-bound",
                    "where": f"rank {r['rank']}",
                    "detail": f"{wait:.0%} of the time waiting for batches",
                    "hint": "raise num_workers, enable pin_memory, or cache/preprocess data",
                }
            )
    memories = [
        (f"rank {r['rank']}", r["peak_memory_mb"]) for r in records if r.get("peak_memory_mb")
    ]
    memories += [(f"GPU {g['index']}", g["memory_used_mb"]) for g in gpus if len(gpus) > 1]
    for group in (
        [m for m in memories if m[0].startswith("rank")],
        [m for m in memories if m[0].startswith("GPU")],
    ):
        if len(group) >= 2 and min(v for _, v in group) > 0:
            high = max(group, key=lambda m: m[1])
            ratio = high[1] / min(v for _, v in group)
            if ratio > IMBALANCE:
                found.append(
                    {
                        "flag": "memory imbalance",
                        "where": high[0],
                        "detail": f"{ratio:.2f}x the smallest",
                        "hint": "the DataParallel cuda:0 symptom: use ddp, or check that "
                        "rank's extra work (logging, eval, saving)",
                    }
                )
    if records:
        for g in gpus:
            if g["utilization"] < IDLE_GPU:
                found.append(
                    {
                        "flag": "idle GPU",
                        "where": f"GPU {g['index']}",
                        "detail": f"{g['utilization']}% utilised during a run",
                        "hint": "no rank uses it (--nproc), or the job is input-bound",
                    }
                )
    return found


def hang_flags(run_dir: Path | None) -> list[dict[str, str]]:
    """The stall the ranks named (``stacks/diagnosis.json``), as a flag."""
    if run_dir is None:
        return []
    path = run_dir / "stacks" / "diagnosis.json"
    try:
        cause = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [
        {
            "flag": f"hang: {cause.get('kind', '?')}",
            "where": ", ".join(f"rank {r}" for r in cause.get("ranks", [])),
            "detail": str(cause.get("summary", "")),
            "hint": f"every rank's stacks are in {path.parent}",
        }
    ]


def snapshot(run_dir: Path | None) -> dict[str, Any]:
    """Machine and job state right now."""
    started = time.monotonic()
    psutil.cpu_percent(None)  # the start of the host CPU measurement, read at the end
    notes: list[str] = []
    records = latest_records(run_dir, notes) if run_dir is not None else []
    gpus, gpu_note = gpu_stats()
    now = time.time()
    for r in records:
        age = now - r["time"] if "time" in r else math.nan
        r["age_s"] = age if math.isfinite(age) else None  # no Infinity in --json
    # Without records of its own, a run dir shows no ranks: the torchrun processes found on this
    # machine may belong to another job.
    processes = process_stats(records) if records or run_dir is None else []
    time.sleep(max(0.0, HOST_SAMPLE_S - (time.monotonic() - started)))
    return {
        "notes": notes,
        "time": now,
        "run_dir": printable(run_dir) if run_dir else None,
        "ranks": records,
        "gpus": gpus,
        "gpu_note": gpu_note,
        "processes": processes,
        "flags": flags(records, gpus) + hang_flags(run_dir),
        "cpu_percent": psutil.cpu_percent(None),
        "memory_percent": psutil.virtual_memory().percent,
    }
