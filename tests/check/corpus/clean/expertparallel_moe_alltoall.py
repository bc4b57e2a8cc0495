"""Expert-parallel mixture-of-experts layer: one expert per rank, tokens exchanged with all_to_all."""
import os

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn as nn
import torch.nn.functional as F


class ExpertParallelMoE(nn.Module):
    def __init__(self, dim, hidden, world, rank):
        super().__init__()
        self.world, self.rank = world, rank
        self.router = nn.Linear(dim, world, bias=False)
        self.expert = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x):
        gates = F.softmax(self.router(x), dim=-1)
        weight, dest = gates.max(dim=-1)
        order = torch.argsort(dest)
        x_sorted = x[order]
        send_counts = torch.bincount(dest, minlength=self.world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        recv = dist_fn.all_to_all_single(
            torch.empty(int(recv_counts.sum()), x.size(-1), device=x.device, dtype=x.dtype), x_sorted,
            output_split_sizes=recv_counts.tolist(), input_split_sizes=send_counts.tolist())
        processed = self.expert(recv)
        back = dist_fn.all_to_all_single(
            torch.empty_like(x_sorted), processed,
            output_split_sizes=send_counts.tolist(), input_split_sizes=recv_counts.tolist())
        out = torch.empty_like(back)
        out[order] = back
        aux = self.world * (gates.mean(0) * F.one_hot(dest, self.world).float().mean(0)).sum()
        return out * weight.unsqueeze(-1), aux


class MoEClassifier(nn.Module):
    def __init__(self, world, rank, dim=256, n_cls=10):
        super().__init__()
        self.inp = nn.Linear(128, dim)
        self.moe = ExpertParallelMoE(dim, 4 * dim, world, rank)
        self.out = nn.Linear(dim, n_cls)

    def forward(self, x):
        h = F.gelu(self.inp(x))
        m, aux = self.moe(h)
        return self.out(h + m), aux

    def shared_parameters(self):
        return [p for n, p in self.named_parameters() if not n.startswith("moe.expert.")]


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank)

    torch.manual_seed(0)
    model = MoEClassifier(world, rank).to(device)
    torch.manual_seed(100 + rank)
    for p in model.moe.expert.parameters():
        nn.init.normal_(p, std=0.02)
    for p in model.shared_parameters():
        dist.broadcast(p.data, src=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(rank)
    for step in range(2000):
        x = torch.randn(512, 128, generator=g).to(device)
        y = (x[:, :10].argmax(-1)).to(device)
        logits, aux = model(x)
        loss = F.cross_entropy(logits, y) + 0.01 * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for p in model.shared_parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        opt.step()
        if step % 100 == 0:
            report = torch.stack([loss.detach(), aux.detach()])
            dist.all_reduce(report, op=dist.ReduceOp.AVG)
            if rank == 0:
                print(f"step {step}: loss {report[0].item():.4f} balance {report[1].item():.3f}")

    torch.save(model.moe.expert.state_dict(), f"expert_{rank}_of_{world}.pt")
    if rank == 0:
        shared = {n: p for n, p in model.state_dict().items() if not n.startswith("moe.expert.")}
        torch.save(shared, "moe_shared.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
