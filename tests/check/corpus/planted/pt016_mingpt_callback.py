"""Character-level GPT training with a minGPT-like Trainer that fires callbacks, run under DDP.

Planted: PT016 - the on_batch_end callback every rank runs prints the iteration loss
"""
import os
import time
from collections import defaultdict

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from mingpt.model import GPT
from chardataset import CharDataset


class Trainer:
    def __init__(self, config, model, train_dataset):
        self.config = config
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        self.model = DDP(model.to(self.device), device_ids=[self.local_rank])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config["learning_rate"],
                                           betas=(0.9, 0.95))
        self.sampler = DistributedSampler(train_dataset)
        self.loader = DataLoader(train_dataset, sampler=self.sampler, pin_memory=True,
                                 batch_size=config["batch_size"], num_workers=config["num_workers"])
        self.callbacks = defaultdict(list)
        self.iter_num = 0
        self.iter_dt = 0.0
        self.loss = None

    def add_callback(self, onevent, callback):
        self.callbacks[onevent].append(callback)

    def trigger_callbacks(self, onevent):
        for callback in self.callbacks.get(onevent, []):
            callback(self)

    def run(self):
        self.model.train()
        epoch = 0
        self.sampler.set_epoch(epoch)
        data_iter = iter(self.loader)
        t0 = time.time()
        while self.iter_num < self.config["max_iters"]:
            try:
                x, y = next(data_iter)
            except StopIteration:
                epoch += 1
                self.sampler.set_epoch(epoch)
                data_iter = iter(self.loader)
                x, y = next(data_iter)
            x = x.to(self.device)
            y = y.to(self.device)
            _, self.loss = self.model(x, y)
            self.optimizer.zero_grad(set_to_none=True)
            self.loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config["grad_norm_clip"])
            self.optimizer.step()
            self.trigger_callbacks("on_batch_end")
            self.iter_num += 1
            t1 = time.time()
            self.iter_dt, t0 = t1 - t0, t1


def batch_end_callback(trainer):
    if trainer.iter_num % 100 == 0:
        print(f"iter_dt {trainer.iter_dt * 1000:.2f}ms; iter {trainer.iter_num}: train loss {trainer.loss.item():.5f}")  # planted: PT016
    if trainer.iter_num % 500 == 0 and (rank := dist.get_rank()) == 0:
        torch.save(trainer.model.module.state_dict(), os.path.join("out", "model.pt"))


def main():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend="nccl")
    text = open("input.txt", "r").read()
    train_dataset = CharDataset(text, block_size=128)
    model = GPT(GPT.get_default_config(vocab_size=train_dataset.get_vocab_size(), block_size=128))
    config = {"learning_rate": 5e-4, "batch_size": 64, "num_workers": 4,
              "max_iters": 10000, "grad_norm_clip": 1.0}
    trainer = Trainer(config, model, train_dataset)
    trainer.add_callback("on_batch_end", batch_end_callback)
    trainer.run()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
