"""Speech-command classifier trained on several GPUs of one machine, GPU list from the command line.

Planted: PT014 - wrap_model() returns a DataParallel (imported as DP) whenever more than one GPU id is given
"""
import argparse
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DataParallel as DP
from torch.utils.data import DataLoader

from speech_data import SpeechCommands, pad_collate

logger = logging.getLogger("kws")


class M5(nn.Module):
    def __init__(self, n_input=1, n_output=35, stride=16, n_channel=32):
        super().__init__()
        self.conv1 = nn.Conv1d(n_input, n_channel, kernel_size=80, stride=stride)
        self.bn1 = nn.BatchNorm1d(n_channel)
        self.conv2 = nn.Conv1d(n_channel, 2 * n_channel, kernel_size=3)
        self.bn2 = nn.BatchNorm1d(2 * n_channel)
        self.fc1 = nn.Linear(2 * n_channel, n_output)

    def forward(self, x):
        x = F.max_pool1d(F.relu(self.bn1(self.conv1(x))), 4)
        x = F.max_pool1d(F.relu(self.bn2(self.conv2(x))), 4)
        x = F.avg_pool1d(x, x.shape[-1]).squeeze(-1)
        return F.log_softmax(self.fc1(x), dim=-1)


def wrap_model(model, gpu_ids):
    if len(gpu_ids) > 1:
        return DP(model, device_ids=gpu_ids)  # planted: PT014
    return model


class Trainer:
    def __init__(self, args):
        self.args = args
        self.device = torch.device(f"cuda:{args.gpu_ids[0]}")
        self.model = wrap_model(M5().to(self.device), args.gpu_ids)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.lr, weight_decay=1e-4)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=20, gamma=0.1)
        train_set = SpeechCommands("training")
        self.loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                                 collate_fn=pad_collate, num_workers=4, pin_memory=True)

    def unwrapped(self):
        return self.model.module if isinstance(self.model, DP) else self.model

    def run_epoch(self, epoch):
        self.model.train()
        for batch_idx, (data, target) in enumerate(self.loader):
            data = data.to(self.device)
            target = target.to(self.device)
            loss = F.nll_loss(self.model(data), target)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            if batch_idx % self.args.log_interval == 0:
                logger.info("epoch %d [%d/%d] loss %.4f", epoch, batch_idx, len(self.loader), loss.item())
        self.scheduler.step()

    def fit(self):
        for epoch in range(1, self.args.epochs + 1):
            self.run_epoch(epoch)
            torch.save(self.unwrapped().state_dict(), self.args.out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu-ids", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--log-interval", type=int, default=20)
    parser.add_argument("--out", default="m5.pt")
    logging.basicConfig(level=logging.INFO)
    Trainer(parser.parse_args()).fit()
