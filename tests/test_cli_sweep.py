"""Every flag of every subcommand, with hostile values: the command either reaches its real work
or ends with a paratrain error (exit code 2) or its documented verdict (exit 1), never a traceback.

The flags are read off the parser itself, so a new flag is swept without editing this file. The
real work (torchrun for `run`, `demo` and `verify-resume`, the benchmark ranks, doctor's
measurements) is replaced by a marker: what is tested is everything that happens before it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paratrain.commands.cli import build_parser, main


class Reached(Exception):
    """The command got past its checks to the real work."""


def _reach(*_: Any, **__: Any) -> Any:
    raise Reached


def _options() -> list[tuple[tuple[str, ...], argparse.Action]]:
    """(command path, action) for every option and positional of every subcommand."""
    found: list[tuple[tuple[str, ...], argparse.Action]] = []

    def walk(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk((*path, name), sub)
            elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                found.append((path, action))

    walk((), build_parser())
    return found


OPTIONS = _options()
COMMANDS = sorted({path for path, _ in OPTIONS})

JUNK = [
    "", " ", "-", "--", "abc", "0", "-1", "1", "2", "1.5", "1e9", "nan", "inf", "²", "Ω",
    "99999", "2**64", "a" * 300, "x:y", ":", "localhost:1", "1,,2", ",",
]  # fmt: skip
PATHS = ["missing.pt", "afile", "empty.pt", "folder", "/proc/x/y", "afile/sub", "c" * 300]
HOSTILE = {
    "--model": ["os:system", "nope:x", "json:dumps", ".", "resnet"],
    "--strategies": ["bogus", "cpu,", "single"],
    "--precision": ["fp32,bf16", "int8", "fp16"],
    "--strategy": ["x", "dp", "single"],
    "--nproc": ["auto", "0", "-2", "99999", "1,2"],
    "--rdzv-endpoint": ["localhost:0", "h:99999", "a:b", "[::1]:5", "host:29500"],
    "--torchrun-arg": ["--bogus", "--nproc-per-node=2", "--help", "-m", "--log-dir=logs"],
    "--backend": ["nccl", "mpi"],
}
# Values that work, so that most lines get past their first check and the next flags are tested.
VALID = {
    "--model": ["mlp", "cnn", "transformer"], "--width": ["8", "64"], "--depth": ["1", "2"],
    "--image-size": ["8", "32"], "--seq": ["8"], "--strategies": ["cpu", "cpu,ddp"],
    "--precision": ["fp32", "bf16"], "--nproc": ["1", "2"], "--batch-size": ["4", "32"],
    "--steps": ["1"], "--warmup": ["0"], "--rounds": ["1"], "--epochs": ["1"],
    "--grad-accum": ["1", "2"], "--interval": ["0.5"], "--nnodes": ["1"], "--node-rank": ["0"],
    "--max-restarts": ["0", "1"], "--rdzv-id": ["job1"], "--run-dir": ["runs/new", "folder"],
    "--strategy": ["auto", "cpu", "ddp", "fsdp"], "--backend": ["gloo"], "--to": ["pt", "dcp"],
    "--torchrun-arg": ["--log-dir=logs"], "--data": ["synthetic", "loader"],
    "path": ["w.pt"], "src": ["w.pt"], "a": ["w.pt"], "b": ["w.pt"], "dst": ["out.pt"],
    "run_dir": ["folder"], "--kills": ["1", "4"], "--seed": ["0", "3"],
    "--atol": ["0", "1e-6"], "--compare-files": ["best.pt", "*.pt"],
}  # fmt: skip


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder with the files the paths refer to; tests run inside it."""
    root = tmp_path_factory.mktemp("sweep")
    (root / "afile").write_text("not a checkpoint")
    (root / "empty.pt").write_bytes(b"")
    (root / "folder").mkdir()
    (root / "train.py").write_text("print('hi')\n")
    torch.save({"w": torch.ones(2)}, root / "w.pt")
    with contextlib.chdir(root):
        yield root


def _values(action: argparse.Action, data: st.DataObject) -> str:
    """Mostly a working value, one time in four a hostile one."""
    name = action.option_strings[-1] if action.option_strings else action.dest
    valid = VALID.get(name, [str(c) for c in action.choices or ()])
    hostile = [*JUNK, *HOSTILE.get(name, [])]
    if action.type is Path or name == "--run-dir":
        hostile += PATHS
    pool = hostile if not valid or data.draw(st.integers(0, 3), label="hostile?") == 0 else valid
    return data.draw(st.sampled_from(pool), label=name)


def _argv(command: tuple[str, ...], data: st.DataObject) -> list[str]:
    """A command line: one hostile value per chosen option, positionals filled in."""
    argv = list(command)
    tail: list[str] = []
    for path, action in OPTIONS:
        if path != command:
            continue
        if not action.option_strings:  # positional
            if action.dest in ("target",):
                tail += ["train.py"]
            elif action.dest == "command":  # serve: none (the servers), or a command
                tail += data.draw(st.sampled_from([[], ["--"], ["true"], ["--", ""], [""]]))
            elif action.dest == "module":
                continue
            else:
                tail.append(_values(action, data))
            continue
        if not data.draw(st.booleans(), label=f"use {action.option_strings[-1]}"):
            continue
        flag = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(flag)
        elif flag == "-m":
            continue
        else:
            argv.append(f"{flag}={_values(action, data)}")
    if command == ("monitor",):
        argv.append("--once")  # without it, monitor watches until interrupted
    return argv + tail


def _run(argv: list[str]) -> tuple[str, str]:
    """("reached" | "exit N", stderr) of ``paratrain ARGV`` in this process."""
    err = io.StringIO()
    patches = [
        mock.patch("paratrain.commands.run.command.supervise", _reach),
        mock.patch("paratrain.commands.demo.command.subprocess.run", _reach),
        mock.patch("paratrain.commands.bench.session.run_plan", _reach),
        mock.patch("paratrain.commands.verify.runner.launch", _reach),
        mock.patch("paratrain.commands.doctor.measure.measure_all", _reach),
        # serve: its command would replace this process and its servers would run until a
        # signal; as the image's user (not root), so that the checks before them are swept
        mock.patch("paratrain.commands.serve.command.os.execvp", _reach),
        mock.patch("paratrain.commands.serve.command._supervise", _reach),
        mock.patch("paratrain.commands.serve.command.os.geteuid", lambda: 1000),
        mock.patch.dict("os.environ", {"HOME": str(Path.cwd())}),
    ]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        try:
            code = main(argv)
        except Reached:
            return "reached", err.getvalue()
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    return f"exit {code}", err.getvalue()


def test_every_subcommand_is_swept() -> None:
    assert {c[0] for c in COMMANDS if c} >= {
        "doctor", "monitor", "demo", "ckpt", "bench", "run", "serve", "verify-resume"
    }  # fmt: skip
    assert ("ckpt", "convert") in COMMANDS


@pytest.mark.parametrize("command", [c for c in COMMANDS if c and c != ("ckpt",)], ids=" ".join)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_hostile_flags_end_cleanly(
    workspace: Path, command: tuple[str, ...], data: st.DataObject
) -> None:
    argv = _argv(command, data)
    outcome, stderr = _run(argv)
    assert "Traceback" not in stderr, (argv, stderr)
    assert outcome in ("reached", "exit 0", "exit 1", "exit 2"), (argv, outcome, stderr)
    if outcome == "exit 2":
        assert "error:" in stderr, (argv, stderr)
