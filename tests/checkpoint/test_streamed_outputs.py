"""torch.save files and DCP folders written one tensor at a time by ``ckpt convert``.

The torch.save writer must give the file torch.save gives (the same pickle and records, so that
any torch reads it, mapped or not), and a conversion to pt or dcp must hold one tensor (a DCP
input: one group of tensors) in memory, not the whole state.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from torch import nn

from paratrain.checkpoint.dcp_io import GROUP_BYTES
from paratrain.checkpoint.inspection import convert
from paratrain.checkpoint.loading import read_state_dict
from paratrain.checkpoint.safetensors_io import StoredTensor
from paratrain.checkpoint.torch_save_writer import write_torch_save
from paratrain.errors import CheckpointError
from tests.support.peak_memory import command_peak_bytes


def _entries(state: dict[str, torch.Tensor]) -> dict[str, StoredTensor]:
    return {
        k: StoredTensor(k, t.dtype, list(t.shape), 0, t.numel() * t.element_size())
        for k, t in state.items()
    }


def _same_archive(ours: Path, theirs: Path) -> None:
    """The same records in the same order at the same offsets, with the same bytes; only the
    random ``serialization_id`` torch writes differs."""
    a, b = zipfile.ZipFile(ours), zipfile.ZipFile(theirs)
    assert [(i.filename, i.header_offset) for i in a.infolist()] == [
        (i.filename, i.header_offset) for i in b.infolist()
    ]
    for info in a.infolist():
        if not info.filename.endswith("serialization_id"):
            assert a.read(info) == b.read(info), info.filename


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same dtype, shape and bytes (float8 and the like compare by bytes)."""
    return (a.dtype, a.shape) == (b.dtype, b.shape) and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    )


def test_the_file_is_the_one_torch_save_writes(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied: two names, one storage, as state_dict() gives
    state = dict(model.state_dict())
    state.update(
        {
            "scalar": torch.tensor(2.5),
            "empty": torch.zeros(0, 3),
            "half": torch.randn(3, 2).half(),
            "bf16": torch.randn(5).bfloat16(),
            "steps": torch.arange(7),
            "mask": torch.tensor([True, False, True]),
            "u16": torch.arange(6).to(torch.uint16).reshape(2, 3),
            "f8": torch.randn(9).to(torch.float8_e4m3fn),
            "complex": torch.randn(2, dtype=torch.complex64),
        }
    )
    (tmp_path / "theirs").mkdir()
    (tmp_path / "ours").mkdir()
    torch.save(state, tmp_path / "theirs" / "w.pt")
    read: list[str] = []

    def reader(name: str) -> torch.Tensor:
        read.append(name)
        return state[name]

    tied = {"1.weight": "0.weight"}
    write_torch_save(tmp_path / "ours" / "w.pt", _entries(state), reader, tied=tied)
    _same_archive(tmp_path / "ours" / "w.pt", tmp_path / "theirs" / "w.pt")
    assert "1.weight" not in read and len(read) == len(state) - 1  # a tied name is not read
    for mmap in (False, True):
        back = torch.load(tmp_path / "ours" / "w.pt", weights_only=True, mmap=mmap)
        assert list(back) == list(state)
        assert all(_equal(back[k], state[k]) for k in state)
        assert back["1.weight"].data_ptr() == back["0.weight"].data_ptr()
    checked, _ = read_state_dict(tmp_path / "ours" / "w.pt")  # its CRC-32s checked
    assert all(_equal(checked[k], state[k]) for k in state)


_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int8, torch.int32, torch.uint16]


@settings(max_examples=25, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 5), max_size=3), min_size=1, max_size=6),
    dtypes=st.lists(st.sampled_from(_DTYPES), min_size=6, max_size=6),
)
def test_any_dict_of_tensors_is_written_as_torch_save_writes_it(
    tmp_path_factory: pytest.TempPathFactory, shapes: list[list[int]], dtypes: list[torch.dtype]
) -> None:
    folder = tmp_path_factory.mktemp("w")
    state = {f"t{i}": torch.randint(0, 100, shape).to(dtypes[i]) for i, shape in enumerate(shapes)}
    (folder / "a").mkdir()
    (folder / "b").mkdir()
    torch.save(state, folder / "a" / "x.pt")
    write_torch_save(folder / "b" / "x.pt", _entries(state), state.__getitem__)
    _same_archive(folder / "b" / "x.pt", folder / "a" / "x.pt")


