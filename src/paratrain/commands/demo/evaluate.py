"""Reload the demo's saved weights in a fresh, single CPU process and measure test accuracy.

    python -m paratrain.commands.demo.evaluate runs/demo/model.pt

No process group, no strategy, no GPU: the file holds plain unprefixed CPU tensors and loads with
``weights_only=True`` (nothing pickled is executed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from paratrain.commands.demo.digits import DigitsCNN, accuracy_counts, digits_datasets
from paratrain.distributed.entrypoint import exit_on_user_error
from paratrain.errors import ParatrainError


def evaluate(weights: Path) -> dict[str, float]:
    """Test accuracy of the weights in ``weights`` on the demo's held-out digits."""
    if not weights.is_file():
        raise ParatrainError(f"No weights at {weights}. Run `paratrain demo` first.")
    model = DigitsCNN()
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    _, test_set = digits_datasets()
    x, y = test_set.tensors
    correct, seen = accuracy_counts(model, [(x, y)])
    return {"test_accuracy": correct / seen, "test_samples": seen}


def main(argv: list[str] | None = None) -> None:
    """Print the reloaded model's accuracy as JSON."""
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0] if args else "runs/demo/model.pt")
    print(json.dumps(exit_on_user_error(lambda: evaluate(path))))


if __name__ == "__main__":
    main()
