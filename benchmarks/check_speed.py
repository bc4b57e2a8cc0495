"""``paratrain check`` on a 2,000-line training script: time beyond the interpreter's start.

    python benchmarks/check_speed.py              # target: <= 0.5 s beyond `python -c pass`

The script is made of this repository's training scripts (the examples and the tutorial
originals), each wrapped in a function of its own so that names do not collide, until it has
2,000 lines. Each timing is the median of 7 runs of a fresh process:
`python -c pass` (the interpreter's start) and `python -m paratrain check big.py`; the
in-process time of `check_paths` alone is printed too.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "examples").rglob("*.py"))
TARGET_S = 0.5


def big_script(lines: int = 2000) -> str:
    """Training code of at least ``lines`` lines that parses as one module."""
    parts: list[str] = []
    count = 0
    while count < lines:
        for i, path in enumerate(SOURCES):
            body = [
                ln for ln in path.read_text().splitlines() if not ln.startswith("from __future__")
            ]
            part = f"def script_{len(parts)}_{i}():\n" + textwrap.indent("\n".join(body), "    ")
            parts.append(part + "\n    pass\n")
            count += part.count("\n") + 2
            if count >= lines:
                break
    return "\n\n".join(parts)


def median_run(argv: list[str], repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    from paratrain.commands.check.engine import check_paths

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "big.py"
        script.write_text(big_script())
        n = len(script.read_text().splitlines())
        start = time.perf_counter()
        report = check_paths([script])
        inside = time.perf_counter() - start
        command = [sys.executable, "-m", "paratrain", "check", str(script)]
        once = subprocess.run(command, capture_output=True, text=True)
        if once.returncode not in (0, 1) or "checked" not in once.stdout:
            raise SystemExit(f"paratrain check failed ({once.returncode}):\n{once.stderr}")
        bare = median_run([sys.executable, "-c", "pass"])
        full = median_run(command)
    beyond = full - bare
    print(f"script: {n} lines, {len(report.findings)} findings")
    print(f"python -c pass:            {bare:.3f} s (median of 7)")
    print(f"paratrain check big.py:    {full:.3f} s (median of 7)")
    print(f"beyond interpreter start:  {beyond:.3f} s = {beyond / TARGET_S:.2f} x the 0.5 s target")
    print(f"check_paths in process:    {inside:.3f} s")


if __name__ == "__main__":
    main()
