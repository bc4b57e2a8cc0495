"""A writer SIGKILLed at random moments while it saves to S3 (moto on loopback) always leaves a
resumable checkpoint: the 20 trials of test_crash.py, against object storage."""

import pytest
from benchmarks.checkpoint_crash import run_trials

from tests.support.s3 import Bucket

pytestmark = pytest.mark.scale


def test_twenty_random_kills_during_uploads_leave_a_verified_checkpoint(s3: Bucket) -> None:
    ok, mid_save = run_trials(20, seed=1, ckpt_dir=s3.url("crash"), env=s3.env)
    assert ok == 20
    assert mid_save >= 1  # the kills did hit saves in progress, not only the gaps between
