"""DQN agent on a toy grid environment; the Q-network is spread over local GPUs inside the agent class.

python dqn.py --episodes 2000
Planted: PT014 - DQNAgent wraps self.q_net in nn.DataParallel when more than one GPU is visible
"""
import argparse
import logging
import random
from collections import deque

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

log = logging.getLogger("dqn")


class GridEnv:
    def __init__(self, size=8, seed=0):
        self.size, self.rng = size, np.random.default_rng(seed)

    def reset(self):
        self.pos = self.rng.integers(0, self.size, 2)
        self.goal = self.rng.integers(0, self.size, 2)
        return self._obs()

    def _obs(self):
        return np.concatenate([self.pos, self.goal]).astype(np.float32) / self.size

    def step(self, a):
        self.pos = np.clip(self.pos + [(0, 1), (1, 0), (0, -1), (-1, 0)][a], 0, self.size - 1)
        done = bool((self.pos == self.goal).all())
        return self._obs(), (1.0 if done else -0.01), done


class DQNAgent:
    def __init__(self, obs_dim=4, n_actions=4, gamma=0.99, lr=1e-3):
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.q_net = nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, n_actions)).to(self.device)
        self.target_net = nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, n_actions)).to(self.device)
        if torch.cuda.device_count() > 1:
            self.q_net = nn.DataParallel(self.q_net)  # planted: PT014
        self.sync_target()
        self.optimizer = torch.optim.Adam(self.q_net.parameters(), lr=lr)
        self.memory = deque(maxlen=50000)
        self.gamma, self.n_actions = gamma, n_actions

    def _raw(self):
        return getattr(self.q_net, "module", self.q_net)

    def sync_target(self):
        self.target_net.load_state_dict(self._raw().state_dict())

    def act(self, obs, eps):
        if random.random() < eps:
            return random.randrange(self.n_actions)
        with torch.no_grad():
            q = self.q_net(torch.as_tensor(obs, device=self.device).unsqueeze(0))
        return int(q.argmax(1).item())

    def learn(self, batch_size=256):
        if len(self.memory) < batch_size:
            return None
        obs, act, rew, nxt, done = map(np.array, zip(*random.sample(self.memory, batch_size)))
        obs = torch.as_tensor(obs, device=self.device)
        nxt = torch.as_tensor(nxt, device=self.device)
        act = torch.as_tensor(act, device=self.device)
        rew = torch.as_tensor(rew, dtype=torch.float32, device=self.device)
        done = torch.as_tensor(done, dtype=torch.float32, device=self.device)
        q = self.q_net(obs).gather(1, act.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            target = rew + self.gamma * (1 - done) * self.target_net(nxt).max(1).values
        loss = F.smooth_l1_loss(q, target)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


def main(args):
    env, agent = GridEnv(), DQNAgent()
    for ep in range(args.episodes):
        obs, total = env.reset(), 0.0
        eps = max(0.05, 1.0 - ep / (0.5 * args.episodes))
        for _ in range(200):
            a = agent.act(obs, eps)
            nxt, r, done = env.step(a)
            agent.memory.append((obs, a, r, nxt, float(done)))
            agent.learn()
            obs, total = nxt, total + r
            if done:
                break
        if ep % args.target_every == 0:
            agent.sync_target()
        if ep % 100 == 0:
            log.info("episode %d return %.2f eps %.2f", ep, total, eps)
    torch.save(agent._raw().state_dict(), args.out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--target-every", type=int, default=20)
    parser.add_argument("--out", default="dqn_qnet.pt")
    logging.basicConfig(level=logging.INFO)
    main(parser.parse_args())
