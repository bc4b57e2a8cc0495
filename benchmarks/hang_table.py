"""The hang table: every injected hang kind of tests/hangs/hang_job.py under ``paratrain run``, at
2 and 4 gloo ranks, and whether the job named it (kind, rank, line) and how fast.

    python benchmarks/hang_table.py                    # every kind at 2 and 4 ranks (~15 min)
    python benchmarks/hang_table.py --ranks 2 --kinds order,loop

Each run uses ``stall_s`` of the job's default (max(30 s, 20 x p99 step)) unless ``--stall-s``
is given. "seconds" is the ranks' time without progress when they named the stall (for a job that
ended otherwise, the whole run's); "exit" is paratrain run's exit code (124 for a named stall, 134
when gloo found a size mismatch itself and aborted the rank, 1 when a rank left early and its peer
lost it, or torch named a dead DataLoader worker; each named by ``paratrain run``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = Path(__file__).resolve().parents[1] / "tests" / "hangs" / "hang_job.py"
GLOO = "gloo received"
"""gloo checks a collective's sizes itself and aborts the rank; the job names it from that."""
EXPECTED = {
    "only_rank0_collective": ("never reached", "mismatched collectives", GLOO),
    "order": ("mismatched collectives",),
    "shapes": ("shape mismatch", GLOO),
    "loop": ("never reached",),
    "lock": ("never reached",),
    "queue": ("never reached",),
    "sleep": ("never reached",),
    "barrier_rank0": ("never reached", "mismatched collectives", GLOO),
    "uneven": ("never reached", "mismatched collectives", GLOO, "lost its peer"),
    "save_one_rank": ("never reached", "mismatched collectives", GLOO),
    "early_stop": ("never reached", "mismatched collectives", GLOO, "lost its peer"),
    "two_groups": ("two process groups",),
    "dead_worker": ("never reached", "raised RuntimeError: DataLoader worker"),
}


def run(kind: str, nproc: int, stall_s: float | None) -> tuple[str, int, float]:
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "paratrain", "run", "--nproc", str(nproc), "--run-dir",
                   f"{tmp}/run", str(JOB), kind]  # fmt: skip
        if stall_s is not None:
            command += ["--stall-s", str(stall_s)]
        started = time.monotonic()
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=900,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        named = re.search(r"hang after (\d+)s without progress: ([^:]+): (.*)", done.stderr)
        seconds = float(named.group(1)) if named else time.monotonic() - started
        if named:
            return f"{named.group(2)}: {named.group(3)}", done.returncode, seconds
        failed = " ".join(done.stderr.split("the job failed:")[-1].split())
        return failed[:400], done.returncode, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--kinds", default=",".join(EXPECTED))
    parser.add_argument("--stall-s", type=float, default=None)
    args = parser.parse_args()
    print("| kind | ranks | named | exit | seconds to the diagnosis | diagnosis |")
    print("|---|---|---|---|---|---|")
    right = total = 0
    for nproc in map(int, args.ranks.split(",")):
        for kind in args.kinds.split(","):
            summary, code, seconds = run(kind, nproc, args.stall_s)
            ok = any(named in summary[:160] for named in EXPECTED[kind]) and code in (1, 124, 134)
            right += ok
            total += 1
            shown = summary.replace("|", "/")[:400]
            verdict = "yes" if ok else "NO"
            print(
                f"| {kind} | {nproc} | {verdict} | {code} | {seconds:.0f} | {shown} |", flush=True
            )
    print(f"\n{right} of {total} named correctly")
    return 0 if right == total else 1


if __name__ == "__main__":
    sys.exit(main())
