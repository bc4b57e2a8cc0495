"""A training job that runs out of memory on purpose.

    python oom_job.py forward|backward|optimizer [--rank R] [--limit-mib M]

Injected: at step 3, rank R (default 0) raises torch.OutOfMemoryError in the named phase (a
module's forward, a gradient hook in backward, an optimizer step pre-hook). With --limit-mib, rank
R instead gets a real limit on its address space (M MiB above what it maps at the start) and
allocates an activation larger than that: torch's CPU allocator fails for real.
"""

import argparse
import resource

import torch
import torch.nn.functional as F
from torch import nn

import paratrain as pt

parser = argparse.ArgumentParser()
parser.add_argument("phase", choices=["forward", "backward", "optimizer", "real"])
parser.add_argument("--rank", type=int, default=0)
parser.add_argument("--limit-mib", type=int, default=0)
args = parser.parse_args()

OOM = "CUDA out of memory. Tried to allocate 2.00 GiB (injected by oom_job.py)"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
        self.head = nn.Linear(64, 10)
        self.calls = 0
        self.wide = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.wide:
            x = x.repeat(1, self.wide)[:, :64] + torch.empty(x.shape[0], self.wide * 64).sum()
        return self.head(self.layers(x))


data = torch.utils.data.TensorDataset(torch.randn(256, 64), torch.randint(0, 10, (256,)))
with pt.Run(seed=0, progress=False) as run:
    net = Net()
    model, optimizer = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-3))
    mine = run.rank == args.rank
    for x, y in run.loader(data, batch_size=16):
        step = run.global_step + 1
        if mine and step == 3 and args.phase == "forward":
            net.layers[1].register_forward_hook(
                lambda *a: (_ for _ in ()).throw(torch.OutOfMemoryError(OOM))
            )
        if mine and step == 3 and args.phase == "real":
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            with open("/proc/self/status") as status:
                mapped = next(int(t.split()[1]) for t in status if t.startswith("VmSize:")) * 1024
            resource.setrlimit(resource.RLIMIT_AS, (mapped + args.limit_mib * 2**20, hard))
            net.wide = 2**22  # a 16 x 2**28-float activation: 16 GiB
        out = model(x)
        loss = F.cross_entropy(out, y)
        if mine and step == 3 and args.phase == "backward":
            out.register_hook(lambda grad: (_ for _ in ()).throw(torch.OutOfMemoryError(OOM)))
        if mine and step == 3 and args.phase == "optimizer":
            optimizer.register_step_pre_hook(
                lambda *a: (_ for _ in ()).throw(torch.OutOfMemoryError(OOM))
            )
        run.backward(loss)
        run.step(optimizer)
        if run.global_step >= 6:
            break
