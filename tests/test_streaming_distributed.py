"""Streams on 2 real gloo ranks with 2 DataLoader workers each: split without overlap, and a run
stopped mid-epoch and resumed sees exactly the examples, in the order, of an uninterrupted one.

The generator stream (split by paratrain) runs in ``make test``; the webdataset tar shards and the
HF ``datasets`` stream built from local files, the issue's proof, run in ``make scale-test``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch

from paratrain.errors import DataError
from tests.support.distributed import run_distributed
from tests.support.streams import train_on_stream, write_jsonl_shards, write_tar_shards

pytestmark = pytest.mark.dist


def _stop_and_resume(source: tuple[str, Any], tmp_path: Path) -> None:
    straight = run_distributed(train_on_stream, 2, source, str(tmp_path / "a"))
    stopped = functools.partial(train_on_stream, stop_at=5)
    first = run_distributed(stopped, 2, source, str(tmp_path / "b"))
    rest = run_distributed(train_on_stream, 2, source, str(tmp_path / "b"))
    for rank in range(2):
        assert first[rank]["seen"] + rest[rank]["seen"] == straight[rank]["seen"], rank
    for rank in range(2):  # every rank ends with the same weights as the uninterrupted run
        for name, value in straight[0]["weights"].items():
            assert torch.equal(rest[rank]["weights"][name], value), (rank, name)
    per_epoch = [
        sorted(i for step in straight[r]["seen"][: len(straight[r]["seen"]) // 2] for i in step)
        for r in range(2)
    ]
    assert not set(per_epoch[0]) & set(per_epoch[1])  # the ranks' shares do not overlap


def test_generator_stream_split_by_paratrain_resumes_exactly(tmp_path: Path) -> None:
    _stop_and_resume(("Counting", 46), tmp_path)


@pytest.mark.scale
def test_webdataset_tar_shards_resume_exactly(tmp_path: Path) -> None:
    urls = write_tar_shards(tmp_path / "tars", shards=4, per_shard=11)
    _stop_and_resume(("webdataset", urls), tmp_path)


@pytest.mark.scale
def test_hf_datasets_stream_from_local_files_resumes_exactly(tmp_path: Path) -> None:
    files = write_jsonl_shards(tmp_path / "json", shards=4, per_shard=11)
    _stop_and_resume(("hf", files), tmp_path)


def _uneven_and_duplicated(root: str) -> dict[str, Any]:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        uneven = train_on_stream(("Uneven", [10, 4]), root + "/u", epochs=1, workers=0)
        same = train_on_stream(("Same", 8), root + "/s", epochs=1, workers=2)
    refused = []
    for source, workers in ((("GloballyShuffled", 40), 0), (("ShuffledInOneWorker", 40), 2)):
        try:  # every rank shuffles with its own seed (paratrain seeds Python's random by rank);
            # then only rank 1's workers differ: rank 0 must stop too, not wait in a collective
            train_on_stream(source, f"{root}/{source[0]}", epochs=1, workers=workers, shard=True)
            refused.append("")
        except DataError as refusal:
            refused.append(str(refusal))
    return {
        "uneven": uneven["step"], "same": same["seen"], "stderr": err.getvalue(),
        "refused": refused,
    }  # fmt: skip


def test_uneven_shares_end_together_and_duplicates_are_reported(tmp_path: Path) -> None:
    results = run_distributed(_uneven_and_duplicated, 2, str(tmp_path))
    assert [r["uneven"] for r in results] == [2, 2]  # 4 examples / batch 3 on rank 1: 2 steps
    said = results[0]["stderr"]
    assert "ended at different batches" in said
    assert "several ranks got the same first batch" in said
    assert "workers gave identical first batches" in said
    assert results[0]["same"] == results[1]["same"]  # what the warning is about
    assert all(
        "the ranks read the stream (GloballyShuffled) in" in r["refused"][0] for r in results
    )
    assert "2 DataLoader workers read the stream (ShuffledInOneWorker)" in results[1]["refused"][1]
    assert "another rank's DataLoader workers" in results[0]["refused"][1]
