"""Pages that include files of the repository root, and links from pages to the repository.

Registered under ``hooks:`` in mkdocs.yml.

- A line ``--8<-- "CHANGELOG.md"`` (the snippet syntax of ``pymdownx.snippets``) is replaced by
  that file of the repository (a path from its root). A Markdown file's links were written for
  its own folder, so they are re-pointed for the page: ``docs/project/testing.md`` becomes the
  page's relative link to that page, and a Markdown file that a page includes becomes a link to
  that page. Any other file (``examples/slurm.sbatch`` inside a code block) is inserted as it is.
- A link that leaves ``docs/`` for a file of the repository (``../../examples/train.py``) stays
  as written in the Markdown, where it works on GitHub, in an editor, and for the tests that
  follow it. On the site it goes to a page generated under ``_repo/`` that shows the file: code
  in a code block, a notebook cell by cell, a README as a page, a folder as a list of its files.
  The links of a generated page are followed the same way.

A link that resolves to nothing is left alone, so ``mkdocs build --strict`` reports it.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PREFIX = "_repo"
INCLUDE = re.compile(r'^--8<-- "([^"]+)"[ \t]*$', re.MULTILINE)
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
CODE_SPAN = re.compile(r"(`+)(?:.*?)\1")
LANGUAGES = {
    ".py": "python",
    ".sh": "bash",
    ".sbatch": "bash",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".toml": "toml",
    ".json": "json",
    ".cfg": "ini",
    ".txt": "text",
}
NAMES = {"Dockerfile": "dockerfile", "Makefile": "makefile"}

_included: dict[str, str] = {}  # root file -> the page that includes it
_generated: dict[str, str] = {}  # generated page -> its file or folder, relative to ROOT


def on_files(files: Files, config: Any) -> Files:
    """Add a page for every repository file or folder that a page (or such a page) links to."""
    _included.clear()
    _generated.clear()
    pending: list[tuple[str, Path]] = []  # (markdown, the folder its links are relative to)
    for file in files.documentation_pages():
        text = Path(file.abs_src_path).read_text(encoding="utf-8")
        pending.append((text, (DOCS / file.src_uri).parent))
        for name in INCLUDE.findall(text):
            if name.endswith(".md"):  # a page's text; other files are code shown as they are
                _included[name] = file.src_uri
                pending.append(((ROOT / name).read_text(encoding="utf-8"), (ROOT / name).parent))
    while pending:
        text, origin = pending.pop()
        for target in _targets(text):
            path = _repo_path(origin, target)
            if path is None or path in _included or _page_uri(path) in _generated:
                continue  # a folder and its README.md are one page
            uri = _page_uri(path)
            _generated[uri] = path
            content, links_from = _render(path)
            files.append(
                File.generated(config, uri, content=content, inclusion=InclusionLevel.NOT_IN_NAV)
            )
            if links_from is not None:
                pending.append((content, links_from))
    return files


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Expand root-file includes; point links that leave ``docs/`` at the generated pages."""
    uri = page.file.src_uri
    if uri in _generated:
        origin = (ROOT / _generated[uri]).parent
        if (ROOT / _generated[uri]).is_dir():
            origin = ROOT / _generated[uri]
        return _relink(markdown, origin, uri)

    def include(match: re.Match[str]) -> str:
        path = ROOT / match.group(1)
        text = path.read_text(encoding="utf-8").rstrip("\n")
        return _relink(text, path.parent, uri) if path.suffix == ".md" else text

    markdown = INCLUDE.sub(include, markdown)
    return _relink(markdown, (DOCS / uri).parent, uri)


def _outside_code(text: str) -> list[tuple[bool, str]]:
    """``text`` cut into (is prose, piece): fenced blocks and code spans are not prose."""
    pieces: list[tuple[bool, str]] = []
    fence = ""
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if fence:
            pieces.append((False, line))
            if marker and marker.group(1)[0] == fence[0] and len(marker.group(1)) >= len(fence):
                fence = ""
            continue
        if marker:
            fence = marker.group(1)
            pieces.append((False, line))
            continue
        start = 0
        for span in CODE_SPAN.finditer(line):
            pieces += [(True, line[start : span.start()]), (False, span.group(0))]
            start = span.end()
        pieces.append((True, line[start:]))
    return pieces


def _targets(text: str) -> list[str]:
    return [
        m.group(2) for prose, piece in _outside_code(text) if prose for m in LINK.finditer(piece)
    ]


