"""Multi-worker REINFORCE-with-baseline on a bandit-like task; workers report mean episode return.

Planted: PT024 - each rank's mean return is all_reduce'd with the default SUM and printed as "mean return" without dividing by world size
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

N_ARMS, CTX, EPISODES = 10, 32, 512


class ContextPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(CTX, 128), nn.ReLU(), nn.Linear(128, N_ARMS))
        self.baseline = nn.Sequential(nn.Linear(CTX, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, ctx):
        return self.net(ctx), self.baseline(ctx).squeeze(-1)


def play(ctx, arms, true_w):
    expected = (ctx @ true_w).gather(1, arms.unsqueeze(1)).squeeze(1)
    return expected + 0.1 * torch.randn_like(expected)


def main():
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    torch.manual_seed(1000 + rank)
    true_w = torch.randn(CTX, N_ARMS, generator=torch.Generator().manual_seed(0)).to(device)

    policy = DDP(ContextPolicy().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)

    for it in range(2000):
        ctx = torch.randn(EPISODES, CTX, device=device)
        logits, baseline = policy(ctx)
        pi = torch.distributions.Categorical(logits=logits)
        arms = pi.sample()
        returns = play(ctx, arms, true_w)
        advantage = (returns - baseline).detach()
        loss = -(pi.log_prob(arms) * advantage).mean() + 0.5 * (baseline - returns).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        if it % 100 == 0:
            mean_return = returns.mean().detach()
            dist.all_reduce(mean_return)  # planted: PT024
            if rank == 0:
                print(f"iter {it:5d} mean return {mean_return.item():.4f}")

    if rank == 0:
        torch.save(policy.module.state_dict(), "bandit_policy.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
