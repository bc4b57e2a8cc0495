"""Point-cloud classification (DGCNN-like edge convolutions) on all visible GPUs of one machine.

Planted: PT013 - SyncBatchNorm (imported as SBN) conversion in a script that parallelises with nn.DataParallel
"""
import argparse
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn import SyncBatchNorm as SBN
from torch.utils.data import DataLoader, TensorDataset


def knn(x, k):
    inner = -2 * torch.matmul(x.transpose(2, 1), x)
    sq = torch.sum(x ** 2, dim=1, keepdim=True)
    dist = -sq - inner - sq.transpose(2, 1)
    return dist.topk(k=k, dim=-1)[1]


def edge_features(x, k=20):
    b, c, n = x.shape
    idx = knn(x, k) + torch.arange(b, device=x.device).view(-1, 1, 1) * n
    x_t = x.transpose(2, 1).contiguous()
    neigh = x_t.view(b * n, -1)[idx.view(-1)].view(b, n, k, c)
    center = x_t.view(b, n, 1, c).expand(-1, -1, k, -1)
    return torch.cat((neigh - center, center), dim=3).permute(0, 3, 1, 2).contiguous()


class DGCNN(nn.Module):
    def __init__(self, num_classes=40, emb=512):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(6, 64, 1, bias=False), nn.BatchNorm2d(64), nn.LeakyReLU(0.2))
        self.conv2 = nn.Sequential(nn.Conv2d(128, 128, 1, bias=False), nn.BatchNorm2d(128), nn.LeakyReLU(0.2))
        self.conv3 = nn.Sequential(nn.Conv1d(192, emb, 1, bias=False), nn.BatchNorm1d(emb), nn.LeakyReLU(0.2))
        self.head = nn.Sequential(nn.Linear(emb * 2, 256), nn.BatchNorm1d(256), nn.LeakyReLU(0.2),
                                  nn.Dropout(0.5), nn.Linear(256, num_classes))

    def forward(self, pts):
        x1 = self.conv1(edge_features(pts)).max(dim=-1)[0]
        x2 = self.conv2(edge_features(x1)).max(dim=-1)[0]
        x = self.conv3(torch.cat((x1, x2), dim=1))
        x = torch.cat((F.adaptive_max_pool1d(x, 1).flatten(1), F.adaptive_avg_pool1d(x, 1).flatten(1)), 1)
        return self.head(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=250)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_points", type=int, default=1024)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    points = torch.randn(2048, 3, args.num_points)
    labels = torch.randint(0, 40, (2048,))
    loader = DataLoader(TensorDataset(points, labels), batch_size=args.batch_size, shuffle=True, drop_last=True)

    model = DGCNN()
    model = SBN.convert_sync_batchnorm(model)  # planted: PT013
    model = nn.DataParallel(model).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs, eta_min=1e-3)

    for epoch in range(args.epochs):
        model.train()
        correct = seen = 0
        for pts, label in loader:
            pts, label = pts.cuda(), label.cuda()
            logits = model(pts)
            loss = F.cross_entropy(logits, label, label_smoothing=0.2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            correct += (logits.argmax(1) == label).sum().item()
            seen += label.numel()
        scheduler.step()
        logging.info("epoch %d train acc %.4f", epoch, correct / max(seen, 1))
        torch.save(model.module.state_dict(), "dgcnn_latest.t7")


if __name__ == "__main__":
    main()
