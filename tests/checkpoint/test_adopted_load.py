"""Resume of a model on the CPU: its checkpoint files are read into one fresh tensor per entry
(every byte checked as it arrives) and the model takes them as its storage, with no copy.

The reader's contract (bytes, checks, one storage per tensor) over random files, and resume of
the module shapes users write against torch's own ``load_state_dict``: the tensors that may not
take a new storage (tied through ``.data``, channels_last, in a module with its own loading
code) are copied into instead, and everything trains on identically afterwards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from torch import nn

import paratrain as pt
from paratrain.checkpoint.manifest import FileRecord, Manifest
from paratrain.checkpoint.tensor_reads import read_tensors_verified
from paratrain.errors import CheckpointDamagedError

fast = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.float64]


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[tuple[str, torch.dtype, list[int], int]], int]:
    """Entries (name, dtype, shape, gap before it) of a safetensors file, and a block size."""
    count = draw(st.integers(0, 6))
    entries = []
    for i in range(count):
        dtype = draw(st.sampled_from(DTYPES))
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        gap = draw(st.integers(0, 3)) * dtype.itemsize  # gaps a foreign writer may leave
        entries.append((f"t{i}", dtype, shape, gap))
    return entries, draw(st.integers(1, 96))


def _write(
    path: Path, entries: list[tuple[str, torch.dtype, list[int], int]], seed: int
) -> dict[str, torch.Tensor]:
    """A safetensors file with gaps between tensors (aligned), written by hand."""
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64"}
    names |= {torch.uint8: "U8", torch.float64: "F64"}
    gen = torch.Generator().manual_seed(seed)
    tensors, header, body, at = {}, {}, bytearray(), 0
    for name, dtype, shape, gap in entries:
        pad = gap + (-at % dtype.itemsize)
        body += bytes(pad)
        at += pad
        t = (torch.rand(shape, generator=gen) * 100).to(dtype)
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": names[dtype], "shape": shape, "data_offsets": [at, at + len(raw)]}
        body += raw
        at += len(raw)
        tensors[name] = t
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(body))
    return tensors


def _records(path: Path, block: int) -> list[FileRecord]:
    data = path.read_bytes()
    blocks = [xxhash.xxh3_64_intdigest(data[i : i + block]) for i in range(0, len(data), block)]
    return [
        FileRecord(bytes=len(data), xxh3_64=xxhash.xxh3_64_intdigest(data)),
        FileRecord(bytes=len(data), block_bytes=block, blocks=blocks),
    ]


@fast
@given(layout=layouts(), flip=st.one_of(st.none(), st.integers(0, 10_000)))
def test_every_tensor_comes_back_in_its_own_storage_or_the_damage_is_found(
    tmp_path: Path,
    layout: tuple[list[tuple[str, torch.dtype, list[int], int]], int],
    flip: int | None,
) -> None:
    entries, block = layout
    path = tmp_path / "optimizer.safetensors"
    written = _write(path, entries, seed=len(entries))
    for record in _records(path, block):
        if flip is not None:  # any byte: header, a tensor or a gap
            raw = bytearray(path.read_bytes())
            raw[flip % len(raw)] ^= 0x20
            path.write_bytes(bytes(raw))
            with pytest.raises(CheckpointDamagedError, match=r"optimizer\.safetensors"):
                read_tensors_verified(path, record)
            _write(path, entries, seed=len(entries))
            continue
        got = read_tensors_verified(path, record)
        assert got.keys() == written.keys()
        for name, tensor in got.items():
            assert tensor.dtype == written[name].dtype and torch.equal(tensor, written[name])
            assert tensor.untyped_storage().nbytes() == tensor.nbytes  # nothing else in it
        storages = {t.untyped_storage().data_ptr() for t in got.values() if t.numel()}
        assert len(storages) == sum(1 for t in got.values() if t.numel())


def test_a_short_file_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    _write(path, [("w", torch.float32, [4, 4], 0)], seed=0)
    record = _records(path, 16)[1]
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(CheckpointDamagedError, match=r"has \d+ bytes, expected"):
        read_tensors_verified(path, record)


# -- resume: the module shapes a user writes ----------------------------------------------------


class _Hooked(nn.Linear):
    """Its own loading code: a pre-hook that scales what is loaded."""

    def __init__(self) -> None:
        super().__init__(3, 3)
        self._register_load_state_dict_pre_hook(self._halve)

    @staticmethod
    def _halve(state: dict[str, torch.Tensor], prefix: str, *args: object) -> None:
        state[prefix + "bias"] = state[prefix + "bias"] / 2


class _Zoo(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 4)
        self.conv = nn.Conv2d(1, 4, 3).to(memory_format=torch.channels_last)
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 11))
        self.head = nn.Linear(4, 11, bias=False)
        self.head.weight = self.embed.weight  # tied: one parameter
        self.mirror = nn.Linear(4, 4)
        self.copy = nn.Linear(4, 4)
        self.copy.weight.data = self.mirror.weight.data  # two parameters, one storage
        self.hooked = _Hooked()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).mean(1)
        picture = self.conv(h[:, None, :, None].expand(-1, 1, 4, 3)).mean((2, 3))
        h = h + picture + self.mirror(h) + self.copy(h) + self.hooked(h[:, :3]).sum(1, True)
        return self.body(h) + self.head(h)


def _trained(seed: int, steps: int = 3) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = _Zoo()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    _train(model, opt, steps, seed)
    return model, opt


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, 11, (6, 5), generator=gen)
        nn.functional.cross_entropy(model(x), x[:, 0]).backward()
        opt.step()
        opt.zero_grad()


def test_a_cpu_model_takes_its_tensors_and_trains_on_as_after_load_state_dict(
    tmp_path: Path,
) -> None:
    saved, saved_opt = _trained(0)
    with pt.Run(progress=False, ckpt_dir=tmp_path, seed=0) as run:
        run.setup(saved, saved_opt)
        run.save()
    fresh, fresh_opt = _trained(1)
    params = dict(fresh.named_parameters())
    before = {name: p.untyped_storage().data_ptr() for name, p in params.items()}
    with pt.Run(progress=False, ckpt_dir=tmp_path, seed=0) as run:
        run.setup(fresh, fresh_opt)
        assert run.resume() is not None
    # The reference: torch's own loading into a third model.
    reference, reference_opt = _trained(2)
    reference.load_state_dict(saved.state_dict())
    reference_opt.load_state_dict(saved_opt.state_dict())
    for key, value in reference.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    assert dict(fresh.named_parameters()) == params  # the same parameter objects
    taken = [n for n, p in params.items() if p.untyped_storage().data_ptr() != before[n]]
    assert "body.0.weight" in taken and "mirror.bias" in taken  # no copy
    assert fresh.head.weight is fresh.embed.weight  # still tied
    assert fresh.copy.weight.data_ptr() == fresh.mirror.weight.data_ptr()  # still one storage
    assert "mirror.weight" not in taken
    assert fresh.conv.weight.stride() == reference.conv.weight.stride()  # its layout kept
    assert "hooked.bias" not in taken  # loaded through its pre-hook
    assert fresh_opt.param_groups[0]["params"] == list(fresh.parameters())
    _train(fresh, fresh_opt, 4, seed=9)
    _train(reference, reference_opt, 4, seed=9)
    for key, value in reference.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_what_resume_loads_owns_its_memory_and_saves_with_safetensors(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    with pt.Run(progress=False, ckpt_dir=tmp_path / "ck", seed=0) as run:
        run.setup(model, opt)
        run.save()
    fresh = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    fresh_opt = torch.optim.Adam(fresh.parameters())
    with pt.Run(progress=False, ckpt_dir=tmp_path / "ck", seed=0) as run:
        run.setup(fresh, fresh_opt)
        run.resume()
    save_file(fresh.state_dict(), str(tmp_path / "weights.safetensors"))  # refuses shared memory
    for state in fresh_opt.state.values():
        for value in state.values():
            if value.numel() > 1:
                assert value.untyped_storage().nbytes() == value.nbytes


def test_a_damaged_optimizer_file_leaves_the_model_as_it_was(tmp_path: Path) -> None:
    saved, saved_opt = _trained(0)
    with pt.Run(progress=False, ckpt_dir=tmp_path, seed=0) as run:
        run.setup(saved, saved_opt)
        folder = run.save()
    assert folder is not None
    path = folder / "optimizer.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x01
    path.write_bytes(bytes(raw))
    fresh, fresh_opt = _trained(1)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pt.Run(progress=False, ckpt_dir=tmp_path, seed=0) as run:
        run.setup(fresh, fresh_opt)
        assert run.resume() is None  # the only checkpoint is damaged: a fresh start
    for key, value in before.items():
        assert torch.equal(fresh.state_dict()[key], value), key
    assert Manifest.read(folder).files["optimizer.safetensors"].bytes == len(raw)


def _round_trip(tmp_path: Path, make: Any) -> tuple[dict[str, Any], torch.Tensor]:
    """Save the models ``make(0)`` builds, resume them into ``make(1)``'s; the first model's
    ``weight.data`` is taken (by user code, say) before the resume."""
    saved = make(0)
    with pt.Run(progress=False, ckpt_dir=tmp_path, seed=0) as run:
        for i, model in enumerate(saved["models"]):
            run.setup(model, name=f"m{i}")
        run.save()
    fresh = make(1)
    held = fresh["models"][0].weight.data
    with pt.Run(progress=False, ckpt_dir=tmp_path, seed=0) as run:
        for i, model in enumerate(fresh["models"]):
            run.setup(model, name=f"m{i}")
        run.resume()
    for got, want in zip(fresh["models"], saved["models"], strict=True):
        for key, value in want.state_dict().items():
            assert torch.equal(got.state_dict()[key], value), key
    return fresh, held


def test_storage_held_outside_the_model_keeps_seeing_the_loaded_values(tmp_path: Path) -> None:
    """As after load_state_dict: a held ``.data``, a user's flat buffer the weight views, and a
    storage shared by two models all see the resumed values (those tensors are copied into)."""

    def held_data(seed: int) -> dict[str, Any]:
        torch.manual_seed(seed)
        return {"models": [nn.Linear(4, 2)]}

    fresh, held = _round_trip(tmp_path / "a", held_data)
    assert torch.equal(held, fresh["models"][0].weight)

    def flat_buffer(seed: int) -> dict[str, Any]:
        torch.manual_seed(seed)
        flat, model = torch.randn(8), nn.Linear(4, 2, bias=False)
        model.weight = nn.Parameter(flat.view(2, 4))
        return {"models": [model], "flat": flat}

    fresh, _ = _round_trip(tmp_path / "b", flat_buffer)
    assert torch.equal(fresh["flat"].view(2, 4), fresh["models"][0].weight)

    def two_models(seed: int) -> dict[str, Any]:
        torch.manual_seed(seed)
        a, b = nn.Linear(4, 4), nn.Linear(4, 4)
        b.weight.data = a.weight.data
        return {"models": [a, b]}

    fresh, _ = _round_trip(tmp_path / "c", two_models)
    assert fresh["models"][0].weight.data_ptr() == fresh["models"][1].weight.data_ptr()


def test_float64_after_a_narrower_tensor_and_a_parent_s_pre_hook_resume_as_torch_loads(
    tmp_path: Path,
) -> None:
    """float64 weights with Adam (a float32 ``step`` beside them) resume; a pre-hook on a
    parent module that rewrites a child's keys is applied, as load_state_dict applies it."""

    class Parent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.child = nn.Linear(3, 2).double()
            self.register_buffer("flag", torch.ones(3, dtype=torch.bool))
            self._register_load_state_dict_pre_hook(self._shift)

        @staticmethod
        def _shift(state: dict[str, torch.Tensor], prefix: str, *args: object) -> None:
            state[prefix + "child.bias"] = state[prefix + "child.bias"] + 1

    torch.manual_seed(0)
    saved = Parent()
    opt = torch.optim.Adam(saved.parameters())
    saved.child(torch.randn(4, 3, dtype=torch.float64)).sum().backward()
    opt.step()
    with pt.Run(progress=False, ckpt_dir=tmp_path, seed=0) as run:
        run.setup(saved, opt)
        run.save()
    reference = Parent()
    reference.load_state_dict(saved.state_dict())
    fresh = Parent()
    with pt.Run(progress=False, ckpt_dir=tmp_path, seed=0) as run:
        run.setup(fresh, torch.optim.Adam(fresh.parameters()))
        assert run.resume() is not None
    for key, value in reference.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
