"""The ``paratrain`` command line: one module per subcommand, errors as one paragraph.

paratrain run --nproc 2 train.py  # launch through torchrun (Slurm-aware), restarts resume
paratrain demo                    # the embedded default job
paratrain doctor                  # check this machine (works even when torch is broken)
paratrain ckpt inspect PATH       # understand, verify, convert, diff checkpoints
paratrain bench                   # throughput / memory / scaling vs a hand-written loop
paratrain monitor RUN_DIR         # live per-GPU and per-rank view of a running job
paratrain serve                   # the container's entrypoint: Jupyter (token) and SSH (keys)
paratrain check PATH...           # find multi-GPU mistakes in training scripts (never runs them)
paratrain verify-resume train.py  # prove a script restart-safe: kill it, resume, compare states
paratrain --version
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from typing import Any

from paratrain.commands.run.arguments import VALUED_OPTIONS, split_target
from paratrain.core.version import __version__
from paratrain.distributed.entrypoint import exit_on_user_error
from paratrain.errors import EnvironmentMismatchError

COMMANDS: dict[str, tuple[str, str]] = {
    "run": (
        "paratrain.commands.run.command",
        "launch a training script on N ranks (torchrun, Slurm)",
    ),
    "demo": (
        "paratrain.commands.demo.command",
        "train the embedded demo job on N ranks, resume it, report",
    ),
    "doctor": (
        "paratrain.commands.doctor.command",
        "check this machine and say how to fix problems",
    ),
    "check": (
        "paratrain.commands.check.command",
        "find multi-GPU mistakes in training scripts (static)",
    ),
    "verify-resume": (
        "paratrain.commands.verify.command",
        "prove a script restart-safe: kill it, compare",
    ),
    "plan": (
        "paratrain.commands.plan.command",
        "peak memory per rank under each strategy, before launch",
    ),
    "ckpt": (
        "paratrain.commands.ckpt.command",
        "inspect, verify, convert, reshard and diff checkpoints",
    ),
    "monitor": (
        "paratrain.commands.monitor.command",
        "live per-GPU and per-rank view of a running job",
    ),
    "bench": (
        "paratrain.commands.bench.command",
        "throughput, memory and scaling vs hand-written torch",
    ),
    "serve": (
        "paratrain.commands.serve.command",
        "the container entrypoint: Jupyter and SSH, or a command",
    ),
}
"""Every subcommand, in the order a new user needs them: its module (whose ``add_parser``
registers it without importing torch) and its one-line summary for ``paratrain --help``."""


def _unavailable(name: str, err: BaseException) -> Any:
    def handler(args: argparse.Namespace) -> int:
        raise EnvironmentMismatchError(
            f"`paratrain {name}` cannot start: importing its dependencies failed "
            f"({type(err).__name__}: {err}). Run `paratrain doctor` to see what is broken and "
            "how to fix it."
        )

    return handler


def build_parser(only: str | None = None, *, summaries: bool = False) -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered in full; with ``only``, that one in
    full and the others by their summary; with ``summaries``, all by their summary (what
    ``paratrain --help`` shows, without importing any command)."""
    parser = argparse.ArgumentParser(
        prog="paratrain",
        description="PyTorch training on one or many GPUs, correct by default.",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=32),
        epilog="Run `paratrain COMMAND --help` for a command's flags.",
    )
    parser.add_argument("--version", action="version", version=f"paratrain {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, (module, summary) in COMMANDS.items():
        if summaries or (only is not None and name != only):
            subparsers.add_parser(name, help=summary, add_help=False)
            continue
        try:
            importlib.import_module(module).add_parser(subparsers)
        except Exception as err:  # a broken torch install: say so when the command is used
            stub = subparsers.add_parser(name, help=f"(unavailable: {type(err).__name__})")
            stub.add_argument("args", nargs=argparse.REMAINDER)
            stub.set_defaults(handler=_unavailable(name, err))
    for choice in subparsers._choices_actions:  # one summary per command, wherever it is shown
        if not str(choice.help).startswith("(unavailable"):
            choice.help = COMMANDS[choice.dest][1]
    for action in _actions(parser):
        action.help = plain(action.help) if isinstance(action.help, str) else action.help
    for sub in _parsers(parser):
        sub.description = plain(sub.description) if sub.description else sub.description
    return parser


def plain(text: str) -> str:
    """Docstring markup as plain terminal text: ````x```` and ``:class:`x``` become ``x``."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "`")


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    found: list[argparse.Action] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _actions(sub)
        else:
            found.append(action)
    return found


def _refuse_empty_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """argparse of Python < 3.12 turns ``--flag=--`` into an empty list instead of an error."""
    for action in _actions(parser):
        value = getattr(args, action.dest, None)
        plain = type(action) is argparse._StoreAction and action.nargs is None and value == []
        appended = type(action) is argparse._AppendAction and action.nargs is None
        if plain or (appended and isinstance(value, list) and [] in value):
            flag = action.option_strings[-1] if action.option_strings else action.dest
            parser.error(f"argument {flag}: '--' is not a value; give one")


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed; for ``run`` and ``verify-resume``, what follows the script path (or
    ``-m module``) is the script's, as it is: ``args.target`` (:mod:`.launcher.arguments`)."""
    if not argv or argv[0] not in VALUED_OPTIONS:
        args = parser.parse_args(argv)
    else:
        own, target = split_target(argv[1:], VALUED_OPTIONS[argv[0]])
        args = parser.parse_args([argv[0], *own])
        args.target, args.module = target, None
    _refuse_empty_values(parser, args)
    return args


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; return its exit code."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, inside the try, not at exit
    except BrokenPipeError:  # `paratrain check --json | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return PIPE_CLOSED
    return code


PIPE_CLOSED = 128 + 13
"""The exit code when the reader of stdout went away (128 + SIGPIPE, as a shell reports it)."""


def _main(argv: list[str]) -> int:
    command = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(command, summaries=command is None)
    args = parse(parser, argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    code: int = exit_on_user_error(lambda: handler(args))
    return code


if __name__ == "__main__":
    sys.exit(main())
