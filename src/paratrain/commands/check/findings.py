"""What a check reports (``Finding``) and the registry of rules that produce findings.

    @rule("PT001", "rank-as-device", "the global rank is used as a CUDA device index")
    def rank_as_device(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
        yield Finding.at("PT001", node, message="...", fix="...", api="pt.Run()")

A rule is a plain function over one parsed module; it leaves ``path`` empty and the engine
fills it in. ``RULES`` keeps the registration order, which is the order of the rule ids.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

RuleFunction = Callable[[ast.Module, Sequence[str]], Iterator["Finding"]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One mistake at one place of one script."""

    rule: str
    """The rule id, e.g. ``"PT001"``."""
    path: str
    """The script as it was named on the command line (or found in a named folder)."""
    line: int
    """1-based line of the offending expression."""
    col: int
    """1-based column of the offending expression."""
    message: str
    """What goes wrong at run time."""
    fix: str
    """What to write instead."""
    api: str | None = None
    """The paratrain call that does it for you, when there is one."""

    @classmethod
    def at(
        cls, rule_id: str, node: ast.AST, *, message: str, fix: str, api: str | None = None
    ) -> Finding:
        """A finding at ``node``'s position; the engine sets the path."""
        line = getattr(node, "lineno", 1)
        col = getattr(node, "col_offset", 0) + 1
        return cls(rule=rule_id, path="", line=line, col=col, message=message, fix=fix, api=api)


@dataclass(frozen=True, slots=True)
class Rule:
    """A registered rule: its id, a short kebab-case name and a one-line summary."""

    id: str
    name: str
    summary: str
    check: RuleFunction


RULES: list[Rule] = []


def rule(rule_id: str, name: str, summary: str) -> Callable[[RuleFunction], RuleFunction]:
    """Register the decorated function as rule ``rule_id``."""

    def register(check: RuleFunction) -> RuleFunction:
        assert all(r.id != rule_id for r in RULES), f"rule {rule_id} registered twice"
        RULES.append(Rule(rule_id, name, summary, check))
        return check

    return register
