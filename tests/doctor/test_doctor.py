"""``paratrain doctor``: the real report here, and every check under a simulated condition."""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from paratrain.commands.doctor import checks, facts, render
from paratrain.commands.doctor.command import build_report

FAKE_SMI = """#!/bin/sh
echo "0, NVIDIA H100 80GB HBM3, {driver}, 81559"
"""


def _facts(**changes: Any) -> dict[str, Any]:
    base = facts.gather()
    for key, value in changes.items():
        if key == "torch":
            base["torch"] = {**base["torch"], **value}
        else:
            base[key] = value
    return base


def _by_name(results: list[checks.Check], name: str) -> checks.Check:
    return next(c for c in results if c.name == name)


def test_real_report_on_this_machine() -> None:
    report = build_report(quick=False)
    assert report["facts"]["torch"]["version"].startswith("2.")
    assert report["facts"]["cpu_cores"] >= 1 and report["facts"]["memory_gb"] > 0
    assert {c["status"] for c in report["checks"]} <= {"OK", "WARN", "FAIL"}
    assert all(set(c) == {"name", "status", "detail", "fix"} for c in report["checks"])
    names = [m["name"] for m in report["measurements"]]
    assert names == ["matmul fp32 (cpu)", "all-reduce gloo, 2 ranks"]
    assert all(m["value"] > 0 for m in report["measurements"])


def test_json_output_and_exit_code() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "paratrain", "doctor", "--json", "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(proc.stdout)
    failed = any(c["status"] == "FAIL" for c in report["checks"])
    assert proc.returncode == (1 if failed else 0) and report["measurements"] == []


def test_cpu_torch_with_an_nvidia_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(driver="550.54.15"))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    result = _by_name(checks.run_checks(facts.gather()), "torch build matches driver")
    assert result.status == "FAIL" and "CPU-only build" in result.detail
    assert "CUDA build" in result.fix


def test_old_driver_and_invisible_gpus() -> None:
    f = _facts(
        torch={"cuda_build": "12.4", "gpus": []},
        nvidia_smi={"gpus": [{"index": "0"}], "driver": "470.82.01"},
    )
    results = checks.run_checks(f)
    old = _by_name(results, "driver new enough")
    assert old.status == "FAIL" and "525.60" in old.detail and "update the NVIDIA driver" in old.fix
    hidden = _by_name(results, "GPUs visible to torch")
    assert hidden.status == "FAIL" and "torch sees none" in hidden.detail


def test_small_dev_shm(monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.statvfs

    class Small:
        f_blocks, f_frsize = 16384, 4096  # 64 MiB, Docker's default

    monkeypatch.setattr(os, "statvfs", lambda p: Small() if p == "/dev/shm" else real(p))
    result = _by_name(checks.run_checks(facts.gather()), "/dev/shm size")
    assert result.status == "WARN" and "64 MiB" in result.detail and "--shm-size" in result.fix


def test_master_port_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        monkeypatch.setenv("MASTER_PORT", str(busy.getsockname()[1]))
        monkeypatch.delenv("RANK", raising=False)
        result = _by_name(checks.run_checks(facts.gather()), "MASTER_PORT free")
    assert result.status == "FAIL" and "MASTER_PORT=" in result.fix


def test_nccl_transports_and_omp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    results = checks.run_checks(facts.gather())
    assert _by_name(results, "NCCL transports").status == "WARN"
    omp = _by_name(results, "OMP_NUM_THREADS")
    assert omp.status == "WARN" and omp.fix.startswith("export OMP_NUM_THREADS=")


def test_broken_torch_is_reported_not_crashed(tmp_path: Path) -> None:
    poisoned = tmp_path / "torch"
    poisoned.mkdir()
    (poisoned / "__init__.py").write_text("raise ImportError('poisoned torch for the test')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "paratrain", "doctor", "--json", "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    report = json.loads(proc.stdout)
    assert proc.returncode == 1
    assert "poisoned torch" in report["facts"]["torch"]["error"]
    assert report["checks"][0]["status"] == "FAIL" and "Traceback" not in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "paratrain", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 2 and "paratrain doctor" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "name,cc,tflops,status,needle",
    [
        ("NVIDIA H100 80GB HBM3", (9, 0), 700.0, "OK", "50% of the H100 SXM's 989"),
        ("NVIDIA H100 80GB HBM3", (9, 0), 300.0, "WARN", ">= 494 TFLOP/s"),
        ("NVIDIA H100 PCIe", (9, 0), 300.0, "WARN", "H100 PCIe's 756"),
        ("NVIDIA A100-SXM4-80GB", (8, 0), 200.0, "OK", "A100's 312"),
        ("NVIDIA L40", (8, 9), 100.0, "OK", "L40's 181"),  # not taken for an L4
        ("NVIDIA GeForce GTX 1080", (6, 1), 8.0, "INFO", "unknown GPU"),
        ("NVIDIA A100-SXM4-80GB", (9, 9), 200.0, "INFO", "no verdict"),  # name and cc disagree
    ],
)
def test_gpu_matmul_is_judged_against_the_devices_peak(
    name: str, cc: tuple[int, int], tflops: float, status: str, needle: str
) -> None:
    from paratrain.commands.doctor.measure import gpu_matmul_verdict

    props = SimpleNamespace(name=name, major=cc[0], minor=cc[1])
    result = gpu_matmul_verdict(props, tflops)
    assert result["status"] == status and needle in result["expected"]
    assert result["value"] == tflops and result["unit"] == "TFLOP/s"


def test_a_failed_all_reduce_measurement_says_why() -> None:
    from paratrain.commands.doctor import measure, render

    result = measure.allreduce("no-such-backend")
    assert result["status"] == "FAIL" and result["value"] is None
    assert result["detail"][:7] in ("rank 0:", "rank 1:") and "no-such-backend" in result["detail"]
    report = {"facts": facts.gather(), "checks": [], "measurements": [result]}
    console = Console(record=True, width=200)
    render.show(report, console)
    assert "no-such-backend" in console.export_text()


def test_a_garbled_launcher_variable_is_reported_not_raised() -> None:
    from paratrain.commands.doctor.checks import check_omp

    check = check_omp({"env": {"LOCAL_WORLD_SIZE": "abc"}, "torch": {"gpus": []}, "cpu_cores": 2})
    assert check.status == "FAIL" and "LOCAL_WORLD_SIZE" in check.detail


ENV_KEYS = [
    "LOCAL_WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR", "OMP_NUM_THREADS", "RANK",
    "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "CUDA_VISIBLE_DEVICES", "WORLD_SIZE",
]  # fmt: skip


@functools.cache
def _machine() -> dict[str, Any]:
    return facts.gather()


@settings(max_examples=150, deadline=None)
@given(
    env=st.dictionaries(
        st.sampled_from(ENV_KEYS),
        st.one_of(
            st.text(max_size=12),
            st.sampled_from(["²", "99999", "-1", "0", "1" * 40, "localhost", "::1", "４"]),
        ),
    )
)
def test_any_launcher_variables_give_a_report_never_an_exception(env: dict[str, str]) -> None:
    base = _machine()
    results = checks.run_checks({**base, "env": env})
    assert all(c.status in ("OK", "WARN", "FAIL") for c in results)
    render.as_json({"facts": {**base, "env": env}, "checks": [c.as_dict() for c in results]})
