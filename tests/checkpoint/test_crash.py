"""A writer SIGKILLed at random moments during saves always leaves a resumable checkpoint."""

import pytest
from benchmarks.checkpoint_crash import run_trials

pytestmark = pytest.mark.dist


def test_twenty_random_kills_leave_a_verified_checkpoint() -> None:
    ok, mid_save = run_trials(20, seed=1)
    assert ok == 20
    assert mid_save >= 1  # the kills did hit saves in progress, not only the gaps between
