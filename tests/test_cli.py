import subprocess
import sys

import pytest

from paratrain import __version__
from paratrain.commands.cli import main


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return int(exit_info.value.code or 0), capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    assert __version__ in capsys.readouterr().out


@pytest.mark.parametrize(
    "args,needle",
    [
        (
            ["--strategy", "nope"],
            "Unknown strategy 'nope'. Available: auto, cpu, single, dp, ddp, fsdp",
        ),
        (["--batch-size", "0"], "argument --batch-size: 0 must be at least 1"),
        (["--grad-accum", "0"], "argument --grad-accum: 0 must be at least 1"),
        (["--precision", "fp8"], "Unknown precision 'fp8'"),
        (["--strategy", "dp"], "strategy 'dp' needs CUDA GPUs"),
        (["--strategy", "cpu", "--nproc", "2"], "runs in one process, but this job has 2 ranks"),
        (["--epochs", "0"], "argument --epochs: 0 must be at least 1"),
    ],
)
def test_demo_bad_input_is_one_paragraph(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(["demo", *args], capsys)
    assert code == 2
    assert err.startswith("paratrain: error:") or "paratrain demo: error: argument" in err
    assert needle in err.replace("\n", " ")
    assert "Traceback" not in err


def test_unknown_flag_and_no_traceback_from_the_installed_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "paratrain", "demo", "--strategy", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "Available:" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "paratrain", "demo", "--frobnicate"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "unrecognized arguments: --frobnicate" in proc.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--torchrun-arg=--", "train.py"],
        ["serve", "--authorized-keys=--"],
        ["run", "--run-dir=--", "train.py"],
    ],
)
def test_dash_dash_as_a_flag_value_is_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "'--' is not a value" in capsys.readouterr().err
