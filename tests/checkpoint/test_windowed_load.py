"""Loading into existing tensors through a small reused buffer: the window reader's contract
(bytes, grouping, verification before hand-over), and resume of model weights window by
window, compared with torch's own ``load_state_dict`` for the module shapes users write.

Window by window is how a model on a GPU is loaded (from the page cache); the tests below make
the CPU models they resume load the same way. A model on the CPU takes freshly read tensors
instead: tests/checkpoint/test_adopted_load.py."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import xxhash
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch import nn

import paratrain as pt
from paratrain.checkpoint import restore as restore_module
from paratrain.checkpoint import store as store_module
from paratrain.checkpoint import verified_reads
from paratrain.checkpoint.manifest import Manifest
from paratrain.checkpoint.state import ModuleLoader
from paratrain.checkpoint.verified_reads import map_windows_verified, read_windows_verified
from paratrain.errors import CheckpointDamagedError, CheckpointError
from paratrain.runtime import save_restore
from tests.support.training import resume_saved


def _file(tmp_path: Path, size: int, block: int) -> tuple[Path, bytes, list[int]]:
    data = bytes((i * 13 + 5) % 251 for i in range(size))
    path = tmp_path / "model.safetensors"
    path.write_bytes(data)
    digests = [xxhash.xxh3_64_intdigest(data[i : i + block]) for i in range(0, size, block)]
    return path, data, digests


ranges = st.lists(st.tuples(st.integers(-5, 420), st.integers(-3, 200)), max_size=10)
fast = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@fast
@given(
    size=st.integers(0, 400), block=st.integers(1, 64), window=st.integers(1, 300), wanted=ranges
)
@example(size=4, block=2, window=1, wanted=[(0, 1), (1, 2)])  # the second straddles blocks 0-1
def test_every_range_is_handed_over_once_with_the_file_s_bytes_in_one_reused_buffer(
    tmp_path: Path, size: int, block: int, window: int, wanted: list[tuple[int, int]]
) -> None:
    path, data, digests = _file(tmp_path, size, block)
    seen: list[int] = []
    pointers = set()
    read: list[int] = []  # every block read from the file, as often as it is read
    real = verified_reads._read_exactly

    def counted(fd: int, path: Path, view: memoryview, offset: int) -> None:
        if view.nbytes:
            read.extend(range(offset // block, -(-(offset + view.nbytes) // block)))
        real(fd, path, view, offset)

    with mock.patch.object(verified_reads, "_read_exactly", counted):
        windows = list(_handed_over(path, size, block, digests, wanted, window))
    inside = sorted(
        (max(0, a), min(size, a + n)) for a, n in wanted if min(size, a + n) > max(0, a)
    )
    if all(hi <= lo for (_, hi), (lo, _) in itertools.pairwise(inside)):
        assert len(read) == len(set(read))  # items do not overlap: a shared block is read once
    for buffer, base, members in windows:
        got = buffer.numpy().tobytes()
        assert got == data[base : base + len(got)]  # the window is the file's bytes from base
        if buffer.numel():
            pointers.add(buffer.untyped_storage().data_ptr())
        for i in members:
            start, length = wanted[i]
            lo, hi = max(0, start), min(size, start + length)
            if hi > lo:  # a range inside the file lies wholly inside its window
                assert base <= lo and hi <= base + len(got)
        seen += members
    assert sorted(seen) == list(range(len(wanted)))
    assert len(pointers) <= 1  # one buffer, reused


def _handed_over(
    path: Path, size: int, block: int, digests: list[int], wanted: Any, window: int
) -> Any:
    """Each window as handed over, its bytes copied (the buffer is reused for the next)."""
    for buffer, base, members in read_windows_verified(
        path, size, block, digests, wanted, window_bytes=window
    ):
        yield _Window(buffer.clone(), buffer.untyped_storage().data_ptr()), base, members


class _Window:
    """A window's bytes, and the address of the buffer they were handed over in."""

    def __init__(self, data: torch.Tensor, pointer: int) -> None:
        self.data, self.pointer = data, pointer

    def numpy(self) -> Any:
        return self.data.numpy()

    def numel(self) -> int:
        return self.data.numel()

    def untyped_storage(self) -> Any:
        return self

    def data_ptr(self) -> int:
        return self.pointer


