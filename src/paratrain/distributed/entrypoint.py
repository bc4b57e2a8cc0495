"""Turn user errors into one-paragraph messages and exit code 2 at every process entry point
(a :class:`~paratrain.errors.JobFailedError` exits with the failed rank's own code).

    def main() -> None:
        exit_on_user_error(lambda: train(parse_args()))

A :class:`~paratrain.errors.ParatrainError` prints ``paratrain: error: <message>`` on stderr, with
the rank in front when the process is one of several; bugs keep their traceback.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable
from typing import NoReturn, TypeVar

from paratrain.errors import JobFailedError, ParatrainError

T = TypeVar("T")

USER_ERROR_EXIT = 2


def report(err: ParatrainError) -> NoReturn:
    """Print ``err`` as a wrapped paragraph and exit with code 2 (a failed job: its rank's code)."""
    rank = os.environ.get("RANK")
    who = (
        f"paratrain (rank {rank})"
        if rank is not None and os.environ.get("WORLD_SIZE")
        else ("paratrain")
    )
    text = textwrap.fill(f"{who}: error: {err}", width=100, break_on_hyphens=False)
    print(text, file=sys.stderr, flush=True)
    raise SystemExit(err.exit_code if isinstance(err, JobFailedError) else USER_ERROR_EXIT)


def exit_on_user_error(fn: Callable[[], T]) -> T:
    """Run ``fn``; a ParatrainError becomes a message and exit code 2."""
    try:
        return fn()
    except ParatrainError as err:
        report(err)
