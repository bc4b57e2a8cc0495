"""A hang named under nccl leaves torch's flight-recorder trace beside the stacks (faked here: no
GPU); gloo has no recorder and leaves none."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

from paratrain.distributed.process_group import dump_flight_recorder


def test_gloo_or_no_group_leaves_no_trace(tmp_path: Path) -> None:
    assert dump_flight_recorder(tmp_path, 0) is None
    assert not list(tmp_path.iterdir())


def test_nccl_writes_the_recorders_trace_per_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(c10d, "_dump_nccl_trace", lambda: b"trace of rank 3", raising=False)
    path = dump_flight_recorder(tmp_path, 3)
    assert path == tmp_path / "nccl_trace_rank_3"
    assert path.read_bytes() == b"trace of rank 3"


def test_a_torch_without_the_recorder_leaves_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.delattr(c10d, "_dump_nccl_trace", raising=False)
    assert dump_flight_recorder(tmp_path, 0) is None
