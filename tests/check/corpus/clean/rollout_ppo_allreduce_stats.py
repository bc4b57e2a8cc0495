"""Multi-GPU PPO: each rank collects its own rollouts, advantages are normalised with global stats."""
import argparse
import os
import random
import time

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributions import Categorical
from torch.nn.parallel import DistributedDataParallel as DDP


class ActorCritic(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.pi = nn.Linear(64, n_actions)
        self.v = nn.Linear(64, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def global_mean_std(x, device):
    stats = torch.stack([x.sum(), (x * x).sum(), torch.tensor(float(x.numel()), device=device)])
    dist.all_reduce(stats, op=dist.ReduceOp.SUM)
    mean = stats[0] / stats[2]
    var = stats[1] / stats[2] - mean * mean
    return mean, var.clamp(min=1e-8).sqrt()


def main(args):
    local_rank = int(os.environ["LOCAL_RANK"])
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = torch.device("cuda", local_rank)
    seed = args.seed + 1000 * rank
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(args.seed)

    envs = gym.vector.SyncVectorEnv([lambda: gym.make(args.env_id) for _ in range(args.num_envs)])
    obs_dim = envs.single_observation_space.shape[0]
    agent = DDP(ActorCritic(obs_dim, envs.single_action_space.n).to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)

    T, N = args.num_steps, args.num_envs
    obs_buf = torch.zeros((T, N, obs_dim), device=device)
    act_buf = torch.zeros((T, N), dtype=torch.long, device=device)
    logp_buf, rew_buf, done_buf, val_buf = (torch.zeros((T, N), device=device) for _ in range(4))

    next_obs, _ = envs.reset(seed=seed)
    next_obs = torch.as_tensor(next_obs, dtype=torch.float32, device=device)
    next_done = torch.zeros(N, device=device)
    ep_returns = torch.zeros(2, device=device)
    running = np.zeros(N)
    start = time.time()

    for update in range(1, args.num_updates + 1):
        for t in range(T):
            obs_buf[t], done_buf[t] = next_obs, next_done
            with torch.no_grad():
                logits, value = agent(next_obs)
            dist_a = Categorical(logits=logits)
            action = dist_a.sample()
            act_buf[t], logp_buf[t], val_buf[t] = action, dist_a.log_prob(action), value
            o, r, term, trunc, _ = envs.step(action.cpu().numpy())
            running += r
            done = np.logical_or(term, trunc)
            for k in np.nonzero(done)[0]:
                ep_returns[0] += float(running[k])
                ep_returns[1] += 1
                running[k] = 0.0
            rew_buf[t] = torch.as_tensor(r, device=device, dtype=torch.float32)
            next_obs = torch.as_tensor(o, dtype=torch.float32, device=device)
            next_done = torch.as_tensor(done, dtype=torch.float32, device=device)

        with torch.no_grad():
            _, next_value = agent(next_obs)
            adv = torch.zeros_like(rew_buf)
            lastgae = torch.zeros(N, device=device)
            for t in reversed(range(T)):
                nonterm = 1.0 - (next_done if t == T - 1 else done_buf[t + 1])
                nv = next_value if t == T - 1 else val_buf[t + 1]
                delta = rew_buf[t] + args.gamma * nv * nonterm - val_buf[t]
                lastgae = delta + args.gamma * args.lam * nonterm * lastgae
                adv[t] = lastgae
            returns = adv + val_buf
            mean, std = global_mean_std(adv, device)
            adv = (adv - mean) / std

        b_obs, b_act, b_logp = obs_buf.reshape(-1, obs_dim), act_buf.reshape(-1), logp_buf.reshape(-1)
        b_adv, b_ret = adv.reshape(-1), returns.reshape(-1)
        mb = (T * N) // args.num_minibatches
        for _ in range(args.update_epochs):
            perm = torch.randperm(T * N, device=device)
            for s in range(0, T * N, mb):
                idx = perm[s:s + mb]
                logits, v = agent(b_obs[idx])
                d = Categorical(logits=logits)
                ratio = (d.log_prob(b_act[idx]) - b_logp[idx]).exp()
                pg = torch.max(-b_adv[idx] * ratio, -b_adv[idx] * ratio.clamp(1 - args.clip, 1 + args.clip)).mean()
                loss = pg + 0.5 * ((v - b_ret[idx]) ** 2).mean() - 0.01 * d.entropy().mean()
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optimizer.step()

        dist.all_reduce(ep_returns)
        if rank == 0 and ep_returns[1] > 0:
            sps = int(update * T * N * dist.get_world_size() / (time.time() - start))
            print(f"update {update}: mean episodic return {(ep_returns[0] / ep_returns[1]).item():.1f}, SPS {sps}")
        ep_returns.zero_()

    if rank == 0:
        torch.save(agent.module.state_dict(), f"ppo_{args.env_id}.pt")
    envs.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--env-id", default="CartPole-v1")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--num-updates", type=int, default=500)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=2.5e-4)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--lam", type=float, default=0.95)
    p.add_argument("--clip", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=1)
    main(p.parse_args())