@fast
@given(
    size=st.integers(1, 400),
    block=st.integers(1, 64),
    window=st.integers(1, 300),
    wanted=ranges,
    flip=st.integers(0, 399),
    verify_first=st.booleans(),
)
def test_a_damaged_block_is_found_before_any_byte_of_its_window_or_with_verify_first_of_the_file(
    tmp_path: Path,
    size: int,
    block: int,
    window: int,
    wanted: list[tuple[int, int]],
    flip: int,
    verify_first: bool,
) -> None:
    path, data, digests = _file(tmp_path, size, block)
    flip %= size
    raw = bytearray(data)
    raw[flip] ^= 0x04
    path.write_bytes(bytes(raw))
    handed: list[tuple[int, int]] = []
    reader = read_windows_verified(
        path, size, block, digests, wanted, window_bytes=window, verify_first=verify_first
    )
    try:
        for buffer, base, _ in reader:
            assert not base <= flip < base + buffer.numel()  # never the damaged bytes
            handed.append((base, buffer.numel()))
    except CheckpointDamagedError as err:
        assert "model.safetensors fails its checksum" in str(err)
        assert not verify_first or all(n == 0 for _, n in handed)
        return
    read = {
        b
        for start, length in wanted
        if min(size, start + length) > max(0, start)
        for b in range(max(0, start) // block, (min(size, start + length) - 1) // block + 1)
    }
    assert flip // block not in read  # no error: the damaged block was never needed


@fast
@given(
    size=st.integers(0, 400),
    block=st.integers(1, 64),
    window=st.integers(1, 300),
    wanted=ranges,
    flip=st.one_of(st.none(), st.integers(0, 399)),
)
def test_mapped_windows_hand_over_the_file_s_bytes_and_never_a_damaged_block(
    tmp_path: Path,
    size: int,
    block: int,
    window: int,
    wanted: list[tuple[int, int]],
    flip: int | None,
) -> None:
    """The page-cache reader (models on a GPU) hands over the windows read_windows_verified
    does, as views of the mapped file, each checked before it is handed over."""
    path, data, digests = _file(tmp_path, size, block)
    expected = [
        (base, members)
        for _, base, members in read_windows_verified(
            path, size, block, digests, wanted, window_bytes=window
        )
    ]
    if flip is not None and size:
        flip %= size
        raw = bytearray(data)
        raw[flip] ^= 0x04
        path.write_bytes(bytes(raw))
    else:
        flip = None
    got: list[tuple[int, list[int]]] = []
    try:
        for view, base, members in map_windows_verified(
            path, size, block, digests, wanted, window_bytes=window
        ):
            assert view.numpy().tobytes() == data[base : base + view.numel()]  # never damaged
            got.append((base, members))
    except CheckpointDamagedError as err:
        assert flip is not None and "fails its checksum" in str(err)
        assert got == expected[: len(got)]
        return
    assert got == expected


def test_a_short_file_or_wrong_checksum_count_is_damage(tmp_path: Path) -> None:
    path, data, digests = _file(tmp_path, 300, 64)
    with pytest.raises(CheckpointDamagedError, match="block checksums"):
        list(read_windows_verified(path, 300, 64, digests[:-1], [(0, 10)]))
    path.write_bytes(data[:-1])
    with pytest.raises(CheckpointDamagedError, match="has 299 bytes"):
        list(read_windows_verified(path, 300, 64, digests, [(0, 10)]))


# -- the module shapes a user writes, loaded window by window -------------------------------------


class _Scaled(nn.Module):
    """A parameter on the module itself, a buffer, and extra state."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self.register_buffer("shift", torch.zeros(3))
        self.calls = 0

    def get_extra_state(self) -> Any:
        return torch.tensor([self.calls])

    def set_extra_state(self, state: Any) -> None:
        self.calls = int(state[0])


class _Zoo(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.root = nn.Parameter(torch.zeros(2))  # on the root module: name without a dot
        self.embed = nn.Embedding(11, 4)
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 11))
        self.head = nn.Linear(4, 11, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).mean(1) + self.root.sum()
        return self.body(h) + self.head(h)


def _trained(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = _Zoo()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    for _ in range(3):
        x = torch.randint(0, 11, (6, 5))
        nn.functional.cross_entropy(model(x), x[:, 0]).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _count_loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of tensors of each window copied into a model, as it happens (models loaded
    window by window, as on a GPU)."""
    monkeypatch.setattr(save_restore, "adoptable", lambda module: False)
    loads: list[int] = []
    real_load = ModuleLoader.load
    monkeypatch.setattr(
        ModuleLoader, "load", lambda self, part: (loads.append(len(part)), real_load(self, part))
    )
    return loads


def test_a_model_with_buffers_tied_weights_and_root_parameters_resumes_window_by_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt = _trained(0)
    with pt.Run(progress=False, ckpt_dir=tmp_path, seed=0) as run:
        run.setup(model, opt)
        folder = run.save()
    assert folder is not None and Manifest.read(folder).files["model.safetensors"].blocks
    monkeypatch.setattr(restore_module, "WINDOW_BYTES", 64)  # one module per window
    loads = _count_loads(monkeypatch)
    fresh, fresh_opt = _trained(1)
    with pt.Run(progress=False, ckpt_dir=tmp_path, seed=0) as run:
        run.setup(fresh, fresh_opt)
        run.resume()
    assert len(loads) > 3  # loaded in several windows, not through one whole copy
    expected, got = _state(model), _state(fresh)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    assert fresh.head.weight is fresh.embed.weight  # still tied
    assert fresh_opt.state_dict()["state"].keys() == opt.state_dict()["state"].keys()


def test_a_model_with_extra_state_and_a_post_hook_resumes_as_load_state_dict_would(
    tmp_path: Path,
) -> None:
    saved = nn.Sequential(_Scaled(), nn.Linear(3, 3))
    saved[0].calls = 7
    with torch.no_grad():
        saved[0].scale.mul_(3)
        saved[0].shift.add_(1)
    with pt.Run(progress=False, ckpt_dir=tmp_path, seed=0) as run:
        run.setup(saved, torch.optim.SGD(saved.parameters(), lr=0.1))
        run.save()
    for hooked in (False, True):
        fresh = nn.Sequential(_Scaled(), nn.Linear(3, 3))
        calls: list[int] = []
        if hooked:  # post-hooks see the whole load: this model is loaded by torch in one piece
            fresh.register_load_state_dict_post_hook(
                lambda module, keys, calls=calls: calls.append(1)
            )
        with pt.Run(progress=False, ckpt_dir=tmp_path, seed=0) as run:
            run.setup(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1))
            run.resume()
        assert fresh[0].calls == 7
        for key, value in saved.state_dict().items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(fresh.state_dict()[key], value), key
        assert calls == ([1] if hooked else [])


