"""Run a shipped example the way a user would: ``paratrain run --nproc 2 examples/...``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
