"""Where ``paratrain demo`` writes: every file of a demo run dir is named here, once.

    files = DemoFiles(Path("runs/demo/20250101-120000"))
    files.weights       # model.pt           the trained weights, unprefixed (run.save_weights)
    files.result        # train_result.json  accuracy, steps, restarts (the main process)
    files.curves        # curves.png         loss and accuracy per epoch
    files.metrics       # metrics.jsonl      run.log: each step's loss, each epoch's summary
    files.restarts      # restarts.jsonl     pt.Run: a line per torchrun restart
    files.checkpoints   # checkpoints/       run.save after every epoch
    files.reference     # reference/         the uninterrupted run to compare the resumed one with

Imports no torch: the ``paratrain demo`` command reads these before it loads torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from paratrain.core.run_dir import RunDir

KEEP_CHECKPOINTS = 2
"""The training's ``keep_last``: the newest checkpoints kept."""


@dataclass(frozen=True, slots=True)
class DemoFiles:
    """The files of one demo run dir."""

    root: Path
    """The run dir."""

    @property
    def layout(self) -> RunDir:
        """The run dir's ``pt.Run`` artefacts (metrics, TensorBoard, checkpoints)."""
        return RunDir(self.root)

    @property
    def weights(self) -> Path:
        """The trained weights, as plain unprefixed CPU tensors."""
        return self.root / "model.pt"

    @property
    def result(self) -> Path:
        """What the training ranks report at their end (JSON, written by the main process)."""
        return self.root / "train_result.json"

    @property
    def curves(self) -> Path:
        """The loss and accuracy plot."""
        return self.root / "curves.png"

    @property
    def metrics(self) -> Path:
        """``run.log``'s scalars, one JSON object a line."""
        return self.layout.metrics

    @property
    def restarts(self) -> Path:
        """``pt.Run``'s line per torchrun restart: when, and the step it resumed from."""
        return self.layout.restarts

    @property
    def checkpoints(self) -> Path:
        """The ``ckpt_dir`` of the training: one checkpoint per epoch (the newest kept)."""
        return self.layout.checkpoints

    @property
    def reference(self) -> DemoFiles:
        """The run dir of the uninterrupted run that the resumed run is compared with."""
        return DemoFiles(self.root / "reference")
