"""Masked-LM pretraining of a small BERT on pre-tokenized shards, DDP + bf16.

Planted: PT004 - loader_kwargs carries "shuffle": True into a DataLoader that also gets sampler=.
"""
import glob
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import ConcatDataset, DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from transformers import BertConfig, BertForMaskedLM


class ShardDataset(Dataset):
    def __init__(self, path):
        self.ids = torch.load(path, map_location="cpu", weights_only=True)

    def __len__(self):
        return self.ids.size(0)

    def __getitem__(self, i):
        return self.ids[i]


def mask_tokens(input_ids, mask_id=103, prob=0.15):
    labels = input_ids.clone()
    mask = torch.rand(input_ids.shape, device=input_ids.device) < prob
    labels[~mask] = -100
    input_ids = input_ids.masked_fill(mask, mask_id)
    return input_ids, labels


def main(data_dir="shards", epochs=4, lr=1e-4):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    is_master = dist.get_rank() == 0

    dataset = ConcatDataset([ShardDataset(p) for p in sorted(glob.glob(os.path.join(data_dir, "*.pt")))])
    sampler = DistributedSampler(dataset, seed=0)
    loader_kwargs = {"batch_size": 32, "num_workers": 4, "pin_memory": True, "shuffle": True, "drop_last": True}
    loader = DataLoader(dataset, sampler=sampler, **loader_kwargs)  # planted: PT004

    model = BertForMaskedLM(BertConfig(num_hidden_layers=6, hidden_size=512, num_attention_heads=8, intermediate_size=2048))
    model = DDP(model.to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=epochs * len(loader))

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        tot = torch.zeros(2, device=device)
        for input_ids in loader:
            input_ids = input_ids.to(device, non_blocking=True)
            input_ids, labels = mask_tokens(input_ids)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=input_ids, labels=labels).loss
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            tot[0] += loss.detach()
            tot[1] += 1
        dist.all_reduce(tot)
        if is_master:
            print(f"epoch {epoch}: mlm loss {(tot[0] / tot[1]).item():.4f}")
            torch.save({"model": model.module.state_dict(), "epoch": epoch}, "bert_mlm.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
