"""``paratrain check`` on a 2,000-line training script: time beyond the interpreter's start.

    python benchmarks/check_speed.py              # target: <= 0.5 s beyond `python -c pass`
    python benchmarks/check_speed.py --tree       # the installed torch package: <= 60 s, <= 1 GB

The script is made of this repository's training scripts (the examples and the tutorial
originals), each wrapped in a function of its own so that names do not collide, until it has
2,000 lines. Each timing is the median of 7 runs of a fresh process:
`python -c pass` (the interpreter's start) and `python -m paratrain check big.py`; the
in-process time of `check_paths` alone is printed too.
"""

from __future__ import annotations

import argparse
import resource
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


TREE_CPU_S, TREE_RSS_MB = 60.0, 1024.0


def tree() -> None:
    """``paratrain check`` over the installed torch package (thousands of files, one process):
    CPU seconds and peak memory of the child, against the targets."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "paratrain", "check", str(root), "--json"],
        capture_output=True,
        text=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rss_mb = after.ru_maxrss / 1024  # kilobytes on Linux
    files = sum(1 for _ in root.rglob("*.py"))
    failures = done.stdout.count('"failure": true')
    print(f"torch package: {root} ({files} .py files), exit {done.returncode}")
    print(f"CPU:  {cpu:.1f} s = {cpu / TREE_CPU_S:.2f} x the {TREE_CPU_S:.0f} s target")
    print(f"peak: {rss_mb:.0f} MB = {rss_mb / TREE_RSS_MB:.2f} x the 1 GB target")
    print(f"rule failures: {failures}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="store_true", help="check the installed torch package")
    if parser.parse_args().tree:
        tree()
        return
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
