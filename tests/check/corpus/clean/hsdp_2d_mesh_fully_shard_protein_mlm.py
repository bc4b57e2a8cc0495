import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

AMINO = "ACDEFGHIKLMNPQRSTVWY"
PAD, MASK, VOCAB = 0, 1, len(AMINO) + 2


class Proteins(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        seq = torch.randint(2, VOCAB, (510,), generator=g)
        labels = torch.full_like(seq, -100)
        pick = torch.rand(seq.shape, generator=g) < 0.15
        labels[pick] = seq[pick]
        seq = seq.masked_fill(pick, MASK)
        return seq, labels


class ProteinEncoder(nn.Module):
    def __init__(self, d=1280, layers=33, heads=20):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d, padding_idx=PAD)
        self.pos = nn.Embedding(1024, d)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, 4 * d, 0.0, activation="gelu", batch_first=True, norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.lm = nn.Linear(d, VOCAB)

    def forward(self, x):
        h = self.emb(x) + self.pos(torch.arange(x.size(1), device=x.device))
        for layer in self.layers:
            h = layer(h)
        return self.lm(self.norm(h))


def main():
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    gpus_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", torch.cuda.device_count()))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    mesh = init_device_mesh("cuda", (world // gpus_per_node, gpus_per_node),
                            mesh_dim_names=("replicate", "shard"))
    model = ProteinEncoder().to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=4e-4, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LinearLR(opt, 1e-3, 1.0, total_iters=2000)

    ds = Proteins()
    sampler = DistributedSampler(ds, num_replicas=world, rank=dist.get_rank())
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=4, pin_memory=True, drop_last=True)

    step = 0
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for seq, labels in loader:
            seq, labels = seq.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            loss = F.cross_entropy(model(seq).float().flatten(0, 1), labels.flatten(), ignore_index=-100)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step % 50 == 0:
                report = loss.detach().clone()
                dist.all_reduce(report, op=dist.ReduceOp.AVG)
                if dist.get_rank() == 0:
                    print(f"epoch {epoch} step {step} mlm loss {report.item():.4f}")
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() == 0:
            torch.save(full, f"protein_mlm_epoch{epoch}.pt")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
