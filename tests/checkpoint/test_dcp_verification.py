"""DCP (FSDP) checkpoints: checksums recorded while writing, verified while loading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

import paratrain as pt
from paratrain.checkpoint.dcp_io import RecordingWriter, SafePlanner, SafeReader
from paratrain.checkpoint.files import CHECKSUM, checksum_file
from paratrain.checkpoint.manifest import Manifest
from paratrain.errors import CheckpointDamagedError
from tests.support.distributed import run_distributed
from tests.support.training import dataset, max_abs_diff, mlp


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    return {
        "w": torch.randn(300, 70),
        "b": torch.randn(7, dtype=torch.float64),
        "meta": {"note": "x", "n": 3},
    }


def test_the_recording_writer_records_what_is_on_disk(tmp_path: Path) -> None:
    writer = RecordingWriter(str(tmp_path), sync_files=True, overwrite=False)
    dcp.save(_state(), storage_writer=writer, no_dist=True)
    on_disk = {p.name for p in tmp_path.iterdir()}
    assert set(writer.records) == on_disk and ".metadata" in on_disk
    for name, (digest, size) in writer.records.items():
        assert (checksum_file(tmp_path / name), (tmp_path / name).stat().st_size) == (digest, size)


def test_the_verifying_reader_loads_intact_files_and_refuses_a_flipped_bit(
    tmp_path: Path,
) -> None:
    writer = RecordingWriter(str(tmp_path), sync_files=True, overwrite=False)
    dcp.save(_state(), storage_writer=writer, no_dist=True)
    checksums = {name: (CHECKSUM, d, n) for name, (d, n) in writer.records.items()}
    target = {
        "w": torch.zeros(300, 70),
        "b": torch.zeros(7, dtype=torch.float64),
        "meta": {"note": "", "n": 0},
    }
    reader = SafeReader(str(tmp_path), checksums)
    dcp.load(target, storage_reader=reader, planner=SafePlanner(), no_dist=True)
    want = _state()
    assert torch.equal(target["w"], want["w"]) and torch.equal(target["b"], want["b"])
    assert target["meta"] == want["meta"]

    data = next(p for p in tmp_path.iterdir() if p.suffix == ".distcp")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x04
    data.write_bytes(bytes(raw))
    fresh = {
        "w": torch.zeros(300, 70),
        "b": torch.zeros(7, dtype=torch.float64),
        "meta": {"note": "", "n": 0},
    }
    with pytest.raises(CheckpointException) as caught:
        dcp.load(fresh, storage_reader=SafeReader(str(tmp_path), checksums), no_dist=True)
    failures = [exc for exc, _ in caught.value.failures.values()]
    assert any(isinstance(exc, CheckpointDamagedError) for exc in failures)
    assert torch.count_nonzero(fresh["w"]) == 0  # no byte of the damaged file was used


def _fsdp_saves(root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with pt.Run(strategy="fsdp", progress=False, ckpt_dir=root, keep_last=None, seed=0) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
        x, y = dataset(8)[:]
        for step in (1, 2):
            with run.accumulate(model):
                run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(opt)
            run.save()
            out[step] = run.strategy.full_state_dict(model)
    return out


def _fsdp_resume(root: str) -> dict[str, Any]:
    with pt.Run(strategy="fsdp", progress=False, ckpt_dir=root, seed=0) as run:
        net = mlp()
        model, _ = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
        run.resume()
        return {"step": run.global_step, "weights": run.strategy.full_state_dict(model)}


@pytest.mark.dist
def test_a_damaged_shard_of_rank_1_makes_every_rank_resume_the_previous_save(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    saved = run_distributed(_fsdp_saves, 2, str(tmp_path))[0]
    folders = sorted(tmp_path.glob("step-*"))
    assert [f.name for f in folders] == ["step-00000001", "step-00000002"]
    for folder in folders:  # the manifest's checksums, recorded while writing, are right
        assert Manifest.read(folder).verify(folder) == []
    shard = folders[1] / "dcp" / "__1_0.distcp"
    raw = bytearray(shard.read_bytes())
    raw[-100] ^= 0x01
    shard.write_bytes(bytes(raw))
    resumed = run_distributed(_fsdp_resume, 2, str(tmp_path))
    for rank in (0, 1):
        assert resumed[rank]["step"] == 1
    assert max_abs_diff(resumed[0]["weights"], saved[1]) == 0.0
    err = capfd.readouterr().err
    assert "step-00000002" in err and "__1_0.distcp" in err and "checksum" in err
