"""Text classifier fine-tuning with DDP and gradient accumulation (textbook loop).

Planted: PT022 - optimizer.zero_grad() runs on every micro-batch while optimizer.step() runs only when (i + 1) % accumulation_steps == 0
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class BagOfWords(nn.Module):
    def __init__(self, vocab=30000, dim=256, classes=4):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.fc = nn.Linear(dim, classes)

    def forward(self, ids):
        return self.fc(self.emb(ids))


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    accumulation_steps = 8

    ids = torch.randint(0, 30000, (120000, 64))
    labels = torch.randint(0, 4, (120000,))
    dataset = TensorDataset(ids, labels)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    model = DDP(BagOfWords().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(5):
        sampler.set_epoch(epoch)
        model.train()
        for i, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()  # planted: PT022
            loss = criterion(model(x), y)
            loss = loss / accumulation_steps
            loss.backward()
            if (i + 1) % accumulation_steps == 0:
                optimizer.step()
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), f"bow_epoch{epoch}.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
