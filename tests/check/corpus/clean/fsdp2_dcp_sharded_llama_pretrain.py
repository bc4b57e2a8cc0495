import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

CKPT_ROOT = os.environ.get("CKPT_ROOT", "/checkpoints/llama_small")
VOCAB, DIM, LAYERS, HEADS, SEQ = 32000, 1024, 16, 16, 2048


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = RMSNorm(DIM), RMSNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.o = nn.Linear(DIM, DIM, bias=False)
        self.w12 = nn.Linear(DIM, 2 * 2816, bias=False)
        self.w3 = nn.Linear(2816, DIM, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, HEADS, -1).transpose(1, 3).unbind(2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, DIM))
        g, u = self.w12(self.n2(x)).chunk(2, -1)
        return x + self.w3(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(DIM)
        self.out = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx):
        h = self.tok(idx)
        for layer in self.layers:
            h = layer(h)
        return self.out(self.norm(h))


def token_batches(rank, world, batch, device):
    g = torch.Generator().manual_seed(1000 + rank)
    while True:
        chunk = torch.randint(0, VOCAB, (batch, SEQ + 1), generator=g)
        chunk = chunk.pin_memory().to(device, non_blocking=True)
        yield chunk[:, :-1], chunk[:, 1:]


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("dp",))
    device = torch.device("cuda", local_rank)

    with torch.device("meta"):
        model = Llama()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to_empty(device=device)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        elif isinstance(m, RMSNorm):
            nn.init.ones_(m.w)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)

    step = 0
    latest = os.path.join(CKPT_ROOT, "latest")
    if os.path.isdir(latest):
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "step": torch.zeros((), dtype=torch.long)}
        dcp.load(state, checkpoint_id=latest)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = int(state["step"])

    data = token_batches(rank, world, 4, device)
    t0 = time.perf_counter()
    while step < 20_000:
        x, y = next(data)
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        gnorm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if hasattr(gnorm, "full_tensor"):
            gnorm = gnorm.full_tensor()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % 10 == 0:
            avg = loss.detach().clone()
            dist.all_reduce(avg, op=dist.ReduceOp.AVG)
            if rank == 0:
                tps = 10 * 4 * SEQ * world / (time.perf_counter() - t0)
                print(f"step {step} loss {avg.item():.4f} gnorm {gnorm.item():.2f} tok/s {tps:,.0f}")
            t0 = time.perf_counter()
        if step % 1000 == 0:
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd, "step": torch.tensor(step)},
                     checkpoint_id=os.path.join(CKPT_ROOT, f"step_{step}"))
            dist.barrier()
            if rank == 0:
                if os.path.islink(latest):
                    os.unlink(latest)
                os.symlink(f"step_{step}", latest)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
