"""How fast a preemption and a node loss are survived.

    python benchmarks/preemption.py            # both parts, about 2 minutes on 2 cores
    python benchmarks/preemption.py --sizes 16,64,256 --no-elastic

1. Signal to a committed checkpoint: a one-process run whose state (weights + AdamW moments) is
   N MiB gets SIGTERM mid-epoch; the time from the signal to the new checkpoint's manifest (the
   commit) is printed per MiB of state, next to a raw ``torch.save`` + fsync of the same state,
   and the time to the process's exit with 75.
2. Node loss to training again: ``tests/elastic/job.py`` on two ``paratrain run --nnodes 1:2``
   agents; one agent and its rank are SIGKILLed at step 6; the time from the kill to the
   survivor's resume (its ``restarts.jsonl`` record) is printed, with the rendezvous's
   ``last_call_timeout`` of 3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

JOB = """
import sys, time
from pathlib import Path
import torch
import paratrain as pt

mib = int(sys.argv[2])
run = pt.Run(run_dir=sys.argv[1], progress=False, stats_every=None, keep_last=1)
width = int((mib * 2**20 / 4 / 3) ** 0.5)  # weights + two AdamW moments: 3 copies of w x w
net = torch.nn.Linear(width, width, bias=False)
model, opt = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-4))
data = torch.utils.data.TensorDataset(torch.randn(4096, width))
for _ in run.epochs(1000):
    for (x,) in run.loader(data, batch_size=4):
        run.backward(model(x).square().mean())
        run.step(opt)
        if run.global_step == 2:
            Path(sys.argv[1], "ready").touch()
"""


def signal_to_checkpoint(mib: int, work: Path) -> tuple[float, float, float]:
    """Seconds from SIGTERM to the checkpoint committed (its manifest.json in place) and to the
    exit with 75, and of a raw torch.save + fsync of the same state."""
    run_dir = work / f"state-{mib}"
    script = work / "job.py"
    script.write_text(textwrap.dedent(JOB))
    proc = subprocess.Popen([sys.executable, str(script), str(run_dir), str(mib)], env=ENV)
    while not (run_dir / "ready").exists():
        if proc.poll() is not None:
            raise SystemExit(f"the {mib} MiB job ended early with {proc.returncode}")
        time.sleep(0.02)
    time.sleep(0.5)
    before = set((run_dir / "checkpoints").glob("step-*/manifest.json"))
    start = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    while not set((run_dir / "checkpoints").glob("step-*/manifest.json")) - before:
        if proc.poll() is not None:
            raise SystemExit(f"the {mib} MiB job exited with {proc.returncode} and no checkpoint")
        time.sleep(0.005)
    committed = time.perf_counter() - start
    code = proc.wait()
    ended = time.perf_counter() - start
    if code != 75:
        raise SystemExit(f"the {mib} MiB job exited with {code}, not 75")
    return committed, ended, _raw_save(mib, work)


def _raw_save(mib: int, work: Path) -> float:
    import torch

    width = int((mib * 2**20 / 4 / 3) ** 0.5)
    state = {k: torch.randn(width, width) for k in ("w", "m", "v")}
    path = work / "raw.pt"
    start = time.perf_counter()
    with path.open("wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    took = time.perf_counter() - start
    path.unlink()
    return took


def node_loss_to_training(work: Path) -> float:
    """Seconds from SIGKILLing one of two agents to the survivor's resume at world size 1."""
    import psutil

    from paratrain.distributed.ports import free_port

    run_dir, port = work / "elastic", free_port()
    command = [
        sys.executable, "-m", "paratrain", "run", "--nnodes", "1:2", "--nproc", "1",
        "--max-restarts", "3", "--rdzv-endpoint", f"127.0.0.1:{port}", "--backend", "gloo",
        "--torchrun-arg=--rdzv-conf=last_call_timeout=3",
        str(ROOT / "tests" / "elastic" / "job.py"), str(run_dir), "--sleep", "0.3",
    ]  # fmt: skip
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    first = subprocess.Popen(command, env=ENV, **quiet)  # type: ignore[call-overload]
    time.sleep(0.5)
    second = subprocess.Popen(command, env=ENV, **quiet)  # type: ignore[call-overload]
    while not (run_dir / "at-step-6").exists():
        time.sleep(0.05)
    tree = [psutil.Process(second.pid), *psutil.Process(second.pid).children(recursive=True)]
    killed = time.time()
    for p in tree:
        p.kill()
    first.wait(timeout=300)
    record = json.loads((run_dir / "restarts.jsonl").read_text().splitlines()[0])
    return float(record["time"]) - killed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="16,64,256", help="MiB of state, comma-separated")
    parser.add_argument("--no-elastic", action="store_true", help="skip the node-loss part")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="paratrain-preempt-") as tmp:
        work = Path(tmp)
        print(
            f"{'state':>9} {'signal→committed':>17} {'per MiB':>9} {'raw save':>9} {'÷ raw':>6} "
            f"{'signal→exit 75':>15}"
        )
        for mib in (int(s) for s in args.sizes.split(",")):
            committed, ended, raw = signal_to_checkpoint(mib, work)
            print(
                f"{mib:>5} MiB {committed:>15.2f} s {committed / mib * 1000:>6.1f} ms "
                f"{raw:>7.2f} s {committed / raw:>6.2f} {ended:>13.2f} s"
            )
        if not args.no_elastic:
            print(
                f"node loss to training again (2 agents -> 1): {node_loss_to_training(work):.1f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
