"""The public functions that take user values — load_weights, save_weights, launch — with hostile
arguments: a paratrain error naming the argument, or the call works; never another exception."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import paratrain as pt
from paratrain.errors import ParatrainError

ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=8),
    st.sampled_from([[], {}, (), object(), nn.Linear, "x" * 300, b"w.pt", 1j]),
)


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 2))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("inputs")
    torch.save(_model().state_dict(), root / "w.pt")
    torch.save(_model(), root / "whole.pt")
    (root / "afile").write_text("text")
    with contextlib.chdir(root):
        yield root


PATHS = st.one_of(
    st.sampled_from(["w.pt", "whole.pt", "afile", "missing.pt", "", ".", "/proc/x", "a" * 300]),
    st.sampled_from([Path("w.pt"), Path("whole.pt")]),
    ODD,
)
MAP = st.one_of(
    st.sampled_from(["cpu", "cuda", "cuda:1", "meta", "mps", "cpu:0", "gpu", torch.device("cpu")]),
    st.sampled_from([{"cuda:0": "cpu"}, lambda storage, loc: storage]),
    ODD,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    model=st.one_of(st.just("model"), ODD),
    path=PATHS,
    map_location=st.one_of(st.just("cpu"), MAP),
    trust=st.one_of(st.just(False), ODD),
)
def test_load_weights_arguments(
    files: Path, model: Any, path: Any, map_location: Any, trust: Any
) -> None:
    target = _model() if model == "model" else model
    try:
        pt.load_weights(target, path, map_location=map_location, trust=trust)
    except ParatrainError as err:
        assert str(err)
        return
    assert isinstance(target, nn.Module) and trust in (True, False)


@pytest.fixture(scope="module")
def run(files: Path) -> Iterator[pt.Run]:
    with pt.Run(strategy="cpu", run_dir="runs/inputs") as r:
        yield r


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(model=st.one_of(st.just("model"), ODD), path=PATHS)
def test_save_weights_arguments(run: pt.Run, model: Any, path: Any) -> None:
    target = _model() if model == "model" else model
    out = path
    if path in ("w.pt", "whole.pt", Path("w.pt"), Path("whole.pt")):
        out = "out.pt"  # keep the inputs of the other tests intact
    elif path == "afile":
        out = "afile/out.pt"
    try:
        run.save_weights(target, out)
    except ParatrainError as err:
        assert str(err)
        return
    assert isinstance(target, nn.Module) and Path(out).is_file()


def work(x: int) -> int:
    return x + 1


class Reached(Exception):
    """launch got past its checks to starting ranks."""


@settings(max_examples=150, deadline=None)
@given(
    fn=st.one_of(st.just(work), st.sampled_from([lambda: 1, print, 5, "work", None]), ODD),
    nproc=st.one_of(st.just(2), ODD),
    args=st.one_of(st.just((1,)), st.sampled_from([(threading.Lock(),), [1], (lambda: 1,)]), ODD),
    timeout_s=st.one_of(st.just(60), ODD),
)
def test_launch_arguments(fn: Any, nproc: Any, args: Any, timeout_s: Any) -> None:
    def reached(*_: Any, **__: Any) -> Any:
        raise Reached

    with mock.patch("paratrain.distributed.spawn.spawn_ranks", reached):
        try:
            pt.launch(fn, nproc, args, timeout_s=timeout_s)
        except ParatrainError as err:
            assert str(err)
            return
        except Reached:
            pass
    assert callable(fn) and isinstance(nproc, int) and isinstance(args, tuple)
