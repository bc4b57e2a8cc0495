"""The porting guides (``docs/tutorials/port-*.md``): every row points to shipped code that does
what the row says.

For each table row, every paratrain call named in its "paratrain" column (``run.x``, ``pt.x``,
``pt.Run(setting=...)``, ``paratrain run``) must appear in at least one example the row links,
and those examples run in CI (``make examples-test``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.examples.support import ROOT

GUIDES = [
    ROOT / "docs" / "tutorials" / "port-ddp-tutorial.md",
    ROOT / "docs" / "tutorials" / "port-accelerate-fabric.md",
]


def _rows() -> list[tuple[str, str, list[Path]]]:
    """(first cell, the "paratrain" cell, linked files) of every row of every table."""
    rows, column = [], -1
    lines = [(guide, line) for guide in GUIDES for line in guide.read_text().splitlines()]
    for guide, line in lines:
        if not line.startswith("|"):
            column = -1
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column < 0:  # a table's header
            column = next(i for i, c in enumerate(cells) if "paratrain" in c)
            continue
        if set(cells[0]) <= {"-"}:
            continue
        links = re.findall(r"\]\(([^)#]+)\)", cells[-1])
        rows.append((cells[0], cells[column], [(guide.parent / ln).resolve() for ln in links]))
    return rows


def _calls(cell: str) -> list[str]:
    """The paratrain names a cell asks for, as regular expressions over example code."""
    code = " ".join(re.findall(r"`([^`]+)`", cell))
    names = [rf"\brun\.{n}\b" for n in re.findall(r"\brun\.(\w+)", code)]
    names += [rf"\bpt\.{n}\b" for n in re.findall(r"\bpt\.(\w+)", code) if n != "Run"]
    settings = re.findall(r"pt\.Run\(((?:\w+=[^,)]*,?\s*)+)\)", code)
    names += [rf"(\b{k}=|[\"']{k}[\"']\s*:)" for group in settings  # k=v, or {"k": v}
              for k in re.findall(r"(\w+)=", group)]  # fmt: skip
    if "paratrain run" in code:
        names.append(r"paratrain run")
    return names


ROWS = _rows()


def test_the_guide_has_both_tables_and_the_readme_links_it() -> None:
    assert len(ROWS) >= 25
    assert "docs/tutorials/port-ddp-tutorial.md" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize(("idiom", "cell", "paths"), ROWS, ids=[r[0][:40] for r in ROWS])
def test_each_row_points_to_code_that_uses_what_it_names(
    idiom: str, cell: str, paths: list[Path]
) -> None:
    assert paths, f"row {idiom!r} links no example"
    for path in paths:
        assert path.is_file() and ROOT in path.parents, f"row {idiom!r}: {path} is not a file"
    code = "\n".join(p.read_text() for p in paths)
    calls = _calls(cell)
    assert calls, f"row {idiom!r} names no paratrain call"
    missing = [c for c in calls if not re.search(c, code)]
    assert not missing, f"row {idiom!r}: {missing} in none of {[p.name for p in paths]}"
