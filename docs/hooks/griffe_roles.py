"""Sphinx roles in docstrings as Markdown code, for the API reference.

Loaded by mkdocstrings (``extensions:`` of the python handler in mkdocs.yml). paratrain's
docstrings name other objects the Sphinx way, ``:class:`~paratrain.errors.CheckpointError```
or ``:meth:`Run.save```, which ``paratrain --help`` also shows as plain text
(:func:`paratrain.commands.cli.plain`). Here they become code spans: ``CheckpointError``,
``Run.save``.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):`~?([^`]+)`")


class SphinxRoles(Extension):
    """Rewrite ``:role:`target``` into a Markdown code span of the target's name."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        docstring = getattr(obj, "docstring", None)
        if docstring is not None and ":" in docstring.value:
            docstring.value = ROLE.sub(_code, docstring.value)


def _code(match: re.Match[str]) -> str:
    target = match.group(1)
    if match.group(0).split("`", 1)[1].startswith("~"):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"