def test_a_view_is_written_with_its_own_bytes_alone(tmp_path: Path) -> None:
    """``read`` may give a view into a larger storage: the record holds the view's bytes."""
    base = torch.arange(20.0)
    state = {"middle": base[5:11].reshape(2, 3), "strided": base[::4]}
    write_torch_save(tmp_path / "v.pt", _entries(state), state.__getitem__)
    back = torch.load(tmp_path / "v.pt", weights_only=True)
    assert torch.equal(back["middle"], state["middle"])
    assert torch.equal(back["strided"], state["strided"])
    assert back["middle"].untyped_storage().nbytes() == 24


@pytest.mark.parametrize(
    "chain",
    [["pt", "dcp", "pt"], ["dcp", "pt", "safetensors"], ["hf", "pt", "dcp", "hf"]],
)
def test_streamed_round_trips_give_back_every_byte(tmp_path: Path, chain: list[str]) -> None:
    torch.manual_seed(0)
    state = {
        "emb.weight": torch.randn(32, 8),
        "proj.weight": torch.randn(8, 8).bfloat16(),
        "norm.bias": torch.randn(8).half(),
        "count": torch.tensor(3),
    }
    save_file(state, str(tmp_path / "src.safetensors"))
    src = tmp_path / "src.safetensors"
    for i, fmt in enumerate(chain):
        dst = tmp_path / f"out{i}.{fmt}"
        convert(src, dst, to=fmt, max_shard_bytes=600)
        src = dst
    back, _ = read_state_dict(src)
    assert sorted(back) == sorted(state)
    assert all(_equal(back[k].contiguous(), state[k]) for k in state)


def test_tied_names_survive_a_folder_that_writes_them_once(tmp_path: Path) -> None:
    """An HF folder records a tied name once, in its index: to pt it shares the kept name's
    storage; to safetensors (which has no ties) it is written as a copy; to hf it stays tied."""
    (tmp_path / "hf").mkdir()
    weight = torch.randn(16, 4)
    save_file({"tok.weight": weight, "ln.bias": torch.zeros(4)},
              str(tmp_path / "hf" / "model.safetensors"))  # fmt: skip
    index = {
        "metadata": {"total_size": 272, "tied": {"head.weight": "tok.weight"}},
        "weight_map": {"tok.weight": "model.safetensors", "ln.bias": "model.safetensors"},
    }
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(json.dumps(index))
    convert(tmp_path / "hf", tmp_path / "w.pt", to="pt")
    back = torch.load(tmp_path / "w.pt", weights_only=True)
    assert torch.equal(back["head.weight"], weight)
    assert back["head.weight"].data_ptr() == back["tok.weight"].data_ptr()
    convert(tmp_path / "hf", tmp_path / "w.safetensors", to="safetensors")
    assert torch.equal(load_file(str(tmp_path / "w.safetensors"))["head.weight"], weight)
    convert(tmp_path / "w.pt", tmp_path / "again", to="hf")
    again = json.loads((tmp_path / "again" / "model.safetensors.index.json").read_text())
    assert again["metadata"]["tied"] == {"head.weight": "tok.weight"}


