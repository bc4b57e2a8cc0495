"""Tensors saved by torch.save, read out of memory without a copy, exactly as torch.load reads
them; anything that is not a plain saved tensor is left to torch.load."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from paratrain.checkpoint.saved_tensor import saved_tensor
from tests.support.saved import PLAIN_DTYPES, in_buffer, saved_bytes


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(PLAIN_DTYPES))
    shape = draw(st.lists(st.integers(0, 5), max_size=3))
    base = (torch.rand(shape) * 100).to(dtype)
    view = draw(st.sampled_from(["whole", "transposed", "sliced", "stepped"]))
    if view == "transposed" and base.dim() >= 2:
        return base.transpose(0, 1)
    if view == "sliced" and base.dim() >= 1 and base.shape[0] > 1:
        return base[1:]  # torch.save keeps the whole storage and an offset into it
    if view == "stepped" and base.dim() >= 1:
        return base[::2]
    return base


@settings(max_examples=150, deadline=None)
@given(tensor=tensors(), lead=st.integers(0, 70))
def test_a_saved_tensor_reads_as_torch_load_reads_it(tensor: torch.Tensor, lead: int) -> None:
    data = saved_bytes(tensor)
    buffer = in_buffer(data, lead)
    got = saved_tensor(buffer, lead, len(data))
    want = torch.load(io.BytesIO(data), weights_only=True)
    assert got is not None
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got, want)


def test_an_aligned_tensor_is_a_view_of_the_buffer_not_a_copy() -> None:
    data = saved_bytes(torch.arange(1000, dtype=torch.float32))
    buffer = in_buffer(data, 64)
    got = saved_tensor(buffer, 64, len(data))
    assert got is not None
    start, end = buffer.data_ptr(), buffer.data_ptr() + buffer.numel()
    assert start <= got.data_ptr() < end
    buffer.zero_()
    assert torch.count_nonzero(got) == 0


@pytest.mark.parametrize(
    "obj",
    [
        {"w": torch.ones(3)},  # not one tensor
        [torch.ones(3)],
        nn.Parameter(torch.ones(3)),  # another rebuild function
        3,
        "text",
    ],
    ids=["dict", "list", "parameter", "int", "str"],
)
def test_anything_but_a_plain_tensor_is_left_to_torch_load(obj: object) -> None:
    data = saved_bytes(obj)
    assert saved_tensor(in_buffer(data, 0), 0, len(data)) is None


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=600), seed=st.integers(0, 2**16))
def test_damaged_or_foreign_bytes_never_raise(data: bytes, seed: int) -> None:
    good = bytearray(saved_bytes(torch.arange(12, dtype=torch.int16).reshape(3, 4)))
    rng = __import__("random").Random(seed)
    for _ in range(rng.randint(1, 4)):  # flips inside a real archive
        good[rng.randrange(len(good))] ^= 1 << rng.randrange(8)
    for blob in (data, bytes(good)):
        result = saved_tensor(in_buffer(blob, 3), 3, len(blob))
        assert result is None or isinstance(result, torch.Tensor)
