"""The command line as a new user meets it: fast help, every flag explained, quiet pipes.

``paratrain --help`` and every ``paratrain COMMAND --help`` must not import torch (its import
alone takes seconds on a loaded machine); ``benchmarks/cli_start.py`` measures the time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from paratrain.commands.cli import COMMANDS, _parsers, build_parser, plain

HELP_WITHOUT_TORCH = """
import sys
from paratrain.commands.cli import main
try:
    main({argv!r})
except SystemExit as end:
    assert end.code == 0, end.code
assert "torch" not in sys.modules, "torch was imported"
"""


@pytest.mark.parametrize("argv", [["--help"], ["--version"]] + [[c, "--help"] for c in COMMANDS])
def test_help_never_imports_torch(argv: list[str]) -> None:
    code = HELP_WITHOUT_TORCH.format(argv=argv)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage: paratrain" in done.stdout or "paratrain 0" in done.stdout


def test_commands_are_listed_in_the_order_users_need_them() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "paratrain", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    names = [line.split()[0] for line in shown.split("commands:")[1].splitlines()[2:] if line]
    assert [n for n in names if n in COMMANDS][:4] == ["run", "demo", "doctor", "check"]


def test_every_flag_has_help_and_no_docstring_markup() -> None:
    for parser in _parsers(build_parser()):
        assert not parser.description or "``" not in parser.description, parser.prog
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            name = f"{parser.prog} {action.option_strings or action.dest}"
            assert action.help and action.help != argparse.SUPPRESS, f"{name} has no help"
            assert "``" not in action.help and ":class:" not in action.help, name


def test_a_command_summary_is_the_same_in_every_view() -> None:
    full = build_parser()
    quick = build_parser(summaries=True)
    for parser in (full, quick):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        assert {c.dest: c.help for c in sub._choices_actions} == {
            name: summary for name, (_, summary) in COMMANDS.items()
        }


def test_docstring_markup_becomes_plain_text() -> None:
    assert (
        plain("see :class:`~paratrain.Run` and ``run.save()``")
        == "see paratrain.Run and `run.save()`"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--json", "CORPUS"],
        ["check", "CORPUS"],
        ["doctor", "--quick", "--json"],
        ["monitor", "--json"],
    ],
    ids=" ".join,
)
def test_a_closed_pipe_ends_quietly(argv: list[str]) -> None:
    corpus = str(Path(__file__).parent / "check" / "corpus" / "planted")
    command = [sys.executable, "-m", "paratrain", *(corpus if a == "CORPUS" else a for a in argv)]
    writer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert writer.stdout is not None and writer.stderr is not None
    writer.stdout.close()  # what `| head -c 0` does: the reader is gone before the first write
    err = writer.stderr.read().decode()
    writer.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
