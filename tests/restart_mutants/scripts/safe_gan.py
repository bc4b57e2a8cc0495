"""A GAN: discriminator D and generator G, each with its own optimizer and accumulation block,
stepped one after the other every iteration (one global step per round); the noise is drawn
with ``torch.randn`` from the global generator; a save at the end of every epoch.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt

NOISE = 4


def main() -> None:
    g = torch.Generator().manual_seed(0)
    real = TensorDataset(torch.randn(48, 2, generator=g) * 0.5 + torch.tensor([2.0, -1.0]))
    run = pt.Run(progress=False, timeout_s=30)
    d_net = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    g_net = nn.Sequential(nn.Linear(NOISE, 16), nn.ReLU(), nn.Linear(16, 2))
    D, opt_d = run.setup(d_net, torch.optim.Adam(d_net.parameters(), 2e-3, (0.5, 0.999)), name="D")
    G, opt_g = run.setup(g_net, torch.optim.Adam(g_net.parameters(), 2e-3, (0.5, 0.999)), name="G")
    loader = run.loader(real, batch_size=6)
    run.resume()
    bce = nn.functional.binary_cross_entropy_with_logits
    for epoch in run.epochs(3):
        for (x,) in loader:
            ones = torch.ones(len(x), 1, device=run.device)
            zeros = torch.zeros(len(x), 1, device=run.device)
            z = torch.randn(len(x), NOISE, device=run.device)
            with run.accumulate(D):
                fake = G(z)
                run.backward(bce(D(x), ones) + bce(D(fake.detach()), zeros))
            run.step(opt_d)
            with run.accumulate(G):
                run.backward(bce(D(fake), ones), inputs=list(G.parameters()))
            run.step(opt_g)
        run.print(f"epoch {epoch}: step {run.global_step}")
        run.save()
    run.close()


if __name__ == "__main__":
    main()
