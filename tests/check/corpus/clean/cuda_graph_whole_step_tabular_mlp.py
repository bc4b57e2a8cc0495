"""Whole-iteration CUDA graph capture (forward, backward, optimizer) under DDP."""
import os

os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

BATCH, FEATS, CLASSES = 1024, 256, 10
WARMUP_ITERS = 11


def build_model():
    return nn.Sequential(
        nn.Linear(FEATS, 1024), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(1024, 1024), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(1024, CLASSES),
    )


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    dev = torch.device("cuda", local_rank)
    leader = dist.get_rank() == 0

    ds = TensorDataset(torch.randn(400_000, FEATS), torch.randint(0, CLASSES, (400_000,)))
    sampler = DistributedSampler(ds, drop_last=True)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, drop_last=True, pin_memory=True)

    net = build_model().to(dev)
    model = DDP(net, device_ids=[local_rank])
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)

    static_x = torch.randn(BATCH, FEATS, device=dev)
    static_y = torch.randint(0, CLASSES, (BATCH,), device=dev)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_ITERS):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_out = model(static_x)
        static_loss = loss_fn(static_out, static_y)
        static_loss.backward()
        opt.step()

    for epoch in range(20):
        sampler.set_epoch(epoch)
        loss_sum = torch.zeros((), device=dev)
        correct = torch.zeros((), device=dev)
        seen = 0
        for x, y in loader:
            static_x.copy_(x, non_blocking=True)
            static_y.copy_(y, non_blocking=True)
            graph.replay()
            loss_sum += static_loss.detach()
            correct += (static_out.detach().argmax(1) == static_y).sum()
            seen += 1
        stats = torch.stack([loss_sum, correct, torch.tensor(float(seen), device=dev)])
        dist.all_reduce(stats)
        if leader:
            mean_loss = stats[0] / stats[2]
            acc = stats[1] / (stats[2] * BATCH)
            print(f"epoch {epoch}: loss {mean_loss.item():.4f} acc {acc.item():.4f}")
    if leader:
        torch.save(net.state_dict(), "graphed_mlp.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
