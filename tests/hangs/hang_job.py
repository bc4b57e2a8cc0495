"""A training job that hangs on purpose, in one of many ways, at step 3.

    paratrain run --nproc 2 hang_job.py KIND [--rank R] [--stall-s S] [--no-preempt]

KIND (rank R, default 1, is the odd one out):
  only_rank0_collective  rank 0 all-reduces a tensor the others never all-reduce
  order                  rank R broadcasts where the others all-reduce
  shapes                 rank R all-reduces a tensor of another shape
  loop                   rank R spins in a Python loop that never ends
  lock                   rank R waits on a lock nobody releases
  queue                  rank R waits on a queue nobody fills
  sleep                  rank R sleeps (a stuck read, a slow file system)
  barrier_rank0          only rank 0 enters run.barrier()
  uneven                 rank R reads fewer batches (no run.loader, no uneven_inputs)
  save_one_rank          only rank 0 calls run.save()
  early_stop             rank R decides on its own to stop (a local metric)
  two_groups             ranks enter two process groups in opposite orders
  dead_worker            rank R's DataLoader worker is killed
"""

import argparse
import os
import queue
import signal
import threading
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import paratrain as pt

parser = argparse.ArgumentParser()
parser.add_argument("kind")
parser.add_argument("--rank", type=int, default=1)
parser.add_argument("--stall-s", type=float, default=None)
parser.add_argument(
    "--no-preempt", action="store_true", help="torchrun's SIGTERM ends a rank at once"
)
args = parser.parse_args()


class Slow(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int):
        return torch.randn(8), int(i % 4)


preempt = None if args.no_preempt else ("SIGTERM", "SIGUSR1", "SIGUSR2")
with pt.Run(
    seed=0, progress=False, stall_s=args.stall_s, timeout_s=600, preempt_signals=preempt
) as run:
    net = nn.Linear(8, 4)
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    odd = run.rank == args.rank
    groups = [dist.new_group(), dist.new_group()] if args.kind == "two_groups" else []
    workers = 1 if args.kind == "dead_worker" else 0
    loader = run.loader(Slow(), batch_size=8, num_workers=workers)
    data = [(torch.randn(8, 8), torch.randint(0, 4, (8,))) for _ in range(20)]
    for steps, (x, y) in enumerate(data if args.kind == "uneven" else loader, start=1):
        if steps == 3:
            k = args.kind
            if k == "only_rank0_collective" and run.rank == 0:
                dist.all_reduce(torch.ones(4))
            elif k == "order":
                t = torch.ones(4)
                dist.broadcast(t, src=0) if odd else dist.all_reduce(t)
            elif k == "shapes":
                dist.all_reduce(torch.ones(6 if odd else 4))
            elif k == "loop" and odd:
                n = 0
                while True:
                    n += 1
            elif k == "lock" and odd:
                lock = threading.Lock()
                lock.acquire()
                lock.acquire()
            elif k == "queue" and odd:
                queue.Queue().get()
            elif k == "sleep" and odd:
                time.sleep(3600)
            elif k == "barrier_rank0" and run.rank == 0:
                run.barrier()
            elif k == "save_one_rank" and run.rank == 0:
                run.save()
            elif k == "early_stop" and odd:
                break
            elif k == "two_groups":
                first, second = groups if run.rank == 0 else groups[::-1]
                dist.all_reduce(torch.ones(4), group=first)
                dist.all_reduce(torch.ones(4), group=second)
            elif k == "dead_worker" and odd:
                for child in loader.loader._iterator._workers:  # type: ignore[union-attr]
                    os.kill(child.pid, signal.SIGKILL)
        if args.kind == "uneven" and odd and steps == 3:
            break
        run.backward(F.cross_entropy(model(x), y))
        run.step(optimizer)
        if run.global_step >= 8:
            break
