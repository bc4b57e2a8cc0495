"""The same tutorial script ported to paratrain as a new user would: the Trainer class stays,
the snapshot code becomes run.save/run.resume, the loop becomes run.epochs. Saves happen on
every rank (run.save is collective); a restart resumes on its own.

    paratrain run --nproc 2 --max-restarts 1 ddp_tutorial_paratrain.py 4 1 --batch_size 16 \
        --out final.pt [--kill-at-step 13]
"""

import os
import signal

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

import paratrain as pt


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(self, run, model, train_data, optimizer, save_every, kill_at_step):
        self.run = run
        self.model, self.optimizer = run.setup(model, optimizer)
        self.train_data = train_data
        self.save_every = save_every
        self.kill_at_step = kill_at_step

    def _run_batch(self, source, targets):
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        self.run.backward(loss)
        self.run.step(self.optimizer)
        first_attempt = self.run.restart_count == 0
        if first_attempt and self.run.rank == 1 and self.run.global_step == self.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        self.run.print(f"Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        for source, targets in self.train_data:
            self._run_batch(source, targets)

    def train(self, max_epochs):
        for epoch in self.run.epochs(max_epochs):
            self._run_epoch(epoch)
            if epoch % self.save_every == 0:
                self.run.save()


def main(save_every, total_epochs, batch_size, out, kill_at_step):
    run = pt.Run(strategy="ddp", progress=False, seed=0)
    torch.manual_seed(0)  # as the original: data, then model, from seed 0
    dataset = MyTrainDataset(256)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-1)
    train_data = run.loader(dataset, batch_size=batch_size)
    trainer = Trainer(run, model, train_data, optimizer, save_every, kill_at_step)
    trainer.train(total_epochs)
    run.save_weights(trainer.model, out)
    run.close()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", default=32, type=int)
    parser.add_argument("--out", default="final.pt")
    parser.add_argument("--kill-at-step", type=int, default=-1)
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size, args.out, args.kill_at_step)
