"""``paratrain check --fix`` / ``--diff``: rewrite the mechanical findings, nothing else.

    edits = edits_for(tree, text, findings)    # what --fix would change in one script
    fixed = apply(text, edits)                 # the new text (overlapping edits are skipped)
    print(unified(path, text, fixed))          # what --diff prints

Only rewrites that keep the script's meaning except for the mistake are offered:

- PT002 ``x.to(device)`` as a statement → ``x = x.to(device)``;
- PT004 ``DataLoader(..., shuffle=True, sampler=s)`` → ``shuffle=s is None`` (the sampler orders
  the batches; a ``sampler=None`` in one process keeps its shuffle);
- PT008 ``torch.load(path)`` → ``torch.load(path, weights_only=True)`` (torch's default since 2.6);
- PT012 ``torch.cuda.amp.autocast(k=v)`` → ``torch.autocast("cuda", k=v)`` and
  ``torch.cuda.amp.GradScaler(k=v)`` → ``torch.amp.GradScaler("cuda", k=v)``, written exactly so
  and with keyword arguments only (positional ones mean different things in the new calls).

Everything else needs a decision (where a rank guard goes, which device a load maps to) and is
left to the reader. PT006 is among them: saving ``model.module.state_dict()`` instead of the
wrapper's is right, but the script's own resume then loads plain keys into the wrapper and fails
(or, with ``strict=False``, silently resumes nothing); the save and the load must change together.
"""

from __future__ import annotations

import ast
import difflib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from paratrain.commands.check.findings import Finding

FIXABLE = frozenset({"PT002", "PT004", "PT008", "PT012"})
"""Rules whose findings ``--fix`` can rewrite (when the code is written in the usual way)."""
_NEW_AMP = {
    "torch.cuda.amp.autocast": "torch.autocast",
    "torch.cuda.amp.GradScaler": "torch.amp.GradScaler",
}


@dataclass(frozen=True, slots=True)
class Edit:
    """Replace the text between two character offsets of the script."""

    start: int
    end: int
    text: str


class _Offsets:
    """Character offsets of ``ast`` positions (1-based lines, UTF-8 byte columns)."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def at(self, line: int, byte_col: int) -> int:
        chars = len(self.lines[line - 1].encode("utf-8")[:byte_col].decode("utf-8", "replace"))
        return self.starts[line - 1] + chars

    def start(self, node: ast.AST) -> int:
        return self.at(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.at(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]


def edits_for(tree: ast.Module, text: str, findings: Iterable[Finding]) -> list[Edit]:
    """The edits that fix ``findings`` of one script (those it knows how to fix)."""
    return [edit for _, edit in _fixes(tree, text, findings)]


def _fixes(tree: ast.Module, text: str, findings: Iterable[Finding]) -> list[tuple[Finding, Edit]]:
    where = _Offsets(text)
    nodes: dict[tuple[int, int], list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expr, ast.Call)):
            nodes.setdefault((node.lineno, node.col_offset + 1), []).append(node)
    fixes: list[tuple[Finding, Edit]] = []
    for finding in findings:
        if finding.rule not in FIXABLE:
            continue
        for node in nodes.get((finding.line, finding.col), []):
            edit = _edit(finding.rule, node, text, where)
            if edit is not None:
                fixes.append((finding, edit))
                break
    return fixes


@dataclass(frozen=True, slots=True)
class Planned:
    """What ``--fix`` would do to one script."""

    path: str
    old: str
    new: str
    fixed: frozenset[tuple[str, str, int, int]]
    """(path, rule, line, col) of the findings it rewrites."""


def plan(findings: Sequence[Finding]) -> list[Planned]:
    """The rewrite of every script with fixable findings (read again from disk)."""
    by_path: dict[str, list[Finding]] = {}
    for f in findings:
        if f.rule in FIXABLE:
            by_path.setdefault(f.path, []).append(f)
    planned: list[Planned] = []
    for path, found in by_path.items():
        try:
            old = Path(path).read_bytes().decode("utf-8")
            tree = ast.parse(old.removeprefix("\ufeff"))
        except (OSError, ValueError, SyntaxError):
            continue  # changed since it was checked: leave it
        bom = "\ufeff" if old.startswith("\ufeff") else ""
        body = old.removeprefix(bom)
        fixes = _fixes(tree, body, found)
        fixed = {(f.path, f.rule, f.line, f.col) for f, _ in fixes}
        new = bom + apply(body, [edit for _, edit in fixes])
        if new != old:
            planned.append(Planned(path, old, new, frozenset(fixed)))
    return planned


def write(planned: Planned) -> None:
    """Replace the script with its rewrite (atomically, keeping its permissions)."""
    path = Path(planned.path)
    tmp = path.with_name(f".{path.name}.paratrain-fix")
    tmp.write_text(planned.new, encoding="utf-8", newline="")
    os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)


def _edit(rule: str, node: ast.AST, text: str, where: _Offsets) -> Edit | None:
    if rule == "PT002" and isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        func = node.value.func
        if isinstance(func, ast.Attribute):
            start = where.start(node)
            return Edit(start, start, f"{ast.unparse(func.value)} = ")
    if not isinstance(node, ast.Call):
        return None
    if rule == "PT004":
        return _shuffle_unless_sampled(node, where)
    if rule == "PT008":
        return _add_keyword(node, "weights_only=True", text, where)
    if rule == "PT012" and not node.args:
        name = text[where.start(node.func) : where.end(node.func)]
        paren = where.end(node.func)
        if name in _NEW_AMP and text[paren : paren + 1] == "(":
            first = '"cuda", ' if node.keywords else '"cuda"'
            return Edit(where.start(node.func), paren + 1, f"{_NEW_AMP[name]}({first}")
    return None


def _shuffle_unless_sampled(call: ast.Call, where: _Offsets) -> Edit | None:
    """``shuffle=True, sampler=s`` -> ``shuffle=s is None, sampler=s``: the sampler orders the
    batches when there is one, and a script that passes ``sampler=None`` in one process keeps
    its shuffle there (dropping ``shuffle=True`` would stop it). Only for both keywords written
    in the call, the sampler a plain name."""
    given = {k.arg: k for k in call.keywords}
    shuffle, sampler = given.get("shuffle"), given.get("sampler")
    if shuffle is None or sampler is None:
        return None
    if not isinstance(sampler.value, (ast.Name, ast.Attribute)):
        return None
    value = shuffle.value
    return Edit(where.start(value), where.end(value), f"{ast.unparse(sampler.value)} is None")


def _add_keyword(call: ast.Call, keyword: str, text: str, where: _Offsets) -> Edit | None:
    close = where.end(call) - 1
    if text[close] != ")":
        return None
    before = text[where.start(call) : close].rstrip()
    has_args = bool(call.args or call.keywords)
    if not has_args:
        return Edit(close, close, keyword)
    return Edit(close, close, f" {keyword}" if before.endswith(",") else f", {keyword}")


def apply(text: str, edits: Sequence[Edit]) -> str:
    """``text`` with ``edits`` made; an edit that overlaps an earlier one is skipped."""
    out: list[str] = []
    at = 0
    for edit in sorted(edits, key=lambda e: (e.start, e.end)):
        if edit.start < at:
            continue
        out += [text[at : edit.start], edit.text]
        at = edit.end
    out.append(text[at:])
    return "".join(out)


def unified(path: str, old: str, new: str) -> str:
    """A unified diff of one script (empty when nothing changed)."""
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), path, path
        )
    )
