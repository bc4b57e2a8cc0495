"""Run a corpus script and SIGKILL one rank after its N-th optimizer step, on the first attempt.

    CORPUS_KILL_STEP=7 CORPUS_KILL_RANK=1 paratrain run --nproc 2 --max-restarts 1 \
        tests/resume_corpus/killer.py tests/resume_corpus/mnist.py [ARGS]

The script runs unchanged (``runpy``, as ``__main__``); the kill comes from a global optimizer
step post-hook, so it lands right after ``optimizer.step()`` inside ``run.step``, before the run
has counted the step. Restarted attempts (``TORCHELASTIC_RESTART_COUNT`` > 0) are not killed.
With ``CORPUS_COUNT_FILE`` set, each rank writes how many optimizer steps it took to
``<file>.rank<r>`` at exit (used to pick a kill point from an uninterrupted run).

Written before ``paratrain verify-resume`` existed; kept as a check of it from outside pt.Run
(verify-resume injects its faults through pt.Run's ``PARATRAIN_KILL``).
"""

from __future__ import annotations

import atexit
import os
import runpy
import signal
import sys
from pathlib import Path
from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook


def main() -> None:
    script, *args = sys.argv[1:]
    rank = int(os.environ.get("RANK", "0"))
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    kill_step = int(os.environ.get("CORPUS_KILL_STEP", "0"))
    kill = first_attempt and kill_step > 0 and rank == int(os.environ.get("CORPUS_KILL_RANK", "0"))
    steps = 0

    def count(optimizer: Any, args: Any, kwargs: Any) -> None:
        nonlocal steps
        steps += 1
        if kill and steps == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)

    register_optimizer_step_post_hook(count)
    count_file = os.environ.get("CORPUS_COUNT_FILE")
    if count_file:
        atexit.register(lambda: Path(f"{count_file}.rank{rank}").write_text(str(steps)))
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
