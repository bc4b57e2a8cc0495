"""The console that commands print their tables on: as wide as the terminal, and in a pipe or a
log (no terminal to measure) as wide as ``COLUMNS`` or :data:`LOG_WIDTH`, never rich's 80.

    from paratrain.commands.tables import table_console

    table_console().print(table)       # `paratrain doctor | cat` keeps each row on one line
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

LOG_WIDTH = 160
"""Columns of a table in a log or a pipe: wide enough that a row of any command's table (a
verify-resume first difference, a doctor fix, a monitor rank row) stays on one line."""


def width() -> int | None:
    """The terminal's width (None: rich measures it), else ``COLUMNS`` (at least 80) or
    :data:`LOG_WIDTH`."""
    if sys.stdout.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    return max(int(columns), 80) if columns.isdigit() else LOG_WIDTH


def table_console() -> Console:
    """A rich console for a command's tables on stdout (see the module docstring)."""
    from rich.console import Console

    return Console(width=width())
