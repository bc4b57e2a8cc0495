"""Streams (jpg, json) pairs out of tar shards, WebDataset style, without the library."""
import io
import json
import os
import random
import tarfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
import torchvision.transforms as T
from PIL import Image
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

SHARDS = [f"/datasets/aesthetics/shard-{i:05d}.tar" for i in range(512)]
SAMPLES_PER_RANK_EPOCH = 40_000


def split_by_rank(urls, rank, world):
    yield from urls[rank::world]


def split_by_worker(urls):
    info = get_worker_info()
    if info is None:
        yield from urls
    else:
        yield from every_nth(urls, info.id, info.num_workers)


def every_nth(seq, start, step):
    for i, item in enumerate(seq):
        if i % step == start:
            yield item


def tar_samples(url):
    with tarfile.open(url) as tar:
        current, parts = None, {}
        for member in tar:
            key, ext = member.name.rsplit(".", 1)
            if current is not None and key != current:
                yield parts
                parts = {}
            current = key
            parts[ext] = tar.extractfile(member).read()
        if parts:
            yield parts


def shuffle_buffer(it, size, rng):
    buf = []
    for x in it:
        buf.append(x)
        if len(buf) >= size:
            yield buf.pop(rng.randrange(len(buf)))
    rng.shuffle(buf)
    yield from buf


class TarStream(IterableDataset):
    def __init__(self, rank, world, transform):
        self.rank, self.world, self.tf = rank, world, transform
        self.epoch = 0

    def __iter__(self):
        info = get_worker_info()
        nw = info.num_workers if info else 1
        rng = random.Random(1000 * self.epoch + self.rank * 7 + (info.id if info else 0))
        urls = list(split_by_rank(SHARDS, self.rank, self.world))
        rng.shuffle(urls)
        n = 0
        for url in split_by_worker(urls):
            for s in shuffle_buffer(tar_samples(url), 2000, rng):
                img = Image.open(io.BytesIO(s["jpg"])).convert("RGB")
                yield self.tf(img), torch.tensor(json.loads(s["json"])["score"], dtype=torch.float32)
                n += 1
                if n >= SAMPLES_PER_RANK_EPOCH // nw:
                    return


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    lrank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(lrank)
    device = torch.device("cuda", lrank)

    tf = T.Compose([T.Resize(256), T.RandomCrop(224), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    stream = TarStream(rank, world, tf)
    loader = DataLoader(stream, batch_size=64, num_workers=8, pin_memory=True, drop_last=True)

    net = torchvision.models.efficientnet_b0(weights="DEFAULT")
    net.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, 1))
    model = DDP(net.to(device), device_ids=[lrank])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)

    for epoch in range(15):
        stream.epoch = epoch
        sq_err = torch.zeros(2, device=device)
        for img, score in loader:
            img, score = img.to(device, non_blocking=True), score.to(device, non_blocking=True)
            pred = model(img).squeeze(1)
            loss = nn.functional.smooth_l1_loss(pred, score)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sq_err += torch.stack([((pred.detach() - score) ** 2).sum(), torch.tensor(float(score.numel()), device=device)])
        dist.all_reduce(sq_err)
        if rank == 0:
            print(f"epoch {epoch} train RMSE {(sq_err[0] / sq_err[1]).sqrt().item():.3f}")
            torch.save(model.module.state_dict(), "aesthetic_effnet.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
