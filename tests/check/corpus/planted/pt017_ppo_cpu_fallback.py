"""Synchronous data-parallel PPO on a toy continuous-control task, one process per worker.

Planted: PT017 - backend is always "nccl" although the device falls back to CPU when CUDA is missing
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

OBS, ACT, HORIZON, ENVS = 8, 2, 128, 16


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(OBS, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.mu = nn.Linear(64, ACT)
        self.log_std = nn.Parameter(torch.zeros(ACT))
        self.v = nn.Linear(64, 1)

    def forward(self, obs):
        h = self.body(obs)
        return torch.distributions.Normal(self.mu(h), self.log_std.exp()), self.v(h).squeeze(-1)


def toy_env_step(obs, action):
    nxt = obs + 0.1 * torch.cat([action, action, action, action], dim=-1)
    return nxt, -(nxt ** 2).sum(-1)


def normalize_advantages(adv, device):
    stats = torch.stack([adv.sum(), (adv ** 2).sum(), torch.tensor(float(adv.numel()), device=device)])
    dist.all_reduce(stats)
    mean = stats[0] / stats[2]
    std = (stats[1] / stats[2] - mean ** 2).clamp_min(1e-8).sqrt()
    return (adv - mean) / std


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    dist.init_process_group(backend="nccl")  # planted: PT017
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rank = dist.get_rank()
    torch.manual_seed(1234 + rank)

    agent = ActorCritic().to(device)
    agent = DDP(agent, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(agent.parameters(), lr=3e-4, eps=1e-5)
    obs = torch.randn(ENVS, OBS, device=device)

    for update in range(500):
        buf_obs, buf_act, buf_logp, buf_rew, buf_val = [], [], [], [], []
        with torch.no_grad():
            for _ in range(HORIZON):
                dist_pi, value = agent(obs)
                action = dist_pi.sample()
                buf_obs.append(obs)
                buf_act.append(action)
                buf_logp.append(dist_pi.log_prob(action).sum(-1))
                buf_val.append(value)
                obs, reward = toy_env_step(obs, action)
                buf_rew.append(reward)
        rewards, values = torch.stack(buf_rew), torch.stack(buf_val)
        returns = torch.zeros_like(rewards)
        running = torch.zeros(ENVS, device=device)
        for t in reversed(range(HORIZON)):
            running = rewards[t] + 0.99 * running
            returns[t] = running
        adv = normalize_advantages(returns - values, device).flatten()
        b_obs, b_act = torch.stack(buf_obs).flatten(0, 1), torch.stack(buf_act).flatten(0, 1)
        b_logp, b_ret = torch.stack(buf_logp).flatten(), returns.flatten()

        for _ in range(4):
            perm = torch.randperm(b_obs.size(0), device=device)
            for mb in perm.split(256):
                new_dist, new_v = agent(b_obs[mb])
                ratio = (new_dist.log_prob(b_act[mb]).sum(-1) - b_logp[mb]).exp()
                pg = -torch.min(ratio * adv[mb], ratio.clamp(0.8, 1.2) * adv[mb]).mean()
                loss = pg + 0.5 * (new_v - b_ret[mb]).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optimizer.step()

        if update % 20 == 0:
            ret = torch.stack([rewards.sum(0).sum(), torch.tensor(float(ENVS), device=device)])
            dist.all_reduce(ret)
            if rank == 0:
                print(f"update {update} mean episode return {(ret[0] / ret[1]).item():.3f}")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
