"""The demo's data and model: scikit-learn's 8x8 digits (shipped with it; no download).

train_set, test_set = digits_datasets()   # 1438 / 359 images, a fixed split
model = DigitsCNN()
"""

from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from paratrain.errors import EnvironmentMismatchError

TEST_FRACTION = 0.2
SPLIT_SEED = 1234


def digits_datasets() -> tuple[TensorDataset, TensorDataset]:
    """Train and test sets of (image 1x8x8 in [0, 1], label 0-9), split the same way every time."""
    images_8x8, targets = _digits_arrays()
    images = torch.tensor(images_8x8, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(targets, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_test = int(len(labels) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[test], labels[test])


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images of shape (1797, 8, 8) with values 0-16, labels), as ``load_digits`` returns them.

    scikit-learn keeps the digits in one gzipped CSV file (64 pixels, then the label, per row).
    Reading that file directly, as ``load_digits`` itself does, spares every rank importing
    scikit-learn and SciPy, about 2 s of each process's start. Where the file is not found (a
    future scikit-learn that moves it), ``load_digits`` reads it.
    """
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise EnvironmentMismatchError(
            "The demo needs scikit-learn for its shipped digits data. Run "
            "`pip install 'paratrain[demo]'` (or `make demo`, which does it)."
        )
    shipped = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    if shipped.is_file():
        with gzip.open(shipped, "rt") as rows:
            table = np.loadtxt(rows, delimiter=",")
        return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images, bunch.target


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions, a pooling step and two linear layers (~40k parameters)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * width * 16, 64), nn.ReLU(), nn.Linear(64, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape (batch, 10)."""
        return self.head(self.features(x))  # type: ignore[no-any-return]


@torch.no_grad()
def accuracy_counts(
    model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]
) -> tuple[int, int]:
    """(correct, seen) over an iterable of (images, labels) batches."""
    correct = seen = 0
    model.eval()
    for x, y in batches:
        correct += int((model(x).argmax(dim=1) == y).sum())
        seen += len(y)
    model.train()
    return correct, seen
