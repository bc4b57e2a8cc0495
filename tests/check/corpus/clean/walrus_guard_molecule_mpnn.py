import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

MAX_ATOMS, ATOM_TYPES, BOND_TYPES = 29, 10, 4


class Molecules(Dataset):
    """Dense padded graphs: atom types, bond-type adjacency, node mask, target."""

    def __len__(self):
        return 130_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        n = int(torch.randint(5, MAX_ATOMS + 1, (1,), generator=g))
        atoms = torch.zeros(MAX_ATOMS, dtype=torch.long)
        atoms[:n] = torch.randint(1, ATOM_TYPES, (n,), generator=g)
        bonds = torch.zeros(MAX_ATOMS, MAX_ATOMS, dtype=torch.long)
        b = torch.randint(0, BOND_TYPES, (n, n), generator=g).triu(1)
        bonds[:n, :n] = b + b.T
        mask = torch.arange(MAX_ATOMS) < n
        return atoms, bonds, mask, torch.randn(1, generator=g)


class EdgeConv(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.edge = nn.Embedding(BOND_TYPES, d * d)
        self.gru = nn.GRUCell(d, d)
        self.d = d

    def forward(self, h, bonds, mask):
        W = self.edge(bonds).view(*bonds.shape, self.d, self.d)
        W = W * (bonds > 0).unsqueeze(-1).unsqueeze(-1)
        msg = torch.einsum("bijkl,bjl->bik", W, h)
        out = self.gru(msg.reshape(-1, self.d), h.reshape(-1, self.d)).view_as(h)
        return out * mask.unsqueeze(-1)


class MPNN(nn.Module):
    def __init__(self, d=64, steps=3):
        super().__init__()
        self.embed = nn.Embedding(ATOM_TYPES, d, padding_idx=0)
        self.conv = EdgeConv(d)
        self.steps = steps
        self.readout = nn.Sequential(nn.Linear(2 * d, 256), nn.SiLU(), nn.Linear(256, 1))

    def forward(self, atoms, bonds, mask):
        h0 = h = self.embed(atoms)
        for _ in range(self.steps):
            h = self.conv(h, bonds, mask)
        pooled = torch.cat([h, h0], -1).sum(1) / mask.sum(1, keepdim=True)
        return self.readout(pooled)


def main():
    dist.init_process_group("nccl")
    if (rank := dist.get_rank()) == 0:
        print(f"world size {dist.get_world_size()}")
    torch.cuda.set_device(gpu := int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda", gpu)

    ds = Molecules()
    n_val = 10_000
    train, val = torch.utils.data.random_split(ds, [len(ds) - n_val, n_val], torch.Generator().manual_seed(0))
    tr_sampler = DistributedSampler(train)
    tr = DataLoader(train, batch_size=128, sampler=tr_sampler, num_workers=6)
    va = DataLoader(val, batch_size=256, sampler=DistributedSampler(val, shuffle=False))

    model = DDP(MPNN().to(device), device_ids=[gpu])
    opt = torch.optim.Adam(model.parameters(), lr=5e-4)
    best = float("inf")
    for epoch in range(300):
        tr_sampler.set_epoch(epoch)
        model.train()
        for atoms, bonds, mask, y in tr:
            atoms, bonds, mask, y = (t.to(device, non_blocking=True) for t in (atoms, bonds, mask, y))
            loss = nn.functional.mse_loss(model(atoms, bonds, mask), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        abs_err = torch.zeros(2, device=device)
        with torch.no_grad():
            for atoms, bonds, mask, y in va:
                atoms, bonds, mask, y = (t.to(device) for t in (atoms, bonds, mask, y))
                abs_err += torch.stack([(model(atoms, bonds, mask) - y).abs().sum(),
                                        torch.tensor(float(y.numel()), device=device)])
        dist.all_reduce(abs_err)
        mae = (abs_err[0] / abs_err[1]).item()
        if (improved := mae < best) and rank == 0:
            torch.save(model.module.state_dict(), "mpnn_best.pt")
        best = min(best, mae)
        if rank == 0:
            print(f"epoch {epoch} val MAE {mae:.4f}{' *' if improved else ''}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
