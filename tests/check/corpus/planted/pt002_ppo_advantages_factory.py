"""Synchronous PPO: every rank collects its own rollouts, gradients are averaged by DDP.

torchrun --nproc_per_node=4 ppo_ddp.py --iterations 500
Planted: PT002 - returns.to(device) dropped after building returns with torch.tensor(...)
"""
import argparse
import logging
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributions import Categorical
from torch.nn.parallel import DistributedDataParallel as DDP

log = logging.getLogger("ppo")


class ToyEnv:
    """Random-walk environment with a 4-d observation and 2 actions."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.state = np.zeros(4, dtype=np.float32)

    def reset(self):
        self.state = self.rng.normal(size=4).astype(np.float32)
        return self.state

    def step(self, action):
        self.state = self.state + (0.1 if action else -0.1) + self.rng.normal(scale=0.05, size=4).astype(np.float32)
        reward = float(-np.abs(self.state).sum())
        return self.state, reward, bool(np.abs(self.state).max() > 3.0)


class ActorCritic(nn.Module):
    def __init__(self, obs_dim=4, n_actions=2, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, n_actions)
        self.v = nn.Linear(hidden, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def discount(rewards, dones, gamma):
    out, running = [], 0.0
    for r, d in zip(reversed(rewards), reversed(dones)):
        running = r + gamma * running * (1.0 - d)
        out.append(running)
    return out[::-1]


def main(args):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    torch.manual_seed(args.seed + rank)

    env = ToyEnv(args.seed + rank)
    ac = DDP(ActorCritic().to(device), device_ids=[local_rank])
    opt = torch.optim.Adam(ac.parameters(), lr=args.lr)

    obs = env.reset()
    for it in range(args.iterations):
        obs_buf, act_buf, logp_buf, rew_buf, done_buf = [], [], [], [], []
        with torch.no_grad():
            for _ in range(args.horizon):
                o = torch.as_tensor(obs, device=device).unsqueeze(0)
                logits, _ = ac(o)
                dist_a = Categorical(logits=logits)
                a = dist_a.sample()
                obs_buf.append(o)
                act_buf.append(a)
                logp_buf.append(dist_a.log_prob(a))
                obs, r, done = env.step(int(a.item()))
                rew_buf.append(r)
                done_buf.append(float(done))
                if done:
                    obs = env.reset()
        returns = torch.tensor(discount(rew_buf, done_buf, args.gamma), dtype=torch.float32)
        returns.to(device)  # planted: PT002
        obs_t, act_t, old_logp = torch.cat(obs_buf), torch.cat(act_buf), torch.cat(logp_buf)

        for _ in range(args.ppo_epochs):
            logits, values = ac(obs_t)
            new_dist = Categorical(logits=logits)
            adv = returns - values.detach()
            ratio = (new_dist.log_prob(act_t) - old_logp).exp()
            clipped = torch.clamp(ratio, 1 - args.clip, 1 + args.clip) * adv
            loss = -torch.min(ratio * adv, clipped).mean() + 0.5 * (returns - values).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

        rollout_reward = torch.tensor(sum(rew_buf), device=device)
        dist.all_reduce(rollout_reward, op=dist.ReduceOp.AVG)
        if rank == 0 and it % 20 == 0:
            log.info("iter %d  mean rollout reward %.2f", it, rollout_reward.item())
        if rank == 0 and (it + 1) % 100 == 0:
            torch.save(ac.module.state_dict(), os.path.join(args.out, f"ppo_{it + 1}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=500)
    p.add_argument("--horizon", type=int, default=256)
    p.add_argument("--ppo-epochs", type=int, default=4)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--clip", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=".")
    logging.basicConfig(level=logging.INFO)
    main(p.parse_args())
