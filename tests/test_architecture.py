"""The layout docs/project/architecture.md describes is the layout of the code.

Its "Layers" table says what each top-level part of ``src/paratrain`` may import; every import
in the package (also those inside functions) must keep to it. Modules do not import each other in
a circle at import time, the library never imports the commands, and the top level stays at 14
parts or fewer.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "paratrain"
PAGE = ROOT / "docs" / "project" / "architecture.md"
LIBRARY = "every library part (not `commands`)"
EVERY = "every part"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    """``paratrain.runtime.run`` -> ``runtime``; ``paratrain`` -> ``__init__``."""
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else "__init__"


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in PACKAGE.rglob("*.py")}


def imported(tree: ast.AST, known: set[str], *, top_level_only: bool = False) -> Iterator[str]:
    """The paratrain modules ``tree`` imports (``from paratrain import x`` names module x when
    it is one). ``top_level_only``: statements run at import time, not inside functions or
    ``if TYPE_CHECKING:``."""
    nodes: list[ast.AST] = []
    if top_level_only:
        assert isinstance(tree, ast.Module)
        for node in tree.body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            nodes.append(node)
            if isinstance(node, (ast.If, ast.Try, ast.With)):
                nodes.extend(ast.walk(node))
    else:
        nodes = list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("paratrain"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not node.module.startswith("paratrain"):
                continue
            subs = [f"{node.module}.{a.name}" for a in node.names]
            found = [m for m in subs if m in known]
            yield from found or [node.module]


def allowed() -> dict[str, set[str]]:
    """The page's table: part -> the parts it may import."""
    text = PAGE.read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| (.+) \|$", section, flags=re.M)
    table = {part: set(re.findall(r"`([^`]+)`", may)) for part, may in rows}
    names = set(table)
    for part, may in rows:
        if may == LIBRARY:
            table[part] = names - {"commands", "__main__", part}
        elif may == EVERY:
            table[part] = names - {part}
    return table


def test_the_page_has_one_row_for_every_top_level_part() -> None:
    parts = {part_of(m) for m in modules()}
    assert set(allowed()) == parts


def test_every_import_keeps_to_the_layers_table() -> None:
    table, trees = allowed(), modules()
    known = set(trees)
    broken = sorted(
        f"{name} imports {target}"
        for name, tree in trees.items()
        for target in imported(tree, known)
        if part_of(target) != part_of(name) and part_of(target) not in table[part_of(name)]
    )
    assert not broken, "imports the Layers table of architecture.md does not allow:\n" + "\n".join(
        broken
    )


def test_no_modules_import_each_other_in_a_circle() -> None:
    trees = modules()
    known = set(trees)
    graph = {
        name: set(imported(tree, known, top_level_only=True)) & known
        for name, tree in trees.items()
    }
    # a package's __init__ importing its own submodules is not a circle; a submodule importing
    # the package it lives in (which imports it) is
    circles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1 and not node.startswith(nxt + "."):
                circles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_checkpoint_is_storage_and_the_library_never_imports_the_commands() -> None:
    trees = modules()
    known = set(trees)
    for name, tree in trees.items():
        targets = {part_of(t) for t in imported(tree, known)}
        if part_of(name) == "checkpoint":
            assert not targets & {"runtime", "data", "strategies", "plans", "commands"}, name
        if part_of(name) not in ("commands", "__main__"):
            assert "commands" not in targets, name


def test_the_top_level_stays_small() -> None:
    visible = [
        p.name
        for p in PACKAGE.iterdir()
        if not p.name.startswith("__") and p.name != "py.typed" and not p.name.endswith(".egg-info")
    ]
    assert len(visible) <= 14, sorted(visible)


@pytest.mark.parametrize("page", [PAGE, ROOT / "mkdocs.yml"], ids=["architecture", "mkdocs"])
def test_the_docs_render_without_network(page: Path) -> None:
    """No mermaid fence (Material loads its renderer from a CDN) and no script from the web."""
    text = page.read_text()
    assert "mermaid" not in text
    assert not re.search(r"extra_javascript:[^\n]*\n(\s+- https?://)", text)
