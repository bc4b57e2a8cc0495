"""Two-stage training (pretrain the encoder, then fine-tune), with save/load helpers in a utils section.

Planted: PT026 - save_checkpoint() writes only on the main process, and load_checkpoint() of the same file follows on every rank with no barrier
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from molecules import GraphEncoder, MoleculeDataset, collate_graphs


# ---------------------------------------------------------------- utils
def is_main_process():
    return dist.get_rank() == 0


def save_checkpoint(module, path):
    if not is_main_process():
        return
    torch.save({"model": module.state_dict()}, path)


def load_checkpoint(module, path, device):
    ckpt = torch.load(path, map_location=device, weights_only=True)
    module.load_state_dict(ckpt["model"], strict=False)


def reduce_mean(total, count, device):
    t = torch.tensor([total, count], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t[0] / t[1]).item()


# ---------------------------------------------------------------- stages
def train_stage(model, loader, device, epochs, lr, loss_fn, tag):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        model.train()
        total, count = 0.0, 0
        for batch in loader:
            batch = batch.to(device)
            loss = loss_fn(model, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
            count += 1
        mean_loss = reduce_mean(total, count, device)
        if is_main_process():
            print(f"[{tag}] epoch {epoch} loss {mean_loss:.4f}")


def masked_atom_loss(model, batch):
    logits = model(batch, mask=batch.atom_mask)
    return F.cross_entropy(logits[batch.atom_mask], batch.atom_type[batch.atom_mask])


def property_loss(model, batch):
    return F.mse_loss(model(batch).squeeze(-1), batch.y)


def main():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    pre_ds = MoleculeDataset("/data/zinc15", task="pretrain")
    ft_ds = MoleculeDataset("/data/qm9", task="regression")
    pre_loader = DataLoader(pre_ds, batch_size=256, sampler=DistributedSampler(pre_ds),
                            collate_fn=collate_graphs)
    ft_loader = DataLoader(ft_ds, batch_size=64, sampler=DistributedSampler(ft_ds),
                           collate_fn=collate_graphs)

    encoder = GraphEncoder(hidden=300, layers=5, heads={"atom": 119}).to(device)
    model = DDP(encoder, device_ids=[local_rank])
    train_stage(model, pre_loader, device, epochs=100, lr=1e-3, loss_fn=masked_atom_loss, tag="pretrain")
    save_checkpoint(model.module, "encoder_pretrained.pt")

    finetune = GraphEncoder(hidden=300, layers=5, heads={"property": 1}).to(device)
    load_checkpoint(finetune, "encoder_pretrained.pt", device)  # planted: PT026
    ft_model = DDP(finetune, device_ids=[local_rank])
    train_stage(ft_model, ft_loader, device, epochs=50, lr=1e-4, loss_fn=property_loss, tag="finetune")
    save_checkpoint(ft_model.module, "encoder_qm9.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