def test_conversions_to_pt_and_dcp_hold_at_most_one_tensor(tmp_path: Path) -> None:
    """A safetensors input of 256 MiB (8 tensors) converts to pt and to dcp holding far less
    than one of its tensors beyond converting a tiny file (each tensor a view of the mapped
    file); a DCP folder of 512 MiB (8 tensors, two of the 256 MiB groups its reader used to read
    at once) holds at most one tensor. Before, both were read whole into memory."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint import save as dcp_save

    tensor = 32 * 2**20
    big = {f"layer.{i}.weight": torch.full((tensor // 4,), float(i)) for i in range(8)}
    save_file(big, str(tmp_path / "big.safetensors"))
    save_file({"w": torch.zeros(4)}, str(tmp_path / "tiny.safetensors"))
    piece = 2 * tensor  # the DCP input's tensors: 64 MiB each, 4 to a group
    sharded = {f"layer.{i}.weight": torch.full((piece // 4,), float(i)) for i in range(8)}
    assert sum(t.nbytes for t in sharded.values()) == 2 * GROUP_BYTES
    dcp_save(sharded, storage_writer=FileSystemWriter(str(tmp_path / "big.dcp")), no_dist=True)
    dcp_save({"w": torch.zeros(4)}, storage_writer=FileSystemWriter(str(tmp_path / "tiny.dcp")),
             no_dist=True)  # fmt: skip
    del big, sharded

    def held(src: str, out: str, to: str) -> int:
        args = ("ckpt", "convert", str(tmp_path / src), str(tmp_path / out), "--to", to)
        return command_peak_bytes(*args, anonymous=True)

    for to in ("pt", "dcp"):
        grown = held("big.safetensors", f"s.{to}", to) - held("tiny.safetensors", f"ts.{to}", to)
        assert grown < tensor // 2, (to, grown / 2**20)  # views of the mapped input
        grown = held("big.dcp", f"d.{to}", to) - held("tiny.dcp", f"td.{to}", to)
        # torch's DCP writer puts a tensor's data at any offset: each is copied once into an
        # aligned buffer of its own (paratrain's DCP files are aligned: viewed in place)
        assert grown < 1.5 * piece, (to, grown / 2**20)
    back = torch.load(tmp_path / "d.pt", weights_only=True, mmap=True)
    assert all(bool((back[f"layer.{i}.weight"] == i).all()) for i in range(8))
    again, _ = read_state_dict(tmp_path / "s.dcp")
    assert all(bool((again[f"layer.{i}.weight"] == i).all()) for i in range(8))


def test_an_unaligned_tensor_is_copied_rather_than_viewed(tmp_path: Path) -> None:
    """The format allows a float32 tensor at an odd offset (another writer's file): it cannot
    be a view of the mapped file, so it is read into memory of its own."""
    odd, weights = torch.arange(3, dtype=torch.int8), torch.randn(2, 2)
    header = {
        "odd": {"dtype": "I8", "shape": [3], "data_offsets": [0, 3]},
        "weights": {"dtype": "F32", "shape": [2, 2], "data_offsets": [3, 19]},
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    data = odd.numpy().tobytes() + weights.numpy().tobytes()
    (tmp_path / "odd.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    convert(tmp_path / "odd.safetensors", tmp_path / "odd.pt", to="pt")
    back = torch.load(tmp_path / "odd.pt", weights_only=True)
    assert torch.equal(back["odd"], odd) and torch.equal(back["weights"], weights)


def _sharded_checkpoint(tmp_path: Path, world: int) -> tuple[dict[str, torch.Tensor], Path]:
    """A one-process paratrain checkpoint of a small model, resharded offline for FSDP at
    ``world`` ranks: every parameter in ``world`` pieces by rows, in the ranks' own files."""
    import paratrain as pt
    from paratrain.checkpoint.reshard import reshard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 3))
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path / "one", progress=False) as run:
        wrapped, opt = run.setup(model, torch.optim.AdamW(model.parameters()))
        run.backward(wrapped(torch.randn(4, 6)).sum())
        run.step(opt)
        folder = run.save()
    assert folder is not None
    done = reshard(folder, tmp_path / "sharded", layout="fsdp", world=world)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, Path(done["path"])


def test_a_sharded_checkpoint_is_read_from_its_mapped_files(tmp_path: Path) -> None:
    """Parameters in three row pieces across three files are assembled from views of the mapped
    files (the group reader is never needed), each block checked before use."""
    from paratrain.checkpoint import dcp_io

    weights, folder = _sharded_checkpoint(tmp_path, world=3)
    grouped: list[str] = []
    real = dcp_io.DcpTensors.read

    def read(self: dcp_io.DcpTensors, key: str) -> torch.Tensor:
        grouped.append(key)
        return real(self, key)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dcp_io.DcpTensors, "read", read)
        convert(folder, tmp_path / "w.safetensors", to="safetensors")
    assert not grouped
    back = load_file(str(tmp_path / "w.safetensors"))
    assert sorted(back) == sorted(weights)
    assert all(torch.equal(back[k], weights[k]) for k in weights)


