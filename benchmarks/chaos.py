"""Kill a random rank at a random step of a 2-rank job; with restarts it must end bit-identical.

    python benchmarks/chaos.py --trials 20

Each trial runs `paratrain run --nproc 2 --max-restarts 3 benchmarks/chaos_train.py` with a
random rank SIGKILLed at a random step (one uninterrupted run is the reference), then compares
the final weights bit for bit. Prints "N/N".
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from paratrain.core.run_dir import RunDir

SCRIPT = Path(__file__).with_name("chaos_train.py")
STEPS = 36  # 3 epochs x 96 samples / (2 ranks x 4)


def launch(run_dir: Path, *extra: str, max_restarts: int = 3) -> subprocess.CompletedProcess[str]:
    """Run the chaos job; return the finished process (output captured)."""
    cmd = [
        sys.executable,
        "-m",
        "paratrain",
        "run",
        "--nproc",
        "2",
        f"--max-restarts={max_restarts}",
        "--backend",
        "gloo",
        "--run-dir",
        str(run_dir),
        str(SCRIPT),
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The weights rank 0 wrote at the end."""
    state: dict[str, torch.Tensor] = torch.load(run_dir / "final.pt", weights_only=True)
    return state


def trial(
    root: Path, reference: dict[str, torch.Tensor], rank: int, step: int, index: int = 0
) -> bool:
    """One kill; True when the job finished and matches the reference exactly."""
    run_dir = root / f"trial{index}-kill-r{rank}-s{step}"
    proc = launch(run_dir, "--kill-rank", str(rank), "--kill-step", str(step))
    if proc.returncode != 0 or not (run_dir / "final.pt").exists():
        print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
        return False
    restarts = [json.loads(x) for x in RunDir(run_dir).restarts.read_text().splitlines()]
    got = final_weights(run_dir)
    same = all(torch.equal(got[k], reference[k]) for k in reference)
    ok = same and len(restarts) == 1 and restarts[0]["resumed"] == (step >= 2)
    if not ok:
        print(
            f"kill rank {rank} at step {step}: identical={same}, restarts={restarts}",
            file=sys.stderr,
        )
    return ok


def run_trials(trials: int, seed: int = 0) -> tuple[int, list[tuple[int, int]]]:
    """(bit-identical trials, the (rank, step) of each kill)."""
    rng = random.Random(seed)
    kills = [(rng.randrange(2), rng.randrange(1, STEPS)) for _ in range(trials)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ref = launch(root / "reference")
        if ref.returncode != 0:
            raise SystemExit(f"the uninterrupted run failed:\n{ref.stderr[-4000:]}")
        reference = final_weights(root / "reference")
        ok = sum(trial(root, reference, rank, step, i) for i, (rank, step) in enumerate(kills))
    return ok, kills


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ok, kills = run_trials(args.trials, args.seed)
    print(f"kills (rank, step): {kills}")
    print(f"{ok}/{args.trials} bit-identical to the uninterrupted run")


if __name__ == "__main__":
    main()