def _split(target: str) -> tuple[str, str] | None:
    """(path, #anchor) of a relative link; None for URLs, anchors and absolute paths."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    path, _, anchor = target.partition("#")
    return path, f"#{anchor}" if anchor else ""


def _repo_path(origin: Path, target: str) -> str | None:
    """The repository path a link reaches outside ``docs/``, if it exists; else None."""
    parts = _split(target)
    if parts is None or not parts[0]:
        return None
    resolved = Path(os.path.normpath(origin / parts[0]))
    if not resolved.exists() or ROOT not in resolved.parents:
        return None
    if resolved == DOCS or DOCS in resolved.parents:
        return None
    return resolved.relative_to(ROOT).as_posix()


def _page_uri(path: str) -> str:
    if (ROOT / path).is_dir():
        readme = ROOT / path / "README.md"
        return f"{PREFIX}/{path}/README.md" if readme.exists() else f"{PREFIX}/{path}/index.md"
    if path.endswith(".md"):
        return f"{PREFIX}/{path}"
    return f"{PREFIX}/{path}.md"


def _relink(text: str, origin: Path, page_uri: str) -> str:
    """Links of ``text`` (written relative to ``origin``) as links from the page ``page_uri``."""
    page_dir = posixpath.dirname(page_uri) or "."
    in_docs = origin == DOCS / page_dir or (origin == DOCS and page_dir == ".")

    def relink(match: re.Match[str]) -> str:
        target = match.group(2)
        parts = _split(target)
        if parts is None or not parts[0]:
            return match.group(0)
        path, anchor = parts
        resolved = Path(os.path.normpath(origin / path))
        if resolved == DOCS or DOCS in resolved.parents:
            if in_docs:
                return match.group(0)
            new = resolved.relative_to(DOCS).as_posix()
        else:
            if ROOT not in resolved.parents:
                return match.group(0)
            repo = resolved.relative_to(ROOT).as_posix()
            if repo in _included:
                new = _included[repo]
            elif _page_uri(repo) in _generated:
                new = _page_uri(repo)
            else:
                return match.group(0)
        return f"{match.group(1)}{posixpath.relpath(new, page_dir)}{anchor}{match.group(3)}"

    out = []
    for prose, piece in _outside_code(text):
        out.append(LINK.sub(relink, piece) if prose else piece)
    return "".join(out)


def _render(path: str) -> tuple[str, Path | None]:
    """The generated page of a repository path, and the folder its links are relative to."""
    source = ROOT / path
    header = "---\nsearch:\n  exclude: true\n---\n\n"
    if source.is_dir():
        if (source / "README.md").exists():
            return header + (source / "README.md").read_text(encoding="utf-8"), source
        # Empty files (a test package's __init__.py) get no page of their own.
        names = sorted(
            p.name + ("/" if p.is_dir() else "")
            for p in source.iterdir()
            if p.is_dir() or p.read_bytes().strip()
        )
        shown = [n for n in names if not n.startswith((".", "__pycache__"))]
        items = "\n".join(f"- [`{n}`]({n.rstrip('/')})" for n in shown)
        body = f"# `{path}/`\n\nA folder of the repository.\n\n{items}\n"
        return header + body, source
    if path.endswith(".md"):
        return header + source.read_text(encoding="utf-8"), source.parent
    note = f"# `{path}`\n\nA file of the repository, as it is.\n\n"
    if path.endswith(".ipynb"):
        return header + note + _notebook(source), None
    language = NAMES.get(source.name) or LANGUAGES.get(source.suffix, "text")
    return header + note + _fenced(source.read_text(encoding="utf-8"), language), None


def _fenced(code: str, language: str) -> str:
    longest = max((len(m) for m in re.findall(r"`{3,}", code)), default=2)
    fence = "`" * (longest + 1)
    return f"{fence}{language}\n{code.rstrip()}\n{fence}\n"


def _notebook(source: Path) -> str:
    """A notebook's cells in order: Markdown cells as they are, code cells as Python blocks."""
    cells = json.loads(source.read_text(encoding="utf-8")).get("cells", [])
    out = []
    for cell in cells:
        text = "".join(cell.get("source", []))
        if cell.get("cell_type") == "markdown":
            out.append(re.sub(r"^(#+ )", r"#\1", text, flags=re.MULTILINE))
        elif cell.get("cell_type") == "code":
            out.append(_fenced(text, "python"))
    return "\n\n".join(out) + "\n"
