"""Which scripts a folder stands for: every ``*.py`` below it, minus what a project does not own.

    found = Walk(exclude=None, extend_exclude=["legacy/*"]).folder(Path("."))
    found.scripts   # sorted
    found.skipped   # ["venv (a virtual environment)", "build (default exclude)", ...]

As ruff does, folders of tools and environments are not entered: the names in
:data:`DEFAULT_EXCLUDE`, any folder holding a ``pyvenv.cfg`` (a virtual environment, whatever its
name), folders whose name starts with a dot, and what the ``.gitignore`` of a folder named on the
command line ignores (patterns without ``!``; a pattern with a ``/`` is taken from that folder, one
without matches a name at any depth, a trailing ``/`` matches folders only). ``--exclude``
replaces the default names, ``--extend-exclude`` adds to them; both take globs matched against a
name or a path relative to the folder named. A file named on the command line is always checked.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_EXCLUDE = (
    "venv", "env", "site-packages", "dist-packages", "build", "dist", "node_modules",
    "__pypackages__", "_build", "buck-out", "*.egg-info",
)  # fmt: skip
"""Folder names not entered unless ``--exclude`` replaces them (dot-folders never are)."""


@dataclass
class Found:
    """The scripts under the paths named, and the folders left out (with why)."""

    scripts: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass
class Walk:
    """The exclusion settings of one ``paratrain check``."""

    exclude: Sequence[str] | None = None
    """Globs replacing :data:`DEFAULT_EXCLUDE` (None: the defaults)."""
    extend_exclude: Sequence[str] = ()
    """Globs added to them."""

    @property
    def patterns(self) -> list[str]:
        base = DEFAULT_EXCLUDE if self.exclude is None else tuple(self.exclude)
        return [p.strip() for p in (*base, *self.extend_exclude) if p.strip()]

    def folder(self, root: Path) -> Found:
        """Every ``*.py`` under ``root`` that is not excluded, sorted."""
        found = Found()
        ignored = _gitignore(root)
        patterns = self.patterns
        for current, dirs, files in os.walk(root):
            here = Path(current)
            keep = []
            for name in sorted(dirs):
                rel = (here / name).relative_to(root).as_posix()
                why = _why_skipped(here / name, name, rel, patterns, ignored)
                if why is None:
                    keep.append(name)
                elif why != "hidden":
                    found.skipped.append(f"{rel} ({why})")
            dirs[:] = keep
            for name in files:
                rel = (here / name).relative_to(root).as_posix()
                left_out = _matches(name, rel, patterns, False) or _ignored(
                    name, rel, ignored, False
                )
                if name.endswith(".py") and not left_out:
                    path = here / name
                    if path.is_file():
                        found.scripts.append(path)
        found.scripts.sort()
        return found


def _why_skipped(
    path: Path, name: str, rel: str, patterns: list[str], ignored: list[str]
) -> str | None:
    if name.startswith("."):
        return "hidden"
    if (path / "pyvenv.cfg").is_file():
        return "a virtual environment"
    if _matches(name, rel, patterns, True):
        # A default name that is a Python package is code (mmengine's `dist/`), not a build.
        default = name in DEFAULT_EXCLUDE and patterns[: len(DEFAULT_EXCLUDE)] == list(
            DEFAULT_EXCLUDE
        )
        if not (default and (path / "__init__.py").is_file()):
            return "excluded"
    if _ignored(name, rel, ignored, True):
        return ".gitignore"
    return None


def _matches(name: str, rel: str, patterns: list[str], is_dir: bool) -> bool:
    return any(_match(name, rel, pattern, is_dir) for pattern in patterns)


def _match(name: str, rel: str, pattern: str, is_dir: bool) -> bool:
    """git's rules: a pattern with a ``/`` (but not only at its end) is anchored at the folder
    named, and its ``*`` stays within one path part (``**`` crosses them); one without is
    matched against the name at any depth; ``dir/`` matches folders only."""
    core = pattern.rstrip("/")
    if pattern.endswith("/") and not is_dir:
        return False  # `logs/` leaves out folders only
    if "/" in core:
        return _glob(core.lstrip("/")).fullmatch(rel) is not None
    return fnmatch.fnmatchcase(name, core)


@functools.lru_cache(maxsize=512)
def _glob(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"(\*\*/?|\*|\?)", pattern)
    out = []
    for part in parts:
        if part in ("**", "**/"):
            out.append(".*")
        elif part == "*":
            out.append("[^/]*")
        elif part == "?":
            out.append("[^/]")
        else:
            out.append(re.escape(part))
    return re.compile("".join(out))


def _ignored(name: str, rel: str, patterns: list[str], is_dir: bool) -> bool:
    """Left out by ``.gitignore``: the last pattern that matches decides (``!`` ones bring a
    path back, ``!litgpt/data`` after ``data``)."""
    verdict = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        if _match(name, rel, pattern[1:] if negated else pattern, is_dir):
            verdict = not negated
    return verdict


def _gitignore(root: Path) -> list[str]:
    """The patterns of ``root/.gitignore``, in order (``!`` ones included)."""
    try:
        text = (root / ".gitignore").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]
