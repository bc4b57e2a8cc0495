import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_data(queries=20_000, docs=30, feats=136):
    x = torch.randn(queries, docs, feats)
    rel = torch.randint(0, 5, (queries, docs)).float()
    return TensorDataset(x, rel)


def ndcg_at_k(scores, rel, k=10):
    order = scores.argsort(dim=1, descending=True)[:, :k]
    gains = (2 ** rel.gather(1, order) - 1)
    disc = 1.0 / torch.log2(torch.arange(2, k + 2, device=scores.device).float())
    dcg = (gains * disc).sum(1)
    ideal = (2 ** rel.sort(dim=1, descending=True).values[:, :k] - 1) * disc
    return dcg / ideal.sum(1).clamp(min=1e-9)


def run():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    scorer = nn.Sequential(nn.Linear(136, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                           nn.Linear(128, 1)).to(device)
    model = DDP(scorer, device_ids=[local_rank])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    train, valid = make_data(), make_data(2000)
    tr_sampler = DistributedSampler(train)
    tr_loader = DataLoader(train, batch_size=256, sampler=tr_sampler)
    va_loader = DataLoader(valid, batch_size=512, sampler=DistributedSampler(valid, shuffle=False))

    best = -1.0
    steps = 0

    def say(msg):
        if rank == 0:
            print(msg, flush=True)

    def listnet_loss(scores, rel):
        return -(F.softmax(rel, dim=1) * F.log_softmax(scores, dim=1)).sum(1).mean()

    def train_epoch(epoch):
        nonlocal steps
        tr_sampler.set_epoch(epoch)
        model.train()
        for x, rel in tr_loader:
            x, rel = x.to(device), rel.to(device)
            loss = listnet_loss(model(x).squeeze(-1), rel)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1

    @torch.no_grad()
    def validate():
        model.eval()
        tot = torch.zeros(2, device=device)
        for x, rel in va_loader:
            x, rel = x.to(device), rel.to(device)
            n = ndcg_at_k(model(x).squeeze(-1), rel)
            tot += torch.stack([n.sum(), torch.tensor(float(n.numel()), device=device)])
        dist.all_reduce(tot)
        return (tot[0] / tot[1]).item()

    def maybe_save(score, epoch):
        nonlocal best
        if score <= best:
            return
        best = score
        if rank == 0:
            torch.save({"epoch": epoch, "ndcg": score, "scorer": scorer.state_dict()}, "ranker_best.pt")
        say(f"  new best nDCG@10 {score:.4f}")

    for epoch in range(40):
        train_epoch(epoch)
        score = validate()
        say(f"epoch {epoch} steps {steps} nDCG@10 {score:.4f}")
        maybe_save(score, epoch)
    dist.destroy_process_group()


if __name__ == "__main__":
    run()
