"""The command-line reference, generated from the parsers ``paratrain`` itself uses.

Registered under ``hooks:`` in mkdocs.yml. In ``reference/cli.md`` the line
``<!-- cli-reference -->`` is replaced by one section per subcommand (and per sub-subcommand,
such as ``paratrain ckpt inspect``): its usage, its description and every argument with its
help, choices and default, read from :func:`paratrain.commands.cli.build_parser`. Nothing here
lists a flag, so the page cannot drift from ``paratrain COMMAND --help``.
"""

from __future__ import annotations

import argparse
import html
import re
from pathlib import PurePath
from typing import Any

MARKER = "<!-- cli-reference -->"
RULE = re.compile(r"\bPT\d{3}\b")  # a `paratrain check` rule: linked to its page
PAGE = "reference/cli.md"
WIDTH = 88  # usage lines wrap here, whatever the terminal of the build

GUIDES = {
    "run": "../howto/launch.md",
    "demo": "../getting-started/demo.md",
    "doctor": "../getting-started/doctor.md",
    "check": "../rules/index.md",
    "verify-resume": "../concepts/verify-resume.md",
    "plan": "../howto/plan.md",
    "ckpt": "../howto/checkpoints.md#inspect-verify-convert-and-diff-checkpoints",
    "monitor": "../howto/profiling.md#watch-a-running-job-paratrain-monitor",
    "bench": "../howto/bench.md",
    "serve": "../howto/containers.md",
}
"""The guide that explains each command's behaviour; the flags themselves come from the parser."""


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Replace the marker on the CLI page with the reference made from the parsers."""
    if page.file.src_uri != PAGE or MARKER not in markdown:
        return markdown
    from paratrain.commands.cli import build_parser

    return markdown.replace(MARKER, render(build_parser()))


def render(parser: argparse.ArgumentParser) -> str:
    """Markdown for the top-level parser's own options, then every subcommand, recursively."""
    parts = [_options(parser, level=2, title="Options of `paratrain` itself")]
    summaries = _summaries(parser)
    for name, sub in _subcommands(parser):
        parts.append(_command(sub, name, level=2, summary=summaries.get(name, "")))
    return "\n\n".join(p for p in parts if p) + "\n"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    found: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found += list(action.choices.items())
    return found


def _summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each subcommand's one-line help, as ``COMMAND --help`` lists it."""
    found: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                found[choice.dest] = str(choice.help or "")
    return found


def _command(parser: argparse.ArgumentParser, name: str, level: int, summary: str = "") -> str:
    hashes = "#" * level
    lines = [f"{hashes} `{parser.prog}`", ""]
    command = parser.prog.split()[1] if len(parser.prog.split()) > 1 else name
    if summary:
        lines += [_inline(summary[:1].upper() + summary[1:]) + ".", ""]
    if parser.description:
        lines += [_inline(parser.description), ""]
    if level == 2 and command in GUIDES:
        lines += [f"Guide: [what `paratrain {command}` does]({GUIDES[command]}).", ""]
    lines += ["```text", _usage(parser), "```", ""]
    arguments = _arguments(parser)
    if arguments:
        lines += [arguments, ""]
    if parser.epilog:
        lines += [_inline(parser.epilog), ""]
    summaries = _summaries(parser)
    for sub_name, sub in _subcommands(parser):
        lines.append(_command(sub, sub_name, level + 1, summaries.get(sub_name, "")))
    return "\n".join(lines).rstrip()


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH, max_help_position=32)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _arguments(parser: argparse.ArgumentParser) -> str:
    positionals = [a for a in parser._actions if not a.option_strings and _shown(a)]
    options = [a for a in parser._actions if a.option_strings and _shown(a)]
    blocks = []
    if positionals:
        blocks.append("Arguments:\n\n" + "\n".join(_item(parser, a) for a in positionals))
    if options:
        blocks.append("Options:\n\n" + "\n".join(_item(parser, a) for a in options))
    return "\n\n".join(blocks)


def _options(parser: argparse.ArgumentParser, level: int, title: str) -> str:
    options = [a for a in parser._actions if a.option_strings and _shown(a)]
    if not options:
        return ""
    lines = [f"{'#' * level} {title}", ""]
    if parser.description:
        lines += [_inline(parser.description), ""]
    lines += ["```text", _usage(parser), "```", ""]
    lines += [_item(parser, a) for a in options]
    if parser.epilog:
        lines += ["", _inline(parser.epilog)]
    return "\n".join(lines)


def _shown(action: argparse.Action) -> bool:
    hidden = action.help == argparse.SUPPRESS
    return not hidden and not isinstance(action, argparse._SubParsersAction | argparse._HelpAction)


def _item(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    invocation = formatter._format_action_invocation(action)
    text = formatter._expand_help(action) if action.help else ""
    line = f"- `{invocation}`" + (f": {_inline(text)}" if text else "")
    extras = []
    choices = action.choices
    if choices is not None and not isinstance(choices, dict) and "{" not in invocation:
        extras.append("one of " + ", ".join(f"`{c}`" for c in choices))
    default = _default(action)
    if default is not None and "default" not in text:  # the help may say it already
        extras.append(f"default `{default}`")
    if extras:
        line += " (" + "; ".join(extras) + ")"
    return line


def _default(action: argparse.Action) -> str | None:
    """The default worth showing: not for flags that only switch something on, nor None."""
    value = action.default
    no_value = action.nargs == 0 or isinstance(action, argparse._VersionAction)
    if value is None or value == argparse.SUPPRESS or no_value or value == []:
        return None
    if isinstance(value, PurePath):
        value = str(value)
    return str(value)


def _inline(text: str) -> str:
    """Help text as Markdown: code spans kept, everything else escaped, whitespace joined."""
    pieces = re.split(r"(`[^`]*`)", " ".join(text.split()))
    out = []
    for piece in pieces:
        if piece.startswith("`") and piece.endswith("`") and len(piece) > 1:
            out.append(piece)
        else:
            escaped = re.sub(r"([\\*_\[\]|#])", r"\\\1", html.escape(piece, quote=False))
            out.append(RULE.sub(r"[\g<0>](../rules/\g<0>.md)", escaped))
    return "".join(out)
