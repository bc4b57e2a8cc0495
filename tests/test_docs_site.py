"""The documentation site builds with ``mkdocs build --strict``, and every page of its nav is built.

Strict mode fails on a broken link or anchor, a page left out of the nav and a docstring the API
reference cannot render. The command-line page is generated from the parsers
(docs/hooks/cli_reference.py): every command and every flag of ``paratrain`` must be on it, each
command with a guide. Every setting of ``RunConfig`` must be on the settings-by-concern page.

    pytest tests/test_docs_site.py -q
"""

from __future__ import annotations

import dataclasses
import html
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytest.importorskip("material", reason="mkdocs-material is not installed: pip install -e '.[docs]'")
pytest.importorskip(
    "mkdocstrings", reason="mkdocstrings is not installed: pip install -e '.[docs]'"
)

from mkdocs.config import load_config

from paratrain.commands.cli import COMMANDS, _parsers, build_parser
from paratrain.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _nav_pages(nav: Any) -> list[str]:
    """Every page path of an mkdocs nav (nested lists of ``{title: path or list}`` or paths)."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return [page for item in nav or [] for page in _nav_pages(item)]


NAV = _nav_pages(load_config(str(ROOT / "mkdocs.yml")).nav)


def _built(site: Path, page: str) -> Path:
    """The HTML file of a page, with mkdocs' directory URLs (``a/b.md`` -> ``a/b/index.html``)."""
    stem = page.removesuffix(".md")
    if stem == "index" or stem.endswith("/index"):
        return site / f"{stem}.html"
    return site / stem / "index.html"


def _text(path: Path) -> str:
    """The words of an HTML page, without tags."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-8000:]
    return out


def test_every_docs_page_is_in_the_nav_and_every_nav_page_exists() -> None:
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert sorted(set(NAV) - pages) == [], "in mkdocs.yml's nav but not in docs/"
    assert sorted(pages - set(NAV)) == [], "in docs/ but not in mkdocs.yml's nav"
    assert len(NAV) == len(set(NAV)), "a page is in the nav twice"


def test_the_site_builds_strictly_and_every_nav_page_is_built(site: Path) -> None:
    missing = [page for page in NAV if not _built(site, page).is_file()]
    assert missing == []
    assert not (site / "hooks").exists(), "docs/hooks/ is code, not part of the site"


def test_the_api_reference_shows_the_run_methods_with_their_docstrings(site: Path) -> None:
    from paratrain.runtime.run import Run

    text = " ".join(_text(_built(site, "reference/run.md")).split())
    for name in ("setup", "loader", "save", "resume", "get_logger", "set_grad_accum"):
        assert re.search(rf"\b{name}\(", text), f"Run.{name} is not in the API reference"
        summary = " ".join((inspect.getdoc(getattr(Run, name)) or "").split("\n")[0].split())
        assert summary and summary.replace("``", "") in text, f"Run.{name} has no docstring there"


def _reference_classes() -> list[tuple[str, type]]:
    """(page, class) for every class an API reference page documents with ``::: path``: named
    itself, or a public class of a module it names that defines its own constructor."""
    found = []
    for page in sorted((DOCS / "reference").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for path, options in re.findall(r"^::: ([\w.]+)\n((?:[ ]+.*\n)*)", text, re.M):
            listed = re.search(r"members: \[(.*)\]", options)
            members = {m.strip() for m in listed.group(1).split(",")} if listed else None
            module_name, _, attr = path.rpartition(".")
            if importlib.util.find_spec(path.split(".")[0]) is None:
                continue
            try:
                target: Any = importlib.import_module(path)
            except ModuleNotFoundError:
                target = getattr(importlib.import_module(module_name), attr)
            if inspect.isclass(target):
                found.append((f"reference/{page.name}", target))
            elif inspect.ismodule(target):
                for name, value in vars(target).items():
                    own = inspect.isclass(value) and value.__module__ == target.__name__
                    shown = not name.startswith("_") if members is None else name in members
                    if own and shown and "__init__" in vars(value):
                        found.append((f"reference/{page.name}", value))
    return found


def test_every_class_on_the_api_reference_shows_its_constructor_signature(site: Path) -> None:
    classes = _reference_classes()
    assert {cls.__name__ for _, cls in classes} >= {"Run", "RunConfig", "Profile", "Topology"}
    for page, cls in classes:
        text = " ".join(_text(_built(site, page)).split())
        params = [p for p in inspect.signature(cls).parameters if p != "self"]
        shown = [text[m.end() : m.end() + 3000] for m in re.finditer(rf"\b{cls.__name__}\(", text)]
        signature = [s for s in shown if all(re.match(rf".*?\b{p}\b", s, re.S) for p in params)]
        assert signature, f"{page}: {cls.__name__} is shown without its constructor signature"


def test_no_api_reference_page_shows_source_lines(site: Path) -> None:
    for page in sorted((DOCS / "reference").glob("*.md")):
        built = _built(site, f"reference/{page.name}").read_text(encoding="utf-8")
        # An attribute's signature is its name (and type); a value would be a line of its source.
        for block in re.findall(
            r'doc-attribute-name">(\w+)</span>.*?<div class="doc-signature highlight">(.*?)</div>',
            built,
            re.S,
        ):
            signature = html.unescape(re.sub(r"<[^>]+>", "", block[1]))
            assert "=" not in signature, f"{page.name}: {block[0]} shows {signature.strip()!r}"
        assert "module docstring" not in _text(_built(site, f"reference/{page.name}")), page.name


def test_the_cli_page_has_every_command_and_every_flag(site: Path) -> None:
    text = _text(_built(site, "reference/cli.md"))
    for parser in _parsers(build_parser()):
        assert parser.prog in text, f"{parser.prog} is not on the CLI page"
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in text, f"{parser.prog} {flag} is not on the CLI page"


def test_every_command_has_a_guide() -> None:
    spec = importlib.util.spec_from_file_location("cli_reference", DOCS / "hooks/cli_reference.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    assert set(hook.GUIDES) == set(COMMANDS)
    for command, guide in hook.GUIDES.items():
        assert (DOCS / "reference" / guide.split("#")[0]).resolve().is_file(), command


def test_every_setting_is_on_the_settings_by_concern_page() -> None:
    page = (DOCS / "concepts" / "settings.md").read_text(encoding="utf-8")
    missing = [f.name for f in dataclasses.fields(RunConfig) if f"`{f.name}`" not in page]
    assert missing == [], "add them to the table in docs/concepts/settings.md"
