"""Sentence-embedding training (in-batch negatives) that logs the averaged loss every N steps.

Planted: PT028 - loss_t = torch.tensor(loss.item()) turns the loss back into a CPU tensor that is all_reduced with nccl
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModel, AutoTokenizer

from pairs import NliPairs, make_collate


class MeanPooler(torch.nn.Module):
    def __init__(self, name):
        super().__init__()
        self.encoder = AutoModel.from_pretrained(name)

    def forward(self, input_ids, attention_mask):
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).float()
        return F.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-6), dim=-1)


def main():
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    name = "microsoft/MiniLM-L12-H384-uncased"
    tokenizer = AutoTokenizer.from_pretrained(name)
    dataset = NliPairs("/data/allnli.jsonl")
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=128, sampler=sampler, collate_fn=make_collate(tokenizer))

    model = DDP(MeanPooler(name).to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    scale = 20.0

    step = 0
    for epoch in range(3):
        sampler.set_epoch(epoch)
        model.train()
        for batch in loader:
            anchor = {k: v.to(device) for k, v in batch["anchor"].items()}
            positive = {k: v.to(device) for k, v in batch["positive"].items()}
            a = model(**anchor)
            p = model(**positive)
            scores = a @ p.t() * scale
            loss = F.cross_entropy(scores, torch.arange(a.size(0), device=device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1

            if step % 50 == 0:
                loss_t = torch.tensor(loss.item())
                dist.all_reduce(loss_t, op=dist.ReduceOp.AVG)  # planted: PT028
                if rank == 0:
                    print(f"epoch {epoch} step {step} loss {loss_t.item():.4f}")

        if rank == 0:
            torch.save(model.module.state_dict(), f"minilm_nli_e{epoch}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
