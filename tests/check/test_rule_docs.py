"""Every rule has a page in docs/rules/ whose bad snippet trips it and whose good snippet is clean.

pytest tests/check/test_rule_docs.py -q
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from paratrain.commands.check.engine import check_source, rules_by_id

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules"
SECTIONS = ["What goes wrong", "Bad", "Good", "With paratrain", "Silence it"]
RULES = list(rules_by_id())


def snippet(page: str, section: str) -> str:
    """The first python block under ``## section``."""
    body = page.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", body, re.DOTALL)
    assert match, f"no python block under ## {section}"
    return match.group(1)


def found(code: str) -> set[str]:
    tree = ast.parse(code)
    return {f.rule for f in check_source(tree, code.splitlines(), "x.py", rules_by_id().values())}


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_page_has_its_sections_and_its_snippets_hold(rule: str) -> None:
    page = (DOCS / f"{rule}.md").read_text(encoding="utf-8")
    name = rules_by_id()[rule].name
    assert page.startswith(f"# {rule} {name}\n"), page.splitlines()[0]
    headings = re.findall(r"^## (.+)$", page, re.MULTILINE)
    assert headings == SECTIONS
    assert rule in found(snippet(page, "Bad"))
    assert found(snippet(page, "Good")) == set()


def test_the_index_lists_every_rule_and_no_other() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    listed = re.findall(r"\[(PT\d{3})\]\(PT\d{3}\.md\)", index)
    assert listed == RULES
    assert sorted(p.stem for p in DOCS.glob("PT*.md")) == RULES
