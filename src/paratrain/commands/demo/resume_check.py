"""Compare the demo's crashed-and-resumed training with an uninterrupted run of the same job.

    check = check_resume(DemoFiles(run_dir), DemoFiles(run_dir).reference)
    check.matches            # every step's loss and the final weights equal, bit for bit
    check.resumed_at         # the step of the checkpoint the restart resumed from

What is compared, and nothing more: the main process's loss at every step (as ``metrics.jsonl``
holds it; after the restart, the resumed attempt's values) and every tensor of the final
``model.pt``, each for exact equality; and the steps the resumed attempt ran twice (from the
checkpoint to the crash) against the first attempt's values for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from paratrain.commands.demo.artefacts import DemoFiles
from paratrain.commands.demo.records import read_records


@dataclass(frozen=True, slots=True)
class ResumeCheck:
    """The comparison's findings."""

    restarted: bool
    """Whether the training ran in two attempts (False: the crash did not happen)."""
    crashed_after: int
    """The last step the first attempt logged before the crash."""
    resumed_at: int
    """The step of the checkpoint the second attempt resumed from."""
    redone_equal: bool
    """The steps run twice had the same losses in both attempts."""
    steps: int
    """Steps compared with the uninterrupted run (all of the run's steps)."""
    first_difference: int | None
    """The first step whose loss differs from the uninterrupted run's (None: none does)."""
    weights_max_diff: float
    """The largest absolute difference of any final weight (0.0: bit for bit equal)."""
    weights_equal: bool
    """Every final tensor equal, bit for bit, with the same names, shapes and dtypes."""

    @property
    def redone(self) -> int:
        """How many steps the second attempt ran again."""
        return max(0, self.crashed_after - self.resumed_at)

    @property
    def matches(self) -> bool:
        """The resumed run ended exactly as the uninterrupted one."""
        return (
            self.restarted
            and self.redone_equal
            and self.first_difference is None
            and self.weights_equal
        )


def check_resume(resumed: DemoFiles, reference: DemoFiles) -> ResumeCheck:
    """Compare the run in ``resumed`` (crashed once, restarted) with the one in ``reference``."""
    ran = read_records(resumed.metrics, resumed.restarts)
    straight = read_records(reference.metrics, reference.restarts)
    restarted = bool(ran.resumed_at)
    first, second = (ran.attempts[0], ran.attempts[1]) if restarted else ({}, {})
    redone = ran.redone_steps()
    losses, expected = ran.final_losses(), straight.final_losses()
    differing = [s for s in sorted(expected) if losses.get(s) != expected[s]]
    differing += [s for s in sorted(losses) if s not in expected]
    max_diff, same = _compare_weights(resumed, reference)
    return ResumeCheck(
        restarted=restarted,
        crashed_after=max(first, default=0),
        resumed_at=ran.resumed_at[0] if restarted else 0,
        redone_equal=all(first[s] == second[s] for s in redone),
        steps=len(expected),
        first_difference=min(differing, default=None),
        weights_max_diff=max_diff,
        weights_equal=same,
    )


def _compare_weights(a: DemoFiles, b: DemoFiles) -> tuple[float, bool]:
    """(largest absolute difference, equal bit for bit) of the two runs' ``model.pt``."""
    import torch

    left = torch.load(a.weights, map_location="cpu", weights_only=True)
    right = torch.load(b.weights, map_location="cpu", weights_only=True)
    if left.keys() != right.keys():
        return float("inf"), False
    largest, same = 0.0, True
    for name, tensor in left.items():
        other = right[name]
        if tensor.shape != other.shape or tensor.dtype != other.dtype:
            return float("inf"), False
        same = same and torch.equal(tensor, other)
        diff = (tensor.double() - other.double()).abs().max() if tensor.numel() else 0.0
        largest = max(largest, float(diff))
    return largest, same
