"""Visual question answering (image grid features + question GRU, answer classification) with DDP.

Planted: PT010 - the per-epoch checkpoint is written by every rank, with no rank-0 guard
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

N_ANSWERS = 3129


class VQAPairs(Dataset):
    def __len__(self):
        return 443_757

    def __getitem__(self, i):
        return torch.randn(36, 2048), torch.randint(1, 20_000, (14,)), torch.rand(N_ANSWERS)


class VQAModel(nn.Module):
    def __init__(self, hidden=1024):
        super().__init__()
        self.word = nn.Embedding(20_000, 300, padding_idx=0)
        self.q_rnn = nn.GRU(300, hidden, batch_first=True)
        self.v_proj = nn.Linear(2048, hidden)
        self.att = nn.Linear(hidden, 1)
        self.classifier = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.ReLU(), nn.Dropout(0.5),
                                        nn.Linear(2 * hidden, N_ANSWERS))

    def forward(self, feats, question):
        _, q = self.q_rnn(self.word(question))
        q = q[-1]
        v = self.v_proj(feats)
        alpha = torch.softmax(self.att(torch.tanh(v * q.unsqueeze(1))), dim=1)
        return self.classifier((alpha * v).sum(1) * q)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args()

    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    model = DDP(VQAModel().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adamax(model.parameters(), lr=2e-3)

    dataset = VQAPairs()
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=8, pin_memory=True)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        score = torch.zeros(2, device=device)
        for feats, question, target in loader:
            feats = feats.to(device, non_blocking=True)
            question = question.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            logits = model(feats, question)
            loss = F.binary_cross_entropy_with_logits(logits, target) * N_ANSWERS
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            optimizer.step()
            picked = logits.argmax(1, keepdim=True)
            score[0] += target.gather(1, picked).sum()
            score[1] += target.size(0)
        dist.all_reduce(score)
        if rank == 0:
            print(f"epoch {epoch} train vqa score {(score[0] / score[1]).item():.4f}")
        torch.save(model.module.state_dict(), f"vqa_epoch{epoch}.pt")  # planted: PT010

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
