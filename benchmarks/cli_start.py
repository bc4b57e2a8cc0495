"""``paratrain --help`` and every ``paratrain COMMAND --help``: time beyond the interpreter's start.

    python benchmarks/cli_start.py              # target: <= 0.3 s beyond `python -c pass`

Each timing is the median of 7 fresh processes of the installed `paratrain` entry point
(`python -m paratrain ...`), minus the median of 7 runs of `python -c pass`. Help never imports
torch (tests/test_cli_help.py checks that); this measures what is left.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from paratrain.commands.cli import COMMANDS

TARGET_S = 0.3
RUNS = 7


def median_s(argv: list[str]) -> float:
    """Median wall time of ``argv`` over :data:`RUNS` fresh processes."""
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    base = median_s([sys.executable, "-c", "pass"])
    print(f"interpreter start: {base:.3f} s; target: <= {TARGET_S} s beyond it")
    print(f"{'command':<32} {'beyond start':>12}")
    worst = 0.0
    for argv in [["--help"], *([name, "--help"] for name in COMMANDS)]:
        beyond = median_s([sys.executable, "-m", "paratrain", *argv]) - base
        worst = max(worst, beyond)
        print(f"{'paratrain ' + ' '.join(argv):<32} {beyond:>10.3f} s")
    print(f"slowest: {worst:.3f} s = {worst / TARGET_S:.2f} x the target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
