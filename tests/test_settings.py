"""Every Run setting is checked in one place: generated bad values give a ParatrainError naming the
setting (never another exception, never a leaked process group), good ones give a Run."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import paratrain as pt
from paratrain.config import _CHECKS, RunConfig, settings_table
from paratrain.errors import ConfigError, ParatrainError

FIELDS = [f.name for f in dataclasses.fields(RunConfig)]
HOSTILE: list[Any] = [
    None, True, False, 0, -1, 1, 2, 1.5, -0.5, math.inf, math.nan, 1e300, 2**64, "", "abc",
    "600", "no", "ddp", "Linear", b"runs", [nn.Linear], [0, 1], (nn.Linear,), {}, Path(""),
    Path("runs/x"), object(), nn.Linear, lambda m: False,
]  # fmt: skip


def test_every_setting_has_a_check_and_the_readme_table_is_made_from_them() -> None:
    assert set(_CHECKS) == set(FIELDS)
    readme = (Path(__file__).parents[1] / "docs" / "reference" / "settings.md").read_text()
    assert settings_table() in readme, (
        "The settings table in docs/reference/settings.md is out of date. Replace it with the "
        "output of\n"
        "python -c 'from paratrain.config import settings_table; print(settings_table())'"
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(FIELDS), value=st.sampled_from(HOSTILE))
def test_any_value_of_any_setting_is_a_run_or_a_paratrain_error(name: str, value: Any) -> None:
    try:
        run = pt.Run(**{"progress": False, "stats_every": None, name: value})
    except ParatrainError as err:
        assert name in str(err) or "strategy" in str(err) or "accelerator" in str(err), str(err)
    else:
        run.close()
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    "call,needle",
    [
        (lambda: pt.Run(grad_acum=4), "Did you mean 'grad_accum'?"),
        (lambda: pt.Run("ddp"), "pt.Run(strategy='ddp')"),
        (lambda: pt.Run(seed=1.5e12), "seed must be an integer"),
        (lambda: pt.Run(timeout_s="600"), "timeout_s must be a number"),
        (lambda: pt.Run(timeout_s=True), "timeout_s must be a number"),
        (lambda: pt.Run(max_grad_norm=True), "max_grad_norm must be None or a number"),
        (lambda: pt.Run(tensorboard="no"), "tensorboard must be True or False"),
        (lambda: pt.Run(fsdp_wrap=[nn.Linear]), "fsdp_wrap must be a tuple of module classes"),
        (lambda: pt.Run(run_dir=""), "run_dir must be a folder path"),
        (lambda: pt.Run(strategy="fsdp", comm_hook="fp16"), "comm_hook is a 'ddp' option"),
        (lambda: pt.Run(strategy="ddp", fsdp_wrap=(nn.Linear,)), "fsdp_wrap is a 'fsdp',"),
        (lambda: pt.Run(strategy="cpu", device_ids=[0]), "device_ids is a 'dp' option"),
    ],
)
def test_bad_settings_name_the_fix(call: Any, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        call()
    assert needle in str(err.value)
    assert not dist.is_initialized()


def test_a_file_as_run_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        pt.Run(run_dir=tmp_path / "file")


def test_a_large_seed_reaches_the_loader() -> None:
    with pt.Run(strategy="cpu", seed=2**62, progress=False) as run:
        loader = run.loader(torch_dataset(), batch_size=2)
        assert len(list(loader)) == 2


def test_auto_notes_options_of_another_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    with pt.Run(comm_hook="fp16", progress=False):
        pass
    assert "comm_hook is a 'ddp' option" in capsys.readouterr().err


def torch_dataset() -> Any:
    import torch

    return torch.utils.data.TensorDataset(torch.zeros(4, 2))


@pytest.mark.parametrize(
    "settings,needle",
    [
        (
            dict(strategy="cpu", fsdp_offload=True),
            "fsdp_offload is a 'fsdp', 'tp' or 'pipeline' option",
        ),
        (dict(strategy="cpu", comm_hook="powersgd"), "comm_hook is a 'ddp' option"),
        (dict(strategy="cpu", powersgd_rank=2), "powersgd_rank is a 'ddp' option"),
        (dict(powersgd_rank=0), "powersgd_rank must be a positive integer"),
        (dict(powersgd_warmup=1), "powersgd_warmup must be an integer >= 2"),
        (dict(fsdp_reshard_after_forward="no"), "fsdp_reshard_after_forward"),
    ],
)
def test_model_parallel_options_are_checked_up_front(
    settings: dict[str, object], needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        pt.Run(progress=False, **settings)  # type: ignore[arg-type]
