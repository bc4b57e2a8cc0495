"""Diffusion-model TrainLoop class written against `import torch as th`, launched with torchrun.

Planted: PT008 - TrainLoop._load_ema_parameters reads the EMA checkpoint with th.load(path, map_location=...) and no weights_only=.
"""
import copy
import os

import torch as th
import torch.distributed as dist
from torch.nn.parallel.distributed import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from diffusion_lib import create_model_and_diffusion, load_image_dataset


class TrainLoop:
    def __init__(self, model, diffusion, data, batch_size, lr, ema_rate, log_interval, save_interval, resume_ema=""):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = th.device("cuda", self.local_rank)
        self.diffusion = diffusion
        self.dataset = data
        self.sampler = DistributedSampler(data)
        self.loader = DataLoader(data, batch_size=batch_size, sampler=self.sampler, num_workers=1, drop_last=True)
        self.model = model.to(self.device)
        self.ema = copy.deepcopy(self.model).requires_grad_(False)
        if resume_ema:
            self._load_ema_parameters(resume_ema)
        self.ddp_model = DDP(self.model, device_ids=[self.local_rank], output_device=self.local_rank, broadcast_buffers=False)
        self.opt = th.optim.AdamW(self.model.parameters(), lr=lr)
        self.ema_rate = ema_rate
        self.log_interval = log_interval
        self.save_interval = save_interval
        self.step = 0

    def _load_ema_parameters(self, path):
        state_dict = th.load(path, map_location=self.device)  # planted: PT008
        self.ema.load_state_dict(state_dict)

    @th.no_grad()
    def _update_ema(self):
        for targ, src in zip(self.ema.parameters(), self.model.parameters()):
            targ.mul_(self.ema_rate).add_(src, alpha=1 - self.ema_rate)

    def run_step(self, batch, cond):
        t = th.randint(0, self.diffusion.num_timesteps, (batch.shape[0],), device=self.device)
        with th.autocast("cuda", dtype=th.bfloat16):
            losses = self.diffusion.training_losses(self.ddp_model, batch, t, model_kwargs=cond)
        loss = losses["loss"].mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self._update_ema()
        return loss.detach()

    def save(self):
        if dist.get_rank() == 0:
            th.save(self.model.state_dict(), f"model{self.step:06d}.pt")
            th.save(self.ema.state_dict(), f"ema_{self.ema_rate}_{self.step:06d}.pt")

    def run_loop(self, epochs):
        for epoch in range(epochs):
            self.sampler.set_epoch(epoch)
            for batch, cond in self.loader:
                batch = batch.to(self.device)
                cond = {k: v.to(self.device) for k, v in cond.items()}
                loss = self.run_step(batch, cond)
                self.step += 1
                if self.step % self.log_interval == 0:
                    dist.all_reduce(loss, op=dist.ReduceOp.AVG)
                    if dist.get_rank() == 0:
                        print(f"step {self.step}: loss {loss.item():.4f}")
                if self.step % self.save_interval == 0:
                    self.save()


def main():
    dist.init_process_group(backend="nccl")
    th.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model, diffusion = create_model_and_diffusion(image_size=64, num_channels=128, learn_sigma=True)
    data = load_image_dataset("datasets/imagenet64", image_size=64, class_cond=True)
    TrainLoop(model, diffusion, data, batch_size=64, lr=1e-4, ema_rate=0.9999, log_interval=10,
              save_interval=10000, resume_ema=os.environ.get("RESUME_EMA", "")).run_loop(epochs=200)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
