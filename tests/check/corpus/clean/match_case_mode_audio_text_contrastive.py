import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

CFG = {"mode": "train", "epochs": 25, "batch": 96, "lr": 1e-4, "dim": 512, "ckpt": "clap_small.pt"}


class AudioCaptions(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, 500, generator=g), torch.randint(1, 20_000, (24,), generator=g)


class CLAPSmall(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.audio = nn.Sequential(nn.Conv1d(64, 256, 5, 2), nn.GELU(), nn.Conv1d(256, 512, 5, 2), nn.GELU(),
                                   nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(512, dim))
        self.text_emb = nn.EmbeddingBag(20_000, dim)
        self.text_proj = nn.Linear(dim, dim)
        self.logit_scale = nn.Parameter(torch.tensor(2.659))

    def forward(self, mel, tokens):
        a = F.normalize(self.audio(mel), dim=-1)
        t = F.normalize(self.text_proj(self.text_emb(tokens)), dim=-1)
        return a, t, self.logit_scale.exp().clamp(max=100)


def log(msg):
    match dist.get_rank():
        case 0:
            print(msg, flush=True)
        case _:
            pass


def clip_loss(a, t, scale):
    logits = scale * a @ t.T
    labels = torch.arange(a.size(0), device=a.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


@torch.no_grad()
def retrieval_top1(model, loader, device):
    model.eval()
    hit_n = torch.zeros(2, device=device)
    for mel, tok in loader:
        a, t, _ = model(mel.to(device), tok.to(device))
        hit_n[0] += ((a @ t.T).argmax(1) == torch.arange(a.size(0), device=device)).sum()
        hit_n[1] += a.size(0)
    dist.all_reduce(hit_n)
    return (hit_n[0] / hit_n[1]).item()


def main(argv):
    for kv in argv:
        key, val = kv.split("=", 1)
        CFG[key] = type(CFG[key])(val)
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    net = CLAPSmall(CFG["dim"]).to(device)
    model = DDP(net, device_ids=[local_rank])
    val = AudioCaptions(4_000)
    val_dl = DataLoader(val, batch_size=CFG["batch"], sampler=DistributedSampler(val, shuffle=False),
                        drop_last=True)

    match CFG["mode"]:
        case "eval":
            net.load_state_dict(torch.load(CFG["ckpt"], map_location=device, weights_only=True))
            log(f"audio->text R@1 (in-batch) {retrieval_top1(model, val_dl, device):.3f}")
        case "train":
            ds = AudioCaptions(200_000)
            sampler = DistributedSampler(ds)
            dl = DataLoader(ds, batch_size=CFG["batch"], sampler=sampler, num_workers=4, drop_last=True)
            opt = torch.optim.AdamW(model.parameters(), lr=CFG["lr"], weight_decay=0.2)
            for epoch in range(CFG["epochs"]):
                sampler.set_epoch(epoch)
                model.train()
                for mel, tok in dl:
                    a, t, scale = model(mel.to(device), tok.to(device))
                    loss = clip_loss(a, t, scale)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                r1 = retrieval_top1(model, val_dl, device)
                log(f"epoch {epoch} R@1 {r1:.3f}")
                match dist.get_rank():
                    case 0:
                        torch.save(net.state_dict(), CFG["ckpt"])
        case other:
            raise SystemExit(f"unknown mode {other!r}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
