"""Plot the demo's loss and accuracy curves from ``metrics.jsonl`` into a PNG.

plot_curves(Path("runs/demo/<stamp>/metrics.jsonl"), Path("runs/demo/<stamp>/curves.png"))
"""

from __future__ import annotations

import json
from pathlib import Path

from paratrain.errors import EnvironmentMismatchError


def plot_curves(metrics: Path, out: Path) -> Path:
    """Write a two-panel figure (train loss, test accuracy per epoch) to ``out``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise EnvironmentMismatchError(
            "Plotting needs matplotlib. Run `pip install 'paratrain[demo]'`."
        ) from err
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    epochs = [int(r["epoch"]) + 1 for r in records]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(9, 3.5), constrained_layout=True)
    ax_loss.plot(epochs, [r["train/loss"] for r in records], marker="o")
    ax_loss.set(xlabel="epoch", ylabel="train loss (mean over ranks)", yscale="log")
    ax_acc.plot(epochs, [r["test/accuracy"] for r in records], marker="o", color="tab:green")
    ax_acc.set(xlabel="epoch", ylabel="test accuracy (each sample once)", ylim=(0, 1))
    ax_acc.axhline(0.95, color="grey", linestyle="--", linewidth=1)
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
    fig.suptitle("paratrain demo: DigitsCNN on scikit-learn digits")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
