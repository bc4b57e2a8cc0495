"""The ``paratrain`` command line: one module per subcommand, errors as one paragraph.

paratrain demo                  # the embedded default job
paratrain --version
"""

from __future__ import annotations

import argparse
import sys

from paratrain.entrypoint import exit_on_user_error
from paratrain.version import __version__


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    from paratrain.bench.command import add_parser as add_bench
    from paratrain.checkpoint.command import add_parser as add_ckpt
    from paratrain.demo.command import add_parser as add_demo

    parser = argparse.ArgumentParser(
        prog="paratrain",
        description="PyTorch training on one or many GPUs, correct by default.",
    )
    parser.add_argument("--version", action="version", version=f"paratrain {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    add_demo(subparsers)
    add_ckpt(subparsers)
    add_bench(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; return its exit code."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    code: int = exit_on_user_error(lambda: handler(args))
    return code


if __name__ == "__main__":
    sys.exit(main())
