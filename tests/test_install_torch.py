"""The Makefile's torch install: PyTorch's CPU wheel index first on a machine without an NVIDIA
GPU, the default index after it (and only the default one with a GPU)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.repo_tools import load_tool

ROOT = Path(__file__).resolve().parents[1]


install_torch = load_tool("install_torch")


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _makefile_install_line(spec: str) -> str:
    """The command `make` runs to install torch into a fresh .venv (`make -n`: printed, not run)."""
    done = subprocess.run(
        ["make", "-n", "-B", ".venv/.installed-demo", f"TORCH_SPEC={spec}"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if "install_torch.py" in line]
    assert len(lines) == 1, done.stdout
    return lines[0]


def _dry_run(line: str, *flags: str) -> list[str]:
    done = subprocess.run(
        f"{line} --dry-run {' '.join(flags)}", shell=True, cwd=ROOT,
        capture_output=True, text=True, check=True,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )  # fmt: skip
    return done.stdout.splitlines()


def test_the_makefile_asks_the_cpu_index_first_without_a_gpu(tmp_path: Path) -> None:
    line = _makefile_install_line("torch==2.13.0")
    assert 'tools/install_torch.py .venv/bin/python "torch==2.13.0"' in line
    # Run the Makefile's own line (with the interpreter that exists here) as a dry run.
    line = line.replace(".venv/bin/python tools", f"{sys.executable} tools", 1)
    cpu, default = _dry_run(line, "--no-gpu")
    assert cpu.endswith("--index-url https://download.pytorch.org/whl/cpu torch==2.13.0"), cpu
    assert "--retries 0" in cpu  # an unreachable index costs seconds, not minutes
    assert default == ".venv/bin/python -m pip install -q torch==2.13.0"


def test_with_a_gpu_only_the_default_index_is_asked() -> None:
    line = _makefile_install_line("torch>=2.6")
    line = line.replace(".venv/bin/python tools", f"{sys.executable} tools", 1)
    assert _dry_run(line, "--gpu") == [".venv/bin/python -m pip install -q torch>=2.6"]
    assert _dry_run(line, "--no-gpu", "--no-cpu-index") == [
        ".venv/bin/python -m pip install -q torch>=2.6"
    ]


@pytest.mark.parametrize(
    ("smi", "expected"),
    [
        ('echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"', True),
        ('echo "NVIDIA-SMI has failed: no driver" >&2; exit 9', False),
        (None, False),
    ],
)
def test_a_gpu_is_what_nvidia_smi_lists(
    smi: str | None, expected: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if any(Path("/dev").glob("nvidia[0-9]*")):
        pytest.skip("this machine has an NVIDIA device node")
    if smi is not None:
        _script(tmp_path / "nvidia-smi", smi)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert install_torch.has_nvidia_gpu() is expected


def test_the_default_index_is_asked_when_the_cpu_index_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = tmp_path / "calls"
    # A "python" whose pip fails for the CPU index (unreachable) and succeeds for the default one.
    python = _script(
        tmp_path / "python",
        f'echo "$*" >> {calls}\ncase "$*" in *--index-url*) exit 1;; esac\nexit 0',
    )
    assert install_torch.main([str(python), "torch==2.13.0", "--no-gpu"]) == 0
    tried = calls.read_text().splitlines()
    assert len(tried) == 2
    assert "--index-url https://download.pytorch.org/whl/cpu" in tried[0]
    assert tried[1] == "-m pip install -q torch==2.13.0"
    assert "installing it from the default index instead" in capsys.readouterr().out


def test_a_failure_of_every_index_is_an_error(tmp_path: Path) -> None:
    python = _script(tmp_path / "python", "exit 1")
    assert install_torch.main([str(python), "torch==2.13.0", "--no-gpu"]) == 1
