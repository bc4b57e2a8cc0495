"""Run the rules over scripts: read, parse, check, drop ignored lines, sort.

    report = check_paths([Path("train.py"), Path("scripts/")], select={"PT001"})
    report.findings   # sorted by path, line, column
    report.errors     # "scripts/broken.py:3:5: cannot parse: invalid syntax"

A folder stands for every ``*.py`` inside it (recursively, sorted), minus the folders of tools and
environments (:mod:`paratrain.commands.check.walk`: dot-folders, virtual environments, ``build``,
``dist``, ``site-packages``, ..., and what its ``.gitignore`` ignores). A path that does not
exist, or names that give no script at all, are a :class:`~paratrain.errors.ConfigError`: nothing
is checked. A script that cannot be read or
parsed (not UTF-8, a syntax error) is an *error line* instead: the other scripts are still
checked and the command exits 2.

A finding is dropped when its line ends with ``# paratrain: ignore`` (every rule) or
``# paratrain: ignore[PT001, PT006]`` (those rules).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from paratrain.commands.check import (
    rules_apis,
    rules_collectives,
    rules_data,
    rules_devices,
    rules_ranks,
    rules_saving,
    rules_steps,
    rules_sync,
)
from paratrain.commands.check.findings import RULES, Finding, Rule
from paratrain.commands.check.patterns import module_facts
from paratrain.commands.check.walk import Found, Walk
from paratrain.errors import ConfigError

RULE_MODULES = (
    rules_devices, rules_data, rules_saving, rules_ranks, rules_apis, rules_steps, rules_sync,
    rules_collectives,
)  # fmt: skip
IGNORE = re.compile(r"#\s*paratrain:\s*ignore(?:\[(?P<ids>[^\]]*)\])?", re.IGNORECASE)


class ScriptError(ConfigError):
    """A script that cannot be read or parsed, and where."""

    def __init__(self, path: Path, line: int, col: int, problem: str) -> None:
        super().__init__(f"{path}:{line}:{col}: {problem}")
        self.path, self.line, self.col, self.problem = path.as_posix(), line, col, problem


@dataclass(slots=True)
class RuleFailure:
    """A rule that could not check one script."""

    path: str
    rule: str
    problem: str

    def __str__(self) -> str:
        return (
            f"{self.path}:1:1: {self.rule} could not check this script ({self.problem}); the "
            "other rules did. Please report it with the script, or silence it with --ignore "
            f"{self.rule}"
        )


@dataclass(slots=True)
class Report:
    """What a check found."""

    findings: list[Finding] = field(default_factory=list)
    """Every finding not ignored, sorted by path, line and column."""
    errors: list[str] = field(default_factory=list)
    """One line per script that could not be read or parsed."""
    unparsed: list[ScriptError] = field(default_factory=list)
    """The same, with the place and the problem apart."""
    failures: list[RuleFailure] = field(default_factory=list)
    """Rules that failed on a script they were checking (a defect of the rule, not the
    script's: the other rules did check it)."""
    files: int = 0
    """How many scripts were checked (parsed)."""
    named: int = 0
    """How many scripts the paths named (checked, or not parsed: see ``errors``)."""
    skipped: list[str] = field(default_factory=list)
    """Folders not entered, each with why (``venv (a virtual environment)``)."""
    test_modules: int = 0
    """Test modules found in folders, checked with :data:`TEST_MODULE_RULES` only."""


def rules_by_id() -> dict[str, Rule]:
    """Every registered rule, by id, in id order."""
    return {r.id: r for r in sorted(RULES, key=lambda r: r.id)}


def scripts(paths: Sequence[Path], walk: Walk | None = None) -> Found:
    """The files named, and the ``*.py`` files inside the folders named (see
    :mod:`paratrain.commands.check.walk` for what a folder leaves out)."""
    walk = walk or Walk()
    found = Found()
    for path in paths:
        try:
            is_dir, exists = path.is_dir(), path.exists()
        except (OSError, ValueError) as err:
            raise ConfigError(f"paratrain check: cannot look at {str(path)!r} ({err}).") from None
        if not exists:
            raise ConfigError(
                f"paratrain check: {path}: no such file or folder. Pass a .py file or a folder "
                "of them."
            )
        if not is_dir:
            found.scripts.append(path)
            continue
        inside = walk.folder(path)
        found.scripts += inside.scripts
        found.skipped += [f"{path.as_posix().rstrip('/')}/{s}" for s in inside.skipped]
    if not found.scripts:
        named = ", ".join(str(p) for p in paths)
        raise ConfigError(
            f"paratrain check: no .py files in {named}"
            + (f" (not entered: {', '.join(found.skipped)})" if found.skipped else "")
            + ". Pass scripts or folders; --exclude changes what folders leave out."
        )
    return found


def parse(path: Path) -> tuple[ast.Module, list[str]]:
    """The module and its lines; a :class:`ScriptError` saying where, when that fails."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ScriptError(path, 1, 1, f"cannot read: {err.strerror or err}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ScriptError(
            path, 1, 1,
            f"not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}); save the "
            "script as UTF-8",
        ) from None  # fmt: skip
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as err:
        raise ScriptError(
            path, err.lineno or 1, err.offset or 1, f"cannot parse: {err.msg}"
        ) from None
    except (ValueError, RecursionError, MemoryError) as err:
        raise ScriptError(path, 1, 1, f"cannot parse: {err}") from None
    return tree, text.splitlines()


def ignored(finding: Finding, lines: Sequence[str]) -> bool:
    """The finding's line carries ``# paratrain: ignore`` for all rules or for this one."""
    if not 1 <= finding.line <= len(lines):
        return False
    match = IGNORE.search(lines[finding.line - 1])
    if match is None:
        return False
    ids = match.group("ids")
    return ids is None or finding.rule in {i.strip().upper() for i in ids.split(",")}


def check_source(
    tree: ast.Module,
    lines: Sequence[str],
    path: str,
    rules: Collection[Rule],
    siblings: Mapping[str, ast.Module] | None = None,
    failures: list[RuleFailure] | None = None,
) -> list[Finding]:
    """The findings of ``rules`` in one parsed script, ignore comments applied. ``siblings``:
    the other modules of its folder by name, whose functions the rules follow. A rule that
    fails on the script is a :class:`RuleFailure` in ``failures`` (raised when it is None)."""
    others = {name: module_facts(t) for name, t in (siblings or {}).items()}
    module_facts(tree).siblings = others  # last: the most recent entry of the facts' cache
    found: dict[tuple[str, int, int], Finding] = {}
    for r in rules:
        try:
            for finding in r.check(tree, lines):
                if not ignored(finding, lines):
                    found.setdefault((r.id, finding.line, finding.col), replace(finding, path=path))
        except (RecursionError, MemoryError, Exception) as err:  # a defect here, not the script's
            if failures is None:
                raise
            failures.append(RuleFailure(path, r.id, f"{type(err).__name__}: {err}"))
    return list(found.values())


TEST_MODULE_RULES = frozenset({"PT007", "PT008", "PT012", "PT015"})
"""The rules a test module found inside a folder gets: about APIs, not about N ranks running it.
Unit tests build wrappers, samplers and loads in one process on purpose (a DataParallel test, a
DistributedSampler checked without a DataLoader); a test file named on the command line gets
every rule."""


def is_test_module(path: Path) -> bool:
    """pytest's and unittest's file names: ``test_*.py``, ``*_test.py``, ``conftest.py``."""
    name = path.name
    return name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"


def check_paths(
    paths: Sequence[Path], select: Collection[str] | None = None, walk: Walk | None = None
) -> Report:
    """Check every script under ``paths`` with the rules in ``select`` (default: all);
    ``walk``: what folders leave out (default: :class:`Walk` defaults)."""
    assert RULE_MODULES  # importing them registered the rules
    rules = [r for r in rules_by_id().values() if select is None or r.id in select]
    report = Report()
    found = scripts(paths, walk)
    report.skipped = found.skipped
    named = list(dict.fromkeys(found.scripts))  # a script named twice is checked once
    report.named = len(named)
    named_files = {p.resolve() for p in paths if p.is_file()}
    api_only = [r for r in rules if r.id in TEST_MODULE_RULES]
    folders: dict[Path, list[Path]] = {}
    for path in named:
        folders.setdefault(path.parent, []).append(path)
    # One folder at a time (a script's siblings are its folder's modules): the trees and facts
    # of a folder are dropped once its scripts are checked, so memory follows the largest
    # folder, not the whole tree.
    for scripts_here in folders.values():
        parsed: dict[Path, tuple[ast.Module, list[str]]] = {}
        for path in scripts_here:
            try:
                parsed[path] = parse(path)
            except ScriptError as err:
                report.errors.append(str(err))
                report.unparsed.append(err)
        trees = {path.stem: tree for path, (tree, _) in parsed.items()}
        for path, (tree, lines) in parsed.items():
            report.files += 1
            siblings = {k: v for k, v in trees.items() if k != path.stem}
            chosen = rules
            if is_test_module(path) and path.resolve() not in named_files:
                chosen = api_only
                report.test_modules += 1
            report.findings += check_source(
                tree, lines, path.as_posix(), chosen, siblings, report.failures
            )
        module_facts.cache_clear()
    report.findings.sort(key=lambda f: (f.path, f.line, f.col, f.rule))
    return report
