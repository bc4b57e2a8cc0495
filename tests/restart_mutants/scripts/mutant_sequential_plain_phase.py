"""Not restart-safe (copy of safe_sequential_models.py): the switch from model a to model b
follows a count of model a's steps kept in a plain variable, not ``run.global_step``.

After a resume the count starts from 0: a run resumed in phase b goes back to training model a,
one resumed in phase a trains it too long. Expected first difference: model a's weights
(``rank 0/models/a/0.0.weight``).
"""

from __future__ import annotations

import torch
from torch import nn

import paratrain as pt

STEPS_A = 8
STEPS_B = 8


def main() -> None:
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(64, 6, generator=g)
    ys = (xs[:, 0] + xs[:, 1] > 0).long()
    run = pt.Run(progress=False, timeout_s=30)
    a_net = nn.Sequential(
        nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)),
        nn.Sequential(nn.Linear(3, 12), nn.Tanh(), nn.Linear(12, 6)),
    )
    b_net = nn.Linear(3, 2)
    a, opt_a = run.setup(a_net, torch.optim.Adam(a_net.parameters(), lr=1e-2), name="a")
    b, opt_b = run.setup(b_net, torch.optim.SGD(b_net.parameters(), lr=0.1), name="b")
    encoder = run.unwrap(a)[0]
    steps_a = 0
    run.resume()
    while run.global_step < STEPS_A + STEPS_B:
        idx = torch.randint(0, len(xs), (8,))
        x, y = xs[idx].to(run.device), ys[idx].to(run.device)
        if steps_a < STEPS_A:
            run.backward(nn.functional.mse_loss(a(x), x))
            run.step(opt_a)
            steps_a += 1
        else:
            with torch.no_grad():
                features = encoder(x)
            run.backward(nn.functional.cross_entropy(b(features), y))
            run.step(opt_b)
        if run.global_step % 4 == 0:
            run.save()
    run.close()


if __name__ == "__main__":
    main()
