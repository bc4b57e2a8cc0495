import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

VOCAB = 30522


class QAPairs(Dataset):
    def __init__(self, n, seed):
        self.n, self.seed = n, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 10_000_000 + i)
        return i, torch.randint(1, VOCAB, (32,), generator=g), torch.randint(1, VOCAB, (128,), generator=g)


class Encoder(nn.Module):
    def __init__(self, dim=384):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        layer = nn.TransformerEncoderLayer(dim, 6, 4 * dim, batch_first=True)
        self.tf = nn.TransformerEncoder(layer, 4)

    def forward(self, ids):
        return F.normalize(self.tf(self.emb(ids))[:, 0], dim=-1)


class BiEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.p = Encoder(), Encoder()

    def forward(self, q_ids, p_ids):
        return self.q(q_ids), self.p(p_ids)


@torch.no_grad()
def evaluate(model, loader, device, ks=(1, 5, 20)):
    """Encode the local shard, gather everything with all_gather_object, score on rank 0."""
    model.eval()
    local = []
    for idx, q, p in loader:
        qv, pv = model.module(q.to(device), p.to(device))
        local.extend(zip(idx.tolist(), qv.cpu(), pv.cpu()))
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    result = None
    if dist.get_rank() == 0:
        uniq = {}
        for part in gathered:
            for i, qv, pv in part:
                uniq[i] = (qv, pv)
        ids = sorted(uniq)
        Q = torch.stack([uniq[i][0] for i in ids])
        P = torch.stack([uniq[i][1] for i in ids])
        ranks = (Q @ P.T).argsort(dim=1, descending=True)
        gold = torch.arange(len(ids)).unsqueeze(1)
        result = {f"R@{k}": (ranks[:, :k] == gold).any(1).float().mean().item() for k in ks}
    box = [result]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    train, dev_set = QAPairs(500_000, 0), QAPairs(5_000, 1)
    train_sampler = DistributedSampler(train)
    train_loader = DataLoader(train, batch_size=128, sampler=train_sampler, num_workers=4, drop_last=True)
    dev_loader = DataLoader(dev_set, batch_size=256, sampler=DistributedSampler(dev_set, shuffle=False))

    bi = BiEncoder().to(device)
    model = DDP(bi, device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    best = 0.0
    for epoch in range(10):
        train_sampler.set_epoch(epoch)
        model.train()
        for _, q, p in train_loader:
            qv, pv = model(q.to(device), p.to(device))
            scores = qv @ pv.T / 0.05
            loss = F.cross_entropy(scores, torch.arange(scores.size(0), device=device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        metrics = evaluate(model, dev_loader, device)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}", " ".join(f"{k}={v:.3f}" for k, v in metrics.items()))
            if metrics["R@20"] > best:
                torch.save(bi.state_dict(), "dpr_best.pt")
        best = max(best, metrics["R@20"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
