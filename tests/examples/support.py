"""Run a shipped example the way a user would: ``paratrain run --nproc 2 examples/...``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_example(
    script: str | Path,
    *args: str,
    run_dir: Path,
    nproc: int = 2,
    cwd: Path | None = None,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``paratrain run --nproc N --backend gloo --run-dir RUN_DIR script args`` in a subprocess.

    ``script`` is relative to ``examples/`` unless absolute. With ``check`` a non-zero exit fails
    the test with the end of the ranks' output.
    """
    path = Path(script) if Path(script).is_absolute() else EXAMPLES / script
    command = [sys.executable, "-m", "paratrain", "run", "--nproc", str(nproc), "--backend", "gloo",
               "--run-dir", str(run_dir), str(path), *args]  # fmt: skip
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(
        command, cwd=cwd or run_dir.parent, capture_output=True, text=True, timeout=timeout,
        env=full_env,
    )  # fmt: skip
    if check:
        assert proc.returncode == 0, (
            f"{' '.join(command)} exited {proc.returncode}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows ``run.log`` wrote to ``run_dir/metrics.jsonl``."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_scripts(
    commands: Mapping[str, Sequence[str]], cwd: Path
) -> dict[str, subprocess.CompletedProcess[str]]:
    """``python SCRIPT ARGS`` for each named command, four at a time, in ``cwd``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
        )

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(commands, pool.map(run, commands.values()), strict=True))


def refusal(proc: subprocess.CompletedProcess[str]) -> str:
    """The one-line message of a script that refused bad input (status 2, no traceback, only
    argparse's usage above it); fails the test otherwise."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert (proc.returncode, proc.stdout) == (2, "")
    *usage, message = proc.stderr.strip().splitlines()
    assert all(line.startswith(("usage:", " ")) for line in usage), proc.stderr  # argparse's
    return message
