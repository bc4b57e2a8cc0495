"""The seeds' pipeline example, ported. The tutorial wrote (torch.distributed.pipeline.sync is
gone from current torch):

    model = nn.Sequential(Layer1().to("cuda:0"), Layer2().to("cuda:1"), Layer3().to("cuda:2"))
    model = Pipe(model, chunks=8)            # the batch split into 8 micro-batches

With paratrain the model stays one nn.Sequential on no particular device, the stages come from
the pp axis (one per rank of ``paratrain run --nproc N``) and ``chunks`` is ``n_microbatches``.
Digits from scikit-learn, SGD, a save every epoch, a SIGKILL of one rank when asked.

    paratrain run --nproc 2 seeds_pipe.py --out final.pt [--kill-rank 1 --kill-step 20]
    python seeds_pipe.py --strategy cpu --out final.pt       # the same training in one process
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
from sklearn.datasets import load_digits
from torch import nn

import paratrain as pt


def layer(a: int, b: int) -> nn.Module:
    return nn.Sequential(nn.Linear(a, b), nn.ReLU())


def main(args: argparse.Namespace) -> None:
    x, y = load_digits(return_X_y=True)
    images = torch.tensor(x, dtype=torch.float32) / 16
    data = torch.utils.data.TensorDataset(images, torch.tensor(y))
    settings = {} if args.strategy == "cpu" else {"n_microbatches": 8, "pipeline_schedule": "gpipe"}
    with pt.Run(strategy=args.strategy, progress=False, **settings) as run:
        torch.manual_seed(0)
        model = nn.Sequential(layer(64, 128), layer(128, 128), nn.Linear(128, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model, opt = run.setup(model, opt, loss_fn=nn.functional.cross_entropy)
        loader = run.loader(data, batch_size=64, drop_last=True)
        run.resume()
        first = run.restart_count == 0
        for epoch in run.epochs(3):
            for xb, yb in loader:
                with run.accumulate(model):
                    loss = model(xb, target=yb)
                    run.backward(loss)
                run.step(opt)
                if first and run.rank == args.kill_rank and run.global_step == args.kill_step:
                    os.kill(os.getpid(), signal.SIGKILL)
            model.eval()
            with torch.no_grad():
                batches = run.eval_loader(data, 100)
                correct = sum(int((model(a).argmax(1) == b).sum()) for a, b in batches)
            model.train()
            accuracy = run.reduce(correct, "sum") / len(data)
            run.print(f"epoch {epoch}: loss {loss.item():.3f} accuracy {accuracy:.3f}")
            run.save()
        run.save_weights(model, args.out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="pipeline")
    parser.add_argument("--out", default="final.pt")
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-step", type=int, default=-1)
    main(parser.parse_args())
