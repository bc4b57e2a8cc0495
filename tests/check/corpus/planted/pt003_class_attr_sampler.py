"""minGPT-style Trainer class for a character-level language model, launched with torchrun.

Planted: PT003 - self.train_sampler is built in __init__ but the loader in run() is made without it.
"""
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from mingpt.model import GPT


@dataclass
class TrainerConfig:
    max_epochs: int = 10
    batch_size: int = 64
    learning_rate: float = 3e-4
    grad_norm_clip: float = 1.0
    num_workers: int = 4
    ckpt_path: str = "chargpt.pt"


class CharDataset(Dataset):
    def __init__(self, text, block_size):
        chars = sorted(set(text))
        self.stoi = {ch: i for i, ch in enumerate(chars)}
        self.block_size = block_size
        self.data = text

    def __len__(self):
        return len(self.data) - self.block_size

    def __getitem__(self, idx):
        dix = [self.stoi[s] for s in self.data[idx:idx + self.block_size + 1]]
        return torch.tensor(dix[:-1], dtype=torch.long), torch.tensor(dix[1:], dtype=torch.long)


class Trainer:
    def __init__(self, config, model, train_dataset):
        self.config = config
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.rank = dist.get_rank()
        self.device = torch.device("cuda", self.local_rank)
        self.raw_model = model.to(self.device)
        self.model = DDP(self.raw_model, device_ids=[self.local_rank])
        self.train_dataset = train_dataset
        self.train_sampler = DistributedSampler(train_dataset, seed=1234)  # planted: PT003
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.learning_rate, betas=(0.9, 0.95))

    def save_checkpoint(self):
        if self.rank == 0:
            torch.save(self.raw_model.state_dict(), self.config.ckpt_path)

    def run_epoch(self, loader, epoch):
        self.model.train()
        total = torch.zeros(2, device=self.device)
        for x, y in loader:
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                logits, loss = self.model(x, y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_norm_clip)
            self.optimizer.step()
            total[0] += loss.detach()
            total[1] += 1
        dist.all_reduce(total)
        if self.rank == 0:
            mean_loss = (total[0] / total[1]).item()
            print(f"epoch {epoch + 1}: loss {mean_loss:.4f} ppl {math.exp(mean_loss):.2f}")

    def run(self):
        cfg = self.config
        loader = DataLoader(self.train_dataset, batch_size=cfg.batch_size, shuffle=True, pin_memory=True, num_workers=cfg.num_workers)
        for epoch in range(cfg.max_epochs):
            self.train_sampler.set_epoch(epoch)
            self.run_epoch(loader, epoch)
            self.save_checkpoint()


if __name__ == "__main__":
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    with open("input.txt") as f:
        text = f.read()
    dataset = CharDataset(text, block_size=128)
    gpt = GPT(GPT.get_default_config())
    Trainer(TrainerConfig(), gpt, dataset).run()
    dist.destroy_process_group()
