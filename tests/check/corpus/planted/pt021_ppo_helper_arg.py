"""Data-parallel PPO update where the clipped surrogate loss is computed by a helper taking the network.

Planted: PT021 - ppo_loss(ddp_policy.module, ...) runs the training forward on the unwrapped module
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

OBS_DIM, N_ACTIONS, STEPS, N_ENVS = 16, 4, 256, 8


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(OBS_DIM, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
        self.pi = nn.Linear(128, N_ACTIONS)
        self.v = nn.Linear(128, 1)

    def forward(self, obs):
        h = self.trunk(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def ppo_loss(net, obs, actions, old_logp, adv, returns, clip=0.2):
    logits, values = net(obs)
    dist_pi = torch.distributions.Categorical(logits=logits)
    ratio = (dist_pi.log_prob(actions) - old_logp).exp()
    surr = torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    return -surr.mean() + 0.5 * (values - returns).pow(2).mean() - 0.01 * dist_pi.entropy().mean()


def rollout(policy, device):
    obs = torch.randn(STEPS, N_ENVS, OBS_DIM, device=device)
    with torch.no_grad():
        logits, values = policy(obs)
        d = torch.distributions.Categorical(logits=logits)
        actions = d.sample()
        logp = d.log_prob(actions)
    rewards = (actions == obs[..., :N_ACTIONS].argmax(-1)).float()
    returns = torch.flip(torch.cumsum(torch.flip(rewards, [0]), 0), [0])
    return obs, actions, logp, returns - values, returns


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    torch.manual_seed(rank)

    ddp_policy = DDP(Policy().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(ddp_policy.parameters(), lr=2.5e-4)

    for update in range(1000):
        obs, actions, logp, adv, returns = rollout(ddp_policy, device)
        obs, actions, logp = obs.flatten(0, 1), actions.flatten(), logp.flatten()
        adv, returns = adv.flatten(), returns.flatten()
        adv_stats = torch.stack([adv.mean(), adv.pow(2).mean()])
        dist.all_reduce(adv_stats, op=dist.ReduceOp.AVG)
        adv = (adv - adv_stats[0]) / (adv_stats[1] - adv_stats[0] ** 2).clamp_min(1e-8).sqrt()
        for _ in range(4):
            for mb in torch.randperm(obs.size(0), device=device).split(512):
                loss = ppo_loss(ddp_policy.module, obs[mb], actions[mb], logp[mb], adv[mb], returns[mb])  # planted: PT021
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(ddp_policy.parameters(), 0.5)
                optimizer.step()
        if update % 50 == 0:
            mean_ret = returns[:N_ENVS].mean().detach()
            dist.all_reduce(mean_ret)
            mean_ret /= world
            if rank == 0:
                print(f"update {update}: mean return {mean_ret.item():.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