def test_a_damaged_block_of_a_mapped_file_is_refused(tmp_path: Path) -> None:
    _, folder = _sharded_checkpoint(tmp_path, world=2)
    shard = folder / "dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"__1_0\.distcp"):
        convert(folder, tmp_path / "w.pt", to="pt")
    assert not (tmp_path / "w.pt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-w.pt")]


def test_a_view_of_a_mapped_file_is_written_as_its_own_bytes(tmp_path: Path) -> None:
    """Tensors viewed in a mapped input (a safetensors file, a DCP folder) are written with their
    bytes alone, never with the whole mapping behind them (torch.save writes a view's whole
    storage)."""
    state = {f"t{i}": torch.full((256, 256), float(i)) for i in range(8)}
    save_file(state, str(tmp_path / "in.safetensors"))
    convert(tmp_path / "in.safetensors", tmp_path / "in.dcp", to="dcp")
    for src in ("in.safetensors", "in.dcp"):
        size = sum(p.stat().st_size for p in [tmp_path / src, *(tmp_path / src).rglob("*")]
                   if p.is_file())  # fmt: skip
        for to in ("pt", "dcp"):
            out = tmp_path / f"{src}-out.{to}"
            convert(tmp_path / src, out, to=to)
            files = list(out.rglob("*")) if out.is_dir() else [out]
            written = sum(p.stat().st_size for p in files)
            assert written < 1.1 * size, (src, to, written, size)
            back, _ = read_state_dict(out)
            assert all(torch.equal(back[k], state[k]) for k in state)


@pytest.mark.parametrize("to", ["pt", "dcp", "safetensors", "hf"])
def test_a_disk_that_fills_up_is_one_message_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str
) -> None:
    """The second tensor's write fails (no space left): one CheckpointError naming the cause,
    and neither the output nor its staging folder is left beside it."""
    import errno

    from paratrain.checkpoint import streamed

    state = {"a": torch.ones(8), "b": torch.zeros(8)}
    save_file(state, str(tmp_path / "in.safetensors"))
    real = streamed.Source.read
    calls: list[str] = []

    def read(self: streamed.Source, name: str) -> torch.Tensor:
        calls.append(name)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, name)

    monkeypatch.setattr(streamed.Source, "read", read)
    (tmp_path / "out").mkdir()
    with pytest.raises(CheckpointError, match="No space left on device"):
        convert(tmp_path / "in.safetensors", tmp_path / "out" / f"w.{to}", to=to)
    assert list((tmp_path / "out").iterdir()) == []


_LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails (EFBIG)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
from paratrain.commands.cli import main
sys.exit(main(["ckpt", "convert", *sys.argv[1:]]))
"""


@pytest.mark.parametrize("to", ["pt", "dcp", "safetensors", "hf"])
def test_a_write_the_file_system_refuses_is_one_message_and_leaves_nothing(
    tmp_path: Path, to: str
) -> None:
    """Files may not grow past 64 KiB (as a full disk refuses a write): the conversion of
    256 KiB stops with exit code 2 and one paragraph naming the failure. torch's archive writer
    used to abort the process (--to pt: SIGABRT from its destructor) or hide the failure behind
    its own error (--to dcp: a traceback)."""
    import subprocess
    import sys

    save_file({f"t{i}": torch.ones(16 * 1024) for i in range(4)}, str(tmp_path / "in.safetensors"))
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / f"w.{to}"
    done = subprocess.run(
        [sys.executable, "-c", _LIMITED, str(tmp_path / "in.safetensors"), str(out), "--to", to],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "nothing was written" in said, said
    assert list((tmp_path / "out").iterdir()) == []


def test_a_tensor_named_like_the_safetensors_metadata_is_refused(tmp_path: Path) -> None:
    torch.save({"__metadata__": torch.ones(2), "x": torch.zeros(1)}, tmp_path / "in.pt")
    for to in ("safetensors", "hf"):
        with pytest.raises(CheckpointError, match="__metadata__"):
            convert(tmp_path / "in.pt", tmp_path / f"out.{to}", to=to)
        assert not (tmp_path / f"out.{to}").exists()
    convert(tmp_path / "in.pt", tmp_path / "out.pt", to="pt")  # pt holds any name
    assert torch.equal(torch.load(tmp_path / "out.pt", weights_only=True)["__metadata__"],
                       torch.ones(2))  # fmt: skip
