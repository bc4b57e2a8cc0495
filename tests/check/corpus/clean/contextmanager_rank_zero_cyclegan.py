import functools
import itertools
import os
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms
from torchvision.utils import save_image

LOCAL_RANK = int(os.environ["LOCAL_RANK"])


def rank_zero_only(fn):
    @functools.wraps(fn)
    def inner(*args, **kwargs):
        if dist.get_rank() == 0:
            return fn(*args, **kwargs)
        return None
    return inner


@contextmanager
def main_process_first():
    """Rank 0 prepares shared files; others wait, then reuse them."""
    if dist.get_rank() != 0:
        dist.barrier()
    yield
    if dist.get_rank() == 0:
        dist.barrier()


@rank_zero_only
def dump_samples(a2b, b2a, real_a, real_b, epoch):
    with torch.no_grad():
        grid = torch.cat([real_a, a2b(real_a), real_b, b2a(real_b)])
    save_image(grid * 0.5 + 0.5, f"samples/epoch_{epoch:03d}.png", nrow=real_a.size(0))


@rank_zero_only
def save_all(nets, opts, epoch):
    state = {name: net.module.state_dict() for name, net in nets.items()}
    state.update({f"opt_{k}": o.state_dict() for k, o in opts.items()})
    torch.save(state, f"checkpoints/cyclegan_{epoch:03d}.pt")


def resnet_gen(ch=64, blocks=6):
    layers = [nn.Conv2d(3, ch, 7, padding=3), nn.InstanceNorm2d(ch), nn.ReLU(True)]
    for _ in range(blocks):
        layers += [nn.Conv2d(ch, ch, 3, padding=1), nn.InstanceNorm2d(ch), nn.ReLU(True)]
    layers += [nn.Conv2d(ch, 3, 7, padding=3), nn.Tanh()]
    return nn.Sequential(*layers)


def patch_disc(ch=64):
    return nn.Sequential(nn.Conv2d(3, ch, 4, 2, 1), nn.LeakyReLU(0.2, True),
                         nn.Conv2d(ch, 2 * ch, 4, 2, 1), nn.InstanceNorm2d(2 * ch), nn.LeakyReLU(0.2, True),
                         nn.Conv2d(2 * ch, 1, 4, 1, 1))


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(LOCAL_RANK)
    dev = torch.device("cuda", LOCAL_RANK)
    tf = transforms.Compose([transforms.Resize(128), transforms.CenterCrop(128), transforms.ToTensor(),
                             transforms.Normalize([0.5] * 3, [0.5] * 3)])
    with main_process_first():
        if dist.get_rank() == 0:
            os.makedirs("samples", exist_ok=True)
            os.makedirs("checkpoints", exist_ok=True)
        dom_a = datasets.ImageFolder("data/horses", tf)
        dom_b = datasets.ImageFolder("data/zebras", tf)
    sa, sb = DistributedSampler(dom_a), DistributedSampler(dom_b)
    la = DataLoader(dom_a, batch_size=4, sampler=sa, num_workers=4, drop_last=True)
    lb = DataLoader(dom_b, batch_size=4, sampler=sb, num_workers=4, drop_last=True)

    nets = {k: DDP(f().to(dev), device_ids=[LOCAL_RANK])
            for k, f in [("g_ab", resnet_gen), ("g_ba", resnet_gen), ("d_a", patch_disc), ("d_b", patch_disc)]}
    opts = {
        "g": torch.optim.Adam(itertools.chain(nets["g_ab"].parameters(), nets["g_ba"].parameters()),
                              lr=2e-4, betas=(0.5, 0.999)),
        "d": torch.optim.Adam(itertools.chain(nets["d_a"].parameters(), nets["d_b"].parameters()),
                              lr=2e-4, betas=(0.5, 0.999)),
    }
    mse, l1 = nn.MSELoss(), nn.L1Loss()

    for epoch in range(100):
        sa.set_epoch(epoch)
        sb.set_epoch(epoch)
        for real_a, real_b in zip(la, lb):
            real_a = real_a[0].to(dev, non_blocking=True)
            real_b = real_b[0].to(dev, non_blocking=True)
            fake_b, fake_a = nets["g_ab"](real_a), nets["g_ba"](real_b)
            pred_fb, pred_fa = nets["d_b"](fake_b), nets["d_a"](fake_a)
            loss_g = (mse(pred_fb, torch.ones_like(pred_fb)) + mse(pred_fa, torch.ones_like(pred_fa))
                      + 10 * (l1(nets["g_ba"](fake_b), real_a) + l1(nets["g_ab"](fake_a), real_b)))
            opts["g"].zero_grad()
            loss_g.backward()
            opts["g"].step()

            loss_d = 0.0
            for d, real, fake in ((nets["d_a"], real_a, fake_a), (nets["d_b"], real_b, fake_b)):
                pr, pf = d(real), d(fake.detach())
                loss_d = loss_d + 0.5 * (mse(pr, torch.ones_like(pr)) + mse(pf, torch.zeros_like(pf)))
            opts["d"].zero_grad()
            loss_d.backward()
            opts["d"].step()
        dump_samples(nets["g_ab"].module, nets["g_ba"].module, real_a[:4], real_b[:4], epoch)
        save_all(nets, opts, epoch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
