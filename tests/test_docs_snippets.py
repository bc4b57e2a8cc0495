"""Every ```python block of the documentation (docs/**/*.md) and of README.md compiles.

A block may be a fragment (names it does not define, ``...`` for the rest of a loop), but it must
be Python: a reader copies it. A line ``--8<-- "path"`` in a block is the file it includes
(docs/hooks/repo_files.py), so the file is compiled in its place. Where a block cannot be Python
on purpose, a ``<!-- no-compile -->`` line right before its fence says so.

    pytest tests/test_docs_snippets.py -q
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,})python[^\n]*\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
INCLUDE = re.compile(r'^[ \t]*--8<-- "([^"]+)"[ \t]*$', re.MULTILINE)
SKIP = "<!-- no-compile -->"


def _blocks() -> list[tuple[str, str]]:
    """(``page:line``, source) of every python block that is meant to compile."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            before = text[: match.start()].rstrip().splitlines()
            if before and before[-1].strip() == SKIP:
                continue
            body = textwrap.dedent(match.group("body"))
            body = INCLUDE.sub(lambda m: (ROOT / m.group(1)).read_text(encoding="utf-8"), body)
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", body))
    return found


BLOCKS = _blocks()


def test_the_docs_have_python_blocks() -> None:
    assert len(BLOCKS) >= 50, [name for name, _ in BLOCKS]


@pytest.mark.parametrize(("name", "source"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_each_python_block_compiles(name: str, source: str) -> None:
    try:
        compile(source, name, "exec")
    except SyntaxError as err:
        where = f"{name} (line {err.lineno} of the block)"
        pytest.fail(f"{where}: {err.msg}\n{err.text or ''}Fix the block, or mark it {SKIP}.")