def test_a_model_that_does_not_fit_is_refused_before_any_weight_changes(tmp_path: Path) -> None:
    model, opt = _trained(0)
    with pt.Run(progress=False, ckpt_dir=tmp_path, seed=0) as run:
        run.setup(model, opt)
        run.save()
    torch.manual_seed(3)
    other = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 11))
    before = _state(other)
    with pt.Run(progress=False, ckpt_dir=tmp_path, seed=0) as run:
        run.setup(other, torch.optim.AdamW(other.parameters()))
        with pytest.raises(CheckpointError, match="does not fit this model"):
            run.resume()
    after = _state(other)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_flipped_byte_in_the_model_file_falls_back_before_any_of_its_bytes_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    monkeypatch.setattr(store_module, "BLOCK_BYTES", 256)  # several blocks and windows
    monkeypatch.setattr(restore_module, "WINDOW_BYTES", 256)
    with pt.Run(progress=False, ckpt_dir=root, keep_last=None, seed=0) as run:
        model, _ = run.setup(*_trained(0))
        run.save()
        first = _state(model)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        run.global_step += 1
        run.save()
    newest = root / "step-00000001"
    raw = bytearray((newest / "model.safetensors").read_bytes())
    raw[-3] ^= 0x10  # in the last window
    (newest / "model.safetensors").write_bytes(bytes(raw))
    copied = _count_loads(monkeypatch)
    fresh, fresh_opt = _trained(1)
    with pt.Run(progress=False, ckpt_dir=root, seed=0) as run:
        run.setup(fresh, fresh_opt)
        run.resume()
        assert run.global_step == 0
    got = _state(fresh)
    assert all(torch.equal(first[k], got[k]) for k in first)
    assert Manifest.read(newest).files["model.safetensors"].block_bytes == 256
    # Copied in several windows, and only from the intact save: the damaged one was refused
    # before any of its windows reached the model.
    assert len(copied) > 1 and sum(copied) == len(first)


def test_every_checkpoint_damaged_in_its_model_file_still_starts_fresh(tmp_path: Path) -> None:
    from tests.support.training import save_twice

    root = tmp_path / "ck"
    save_twice(root)
    for folder in root.glob("step-*"):
        path = folder / "model.safetensors"
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 1
        path.write_bytes(bytes(raw))
    assert resume_saved(root)["step"] == 0


def test_rotation_leaves_only_the_kept_saves_once_the_store_is_waited_for(tmp_path: Path) -> None:
    with pt.Run(progress=False, ckpt_dir=tmp_path, keep_last=2, seed=0) as run:
        run.setup(*_trained(0))
        for step in range(5):
            run.global_step = step
            run.save()
            assert len(list(tmp_path.glob("step-*"))) == min(step + 1, 2)  # at once
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["step-00000003", "step-00000004"]  # no folder half deleted is left
    shutil.rmtree(tmp_path / "step-00000003")
