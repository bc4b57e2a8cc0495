"""load_weights on every supported format, and on files that must be refused."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import paratrain as pt
from paratrain.checkpoint.loading import read_state_dict
from paratrain.errors import CheckpointError
from tests.support.training import mlp


def _equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _fresh() -> nn.Module:
    torch.manual_seed(123)  # different weights from the source model
    return mlp()


@pytest.fixture
def source() -> nn.Module:
    torch.manual_seed(0)
    return mlp()


def _compiled_submodule(model: nn.Module) -> dict[str, Any]:
    holder = nn.Module()
    holder.add_module("net", torch.compile(model))
    return {k.replace("net.", "", 1): v for k, v in holder.state_dict().items()}


FILE_FORMATS = {
    "plain.pt": lambda m: m.state_dict(),
    "dp_prefixed.pth": lambda m: nn.DataParallel(m).state_dict(),
    "compiled.bin": lambda m: torch.compile(m).state_dict(),
    "compiled_inner.pt": _compiled_submodule,
    "lightning.ckpt": lambda m: {
        "epoch": 3,
        "global_step": 10,
        "hyper_parameters": {"lr": 0.1},
        "state_dict": {f"model.{k}": v for k, v in m.state_dict().items()},
    },
    "nested_model.pt": lambda m: {"model": m.state_dict(), "epoch": 2},
}


@pytest.mark.parametrize("name", sorted(FILE_FORMATS))
def test_torch_save_patterns_round_trip(tmp_path: Path, source: nn.Module, name: str) -> None:
    torch.save(FILE_FORMATS[name](source), tmp_path / name)
    target = _fresh()
    report = pt.load_weights(target, tmp_path / name)
    assert _equal(target, source) and report.keys == len(source.state_dict())


def test_legacy_pickle_format_and_map_location(tmp_path: Path, source: nn.Module) -> None:
    torch.save(source.state_dict(), tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    target = _fresh()
    assert pt.load_weights(
        target, tmp_path / "legacy.pt", map_location=torch.device("cpu")
    ).format.startswith("torch.save")
    assert _equal(target, source)
    state, _ = read_state_dict(tmp_path / "legacy.pt", map_location={"cpu": "cpu"})
    assert all(t.device.type == "cpu" for t in state.values())


def test_safetensors_accelerate_and_dcp_folders(tmp_path: Path, source: nn.Module) -> None:
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    save_file(source.state_dict(), str(tmp_path / "w.safetensors"))
    accel = tmp_path / "accelerate" / "checkpoint_0"
    accel.mkdir(parents=True)
    save_file(source.state_dict(), str(accel / "model.safetensors"))
    torch.save({"state": {}}, accel / "optimizer.bin")
    dcp_save(source.state_dict(), checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    for path, fmt in [
        ("w.safetensors", "safetensors"),
        ("accelerate/checkpoint_0", "accelerate"),
        ("dcp", "dcp"),
    ]:
        target = _fresh()
        assert pt.load_weights(target, tmp_path / path).format.startswith(fmt)
        assert _equal(target, source)


@pytest.mark.parametrize("strategy", ["cpu", "fsdp"])
def test_paratrain_checkpoints_load_without_the_strategy(tmp_path: Path, strategy: str) -> None:
    with pt.Run(strategy=strategy, ckpt_dir=tmp_path, progress=False) as run:
        torch.manual_seed(0)
        model = run.setup(mlp())
        folder = run.save()
        saved = run.strategy.full_state_dict(model)
    assert folder is not None
    target = _fresh()
    pt.load_weights(target, folder)
    assert all(torch.equal(target.state_dict()[k], saved[k]) for k in saved)


def test_whole_pickled_model_needs_trust(tmp_path: Path, source: nn.Module) -> None:
    torch.save(source, tmp_path / "model.pt")  # the tutorials' torch.save(model)
    with pytest.raises(CheckpointError, match="trust=True"):
        pt.load_weights(_fresh(), tmp_path / "model.pt")
    target = _fresh()
    pt.load_weights(target, tmp_path / "model.pt", trust=True)
    assert _equal(target, source)


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    torch.save({"weight": _Exploit(marker)}, tmp_path / "evil.pt")
    (tmp_path / "evil_dcp").mkdir()
    (tmp_path / "evil_dcp" / ".metadata").write_bytes(pickle.dumps(_Exploit(marker)))
    with pytest.raises(CheckpointError, match="pickled Python objects"):
        pt.load_weights(mlp(), tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="not part of a checkpoint"):
        pt.load_weights(mlp(), tmp_path / "evil_dcp")
    assert not marker.exists()


def _flip_inside_zip_record(path: Path) -> None:
    data = bytearray(path.read_bytes())
    pos = data.find(b"data/0") + 200  # inside the first tensor record's payload
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage,needle",
    [
        ("empty", "empty"),
        ("truncated", "truncated"),
        ("bitflip", "CRC"),
        ("directory", "not a checkpoint folder"),
        ("missing", "does not exist"),
    ],
)
def test_bad_files_are_named(tmp_path: Path, source: nn.Module, damage: str, needle: str) -> None:
    path = tmp_path / "w.pt"
    torch.save(source.state_dict(), path)
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "bitflip":
        _flip_inside_zip_record(path)
    elif damage == "directory":
        path = tmp_path / "somedir"
        path.mkdir()
        (path / "notes.txt").write_text("hi")
    else:
        path = tmp_path / "nope.pt"
    with pytest.raises(CheckpointError, match=needle):
        pt.load_weights(_fresh(), path)


def test_wrong_model_gets_a_key_report(tmp_path: Path, source: nn.Module) -> None:
    state = source.state_dict()
    state["0.extra"] = torch.zeros(1)
    state["4.weight_renamed"] = state.pop("4.weight")
    state["2.weight"] = torch.zeros(3, 3)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    (tmp_path / "w.pt").write_bytes(buffer.getvalue())
    with pytest.raises(CheckpointError) as err:
        pt.load_weights(_fresh(), tmp_path / "w.pt")
    text = str(err.value)
    assert "missing 1 key(s) ['4.weight']" in text
    assert "unexpected 2 key(s)" in text and "2.weight (3, 3) vs model (16, 16)" in text
