"""load_weights on every supported format, and on files that must be refused."""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn

import paratrain as pt
from paratrain.checkpoint import inspection
from paratrain.checkpoint.loading import read_state_dict
from paratrain.errors import CheckpointError, ConfigError
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


def _dotted_global_pickle(marker: Path) -> bytes:
    """Protocol 4 resolves dotted names: ``<allowed DCP module>.os.system`` reaches os.system."""
    parts = ["torch.distributed.checkpoint.filesystem", "os.system", f"touch {marker}"]
    ops = [b"\x8c" + bytes([len(p)]) + p.encode() for p in parts]
    return b"\x80\x04" + ops[0] + ops[1] + b"\x93" + ops[2] + b"\x85R."


def test_malicious_pickle_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    torch.save({"weight": _Exploit(marker)}, tmp_path / "evil.pt")
    for name, pickled in [
        ("evil_dcp", pickle.dumps(_Exploit(marker))),
        ("dotted_dcp", _dotted_global_pickle(marker)),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / ".metadata").write_bytes(pickled)
    with pytest.raises(CheckpointError, match="pickled Python objects"):
        pt.load_weights(mlp(), tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="not part of a checkpoint"):
        pt.load_weights(mlp(), tmp_path / "evil_dcp")
    with pytest.raises(CheckpointError, match="not part of a checkpoint"):
        pt.load_weights(mlp(), tmp_path / "dotted_dcp")
    assert not marker.exists()


@pytest.mark.parametrize("trust", ["no", "False", "", 0, 1, None, [True]], ids=repr)
def test_trust_must_be_a_real_bool(tmp_path: Path, trust: Any) -> None:
    marker = tmp_path / "pwned"
    torch.save(_Exploit(marker), tmp_path / "whole_module.pt")  # runs code if unpickled freely
    path = tmp_path / "whole_module.pt"
    calls = [
        lambda: pt.load_weights(mlp(), path, trust=trust),
        lambda: read_state_dict(path, trust=trust),
        lambda: inspection.inspect(path, trust=trust),
        lambda: inspection.convert(path, tmp_path / "out.pt", to="pt", trust=trust),
        lambda: inspection.diff(path, path, trust=trust),
    ]
    for call in calls:
        with pytest.raises(ConfigError, match="trust must be True or False"):
            call()
    assert not marker.exists() and not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize(
    "content",
    [
        b"hello, this is a text file\n",
        b"root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n",
        b'{"not": "a checkpoint"}',
        bytes(range(256)),
    ],
    ids=["text", "passwd", "json", "binary"],
)
def test_files_that_are_not_checkpoints(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "weights.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="is not a checkpoint") as err:
        pt.load_weights(mlp(), path)
    assert "paratrain reads torch.save files" in str(err.value)


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A real 1-rank gloo process group: DDP and FSDP2 work on CPU with it."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _fully_sharded() -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = _fresh()
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    return model


WRAPPED = {
    "ddp": lambda: nn.parallel.DistributedDataParallel(_fresh()),
    "compiled": lambda: torch.compile(_fresh()),
    "ddp_of_compiled": lambda: nn.parallel.DistributedDataParallel(torch.compile(_fresh())),
    "fsdp2": _fully_sharded,
}


@pytest.mark.parametrize("wrapper", sorted(WRAPPED))
def test_wrapped_models_load(
    tmp_path: Path, source: nn.Module, one_rank_group: None, wrapper: str
) -> None:
    torch.save(source.state_dict(), tmp_path / "w.pt")
    model = WRAPPED[wrapper]()
    report = pt.load_weights(model, tmp_path / "w.pt")
    loaded = {
        k: v.full_tensor() if hasattr(v, "full_tensor") else v
        for k, v in pt.checkpoint.loading.unwrap(model).state_dict().items()
    }
    assert report.keys == 6 and loaded.keys() == source.state_dict().keys()
    assert all(torch.equal(loaded[k], v) for k, v in source.state_dict().items())


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


def test_a_missing_gpu_as_map_location_is_named(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("needs a machine without GPUs")
    path = tmp_path / "w.pt"
    torch.save(nn.Linear(2, 2).state_dict(), path)
    with pytest.raises(CheckpointError, match="visible GPU"):
        pt.load_weights(nn.Linear(2, 2), path, map_location="cuda")
    with pytest.raises(CheckpointError, match="is not a device"):
        pt.load_weights(nn.Linear(2, 2), path, map_location="gpu7")
