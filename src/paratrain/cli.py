"""The ``paratrain`` command line: one module per subcommand, errors as one paragraph.

paratrain doctor                  # check this machine (works even when torch is broken)
paratrain run --nproc 2 train.py  # launch through torchrun (Slurm-aware), restarts resume
paratrain demo                    # the embedded default job
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
import sys
from typing import Any

from paratrain.distributed.entrypoint import exit_on_user_error
from paratrain.errors import EnvironmentMismatchError
from paratrain.launcher.arguments import VALUED_OPTIONS, split_target
from paratrain.version import __version__

# Commands whose modules import torch; `doctor` must not depend on them importing.
COMMANDS = {
    "demo": "paratrain.demo.command",
    "ckpt": "paratrain.checkpoint.command",
    "bench": "paratrain.bench.command",
    "run": "paratrain.launcher.command",
    "verify-resume": "paratrain.verify.command",
}


def _unavailable(name: str, err: BaseException) -> Any:
    def handler(args: argparse.Namespace) -> int:
        raise EnvironmentMismatchError(
            f"`paratrain {name}` cannot start: importing its dependencies failed "
            f"({type(err).__name__}: {err}). Run `paratrain doctor` to see what is broken and "
            "how to fix it."
        )

    return handler


LIGHT = ("check", "doctor", "monitor", "serve")
"""Commands that do not import torch: run alone, they start without loading the others."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered (or just ``only``, one of
    :data:`LIGHT`, so that ``paratrain check`` does not pay for importing torch)."""
    from paratrain.check.command import add_parser as add_check
    from paratrain.doctor.command import add_parser as add_doctor
    from paratrain.monitor.command import add_parser as add_monitor
    from paratrain.serve.command import add_parser as add_serve

    parser = argparse.ArgumentParser(
        prog="paratrain",
        description="PyTorch training on one or many GPUs, correct by default.",
    )
    parser.add_argument("--version", action="version", version=f"paratrain {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    light = {"doctor": add_doctor, "monitor": add_monitor, "serve": add_serve, "check": add_check}
    for name, add in light.items():
        if only is None or name == only:
            add(subparsers)
    if only in light:
        return parser
    for name, module in COMMANDS.items():
        try:
            importlib.import_module(module).add_parser(subparsers)
        except Exception as err:  # a broken torch install: say so when the command is used
            stub = subparsers.add_parser(name, help=f"(unavailable: {type(err).__name__})")
            stub.add_argument("args", nargs=argparse.REMAINDER)
            stub.set_defaults(handler=_unavailable(name, err))
    return parser


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
    parser = build_parser(argv[0] if argv and argv[0] in LIGHT else None)
    args = parse(parser, argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    code: int = exit_on_user_error(lambda: handler(args))
    return code


if __name__ == "__main__":
    sys.exit(main())
