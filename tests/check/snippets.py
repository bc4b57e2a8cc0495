"""Run one rule over a snippet: the lines it flags."""

from __future__ import annotations

import ast
import textwrap

from paratrain.commands.check.engine import check_source, rules_by_id


def flagged(source: str, rule_id: str) -> list[int]:
    """The lines where ``rule_id`` finds something in ``source`` (dedented)."""
    text = textwrap.dedent(source)
    rules = [rules_by_id()[rule_id]]
    return sorted(f.line for f in check_source(ast.parse(text), text.splitlines(), "t.py", rules))
