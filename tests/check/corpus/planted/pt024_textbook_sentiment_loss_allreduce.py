"""BiLSTM sentiment classifier (SST-2 style token ids) trained with DDP; loss logged every 100 steps.

Planted: PT024 - the per-rank mean loss is all_reduce'd with the default SUM and printed as the mean loss
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class BiLSTMClassifier(nn.Module):
    def __init__(self, vocab=20_000, dim=300, hidden=256, classes=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(hidden * 2, classes)

    def forward(self, ids):
        h, _ = self.lstm(self.embed(ids))
        mask = (ids != 0).unsqueeze(-1).float()
        pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.fc(pooled)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="sst2_ids.pt")
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    blob = torch.load(args.data, map_location="cpu", weights_only=True)
    dataset = TensorDataset(blob["ids"], blob["labels"])
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler)

    model = DDP(BiLSTMClassifier().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for ids, labels in loader:
            ids, labels = ids.to(device), labels.to(device)
            loss = F.cross_entropy(model(ids), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 100 == 0:
                reported = loss.detach().clone()
                dist.all_reduce(reported)  # planted: PT024
                if rank == 0:
                    print(f"epoch {epoch} step {step} mean loss {reported.item():.4f}")

    if rank == 0:
        torch.save(model.module.state_dict(), "bilstm_sst2.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
