"""Compressed DCP checkpoints (zstd): read like plain ones; a declared size is bounded by memory."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint._extension import ZStandard

from paratrain.checkpoint.inspection import inspect
from paratrain.errors import CheckpointError


def _save(folder: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is ... a single process"
        dcp.save(
            {"model.w": torch.arange(1000.0)},
            storage_writer=FileSystemWriter(str(folder), _extensions=[ZStandard()]),
        )


def test_a_compressed_checkpoint_is_read(tmp_path: Path) -> None:
    _save(tmp_path / "ck")
    report = inspect(tmp_path / "ck")
    assert report["format"] == "dcp" and report["parameters"] == 1000


def test_a_decompression_bomb_is_refused_before_allocating(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    _save(folder)
    meta_path = folder / ".metadata"
    meta = pickle.loads(meta_path.read_bytes())
    huge = 2 * psutil.virtual_memory().total  # elements; 4 bytes each
    entry = meta.state_dict_metadata["model.w"]
    entry.size = torch.Size([huge])
    entry.chunks[0].sizes = torch.Size([huge])
    meta_path.write_bytes(pickle.dumps(meta))
    with pytest.raises(CheckpointError, match="once decompressed"):
        inspect(folder)
