"""Speech enhancement (noisy -> clean waveform) with a Conv-TasNet-like mask network under DDP.

Planted: PT021 - the training forward pass calls model.module(noisy), bypassing DDP's gradient all-reduce
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class MaskNet(nn.Module):
    def __init__(self, n_filters=256, kernel=16, blocks=8):
        super().__init__()
        self.encoder = nn.Conv1d(1, n_filters, kernel, stride=kernel // 2, bias=False)
        tcn = []
        for b in range(blocks):
            d = 2 ** b
            tcn += [nn.Conv1d(n_filters, n_filters, 3, padding=d, dilation=d), nn.PReLU(), nn.GroupNorm(1, n_filters)]
        self.tcn = nn.Sequential(*tcn)
        self.mask = nn.Conv1d(n_filters, n_filters, 1)
        self.decoder = nn.ConvTranspose1d(n_filters, 1, kernel, stride=kernel // 2, bias=False)

    def forward(self, wav):
        feats = self.encoder(wav.unsqueeze(1))
        masked = feats * torch.sigmoid(self.mask(self.tcn(feats)))
        return self.decoder(masked).squeeze(1)[..., : wav.size(-1)]


def neg_si_sdr(est, ref, eps=1e-8):
    ref = ref - ref.mean(-1, keepdim=True)
    est = est - est.mean(-1, keepdim=True)
    proj = (est * ref).sum(-1, keepdim=True) / (ref.pow(2).sum(-1, keepdim=True) + eps) * ref
    noise = est - proj
    return -10 * torch.log10(proj.pow(2).sum(-1) / (noise.pow(2).sum(-1) + eps) + eps).mean()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", default="voicebank_demand_4s.pt")
    parser.add_argument("--epochs", type=int, default=100)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    blob = torch.load(args.pairs, map_location="cpu", weights_only=True)
    dataset = TensorDataset(blob["noisy"], blob["clean"])
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=4, pin_memory=True)

    model = DDP(MaskNet().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for noisy, clean in loader:
            noisy = noisy.to(device, non_blocking=True)
            clean = clean.to(device, non_blocking=True)
            enhanced = model.module(noisy)  # planted: PT021
            loss = neg_si_sdr(enhanced, clean)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
        scheduler.step()
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), "masknet_vbd.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
