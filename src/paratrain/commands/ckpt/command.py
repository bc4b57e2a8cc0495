"""``paratrain ckpt inspect|verify|convert|diff``: understand, check and convert checkpoints.

paratrain ckpt inspect runs/exp/checkpoints/step-00000300
paratrain ckpt verify runs/exp/checkpoints          # exit 1 when nothing valid is there
paratrain ckpt convert old_dp.pth model.safetensors --to safetensors
paratrain ckpt convert runs/exp/checkpoints/step-00000300 hf-out --to hf --max-shard-size 2GB
paratrain ckpt reshard runs/exp/checkpoints out --to-layout fsdp --world 8   # offline
paratrain ckpt diff a.pt b.safetensors              # exit 1 when they differ
paratrain ckpt diff a.pt b.pt | head -1             # a closed pipe ends the output quietly
paratrain ckpt verify s3://bucket/run1              # URLs (any fsspec protocol) for the inputs

A file or folder that is not a readable checkpoint is a one-paragraph error and exit code 2.
The work is done by :mod:`paratrain.checkpoint.inspection` (imported when an action runs: it
needs torch); this module only parses arguments and prints.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from paratrain.checkpoint.formats import FORMATS
from paratrain.checkpoint.object_storage import is_url
from paratrain.commands.cli_types import memory_size
from paratrain.errors import CheckpointError


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paratrain ckpt`` and its five actions."""
    ckpt = subparsers.add_parser(
        "ckpt",
        help="inspect, verify, convert, reshard and diff checkpoints",
        description=DESCRIPTION,
    )
    actions = ckpt.add_subparsers(title="actions", metavar="ACTION", required=True)
    p = _action(actions, "inspect", "format, tensors, prefixes, saved run, resume state")
    p.add_argument("path", type=location, metavar="PATH", help=PATH_HELP)
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("--trust", action="store_true", help=TRUST_HELP)
    p.set_defaults(handler=_inspect)
    p = _action(actions, "verify", "check checksums / read everything; exit 1 if bad")
    p.add_argument("path", type=location, metavar="PATH", help=PATH_HELP)
    p.set_defaults(handler=_verify)
    p = _action(
        actions, "convert", "rewrite as pt, safetensors, dcp or an hf folder, prefixes removed"
    )
    p.add_argument(
        "src", type=location, metavar="SRC", help="the checkpoint or weights file to read"
    )
    p.add_argument(
        "dst", type=location, metavar="DST", help="where to write (a file, or a folder for dcp)"
    )
    p.add_argument("--to", required=True, choices=FORMATS, help="the format to write")
    p.add_argument(
        "--map",
        type=location,
        metavar="FILE",
        help="rename tensors: a JSON object of names or prefixes (ending in '.') to new ones "
        "(null drops), or a .py file defining rename(key) -> str | None",
    )
    p.add_argument(
        "--max-shard-size",
        type=memory_size,
        default=5 * 10**9,
        metavar="SIZE",
        help="--to hf: the largest shard (default 5GB, as save_pretrained)",
    )
    p.add_argument("--trust", action="store_true", help=TRUST_HELP)
    p.set_defaults(handler=_convert)
    p = _action(
        actions, "reshard", "rewrite a whole training state for another layout or world size"
    )
    p.add_argument(
        "src", type=location, metavar="CKPT", help="a checkpoint folder, or a run's checkpoint "
        "folder (its newest intact checkpoint); a URL (s3://...) too",
    )  # fmt: skip
    p.add_argument(
        "dst", type=location, metavar="OUT", help="the checkpoint folder to write into (a run with "
        "ckpt_dir=OUT resumes from it); a URL (s3://...) too: uploaded, manifest last",
    )  # fmt: skip
    p.add_argument(
        "--to-layout", required=True, choices=("fsdp", "ddp", "single"),
        help="fsdp: each rank's shards in a file of its own; ddp, single: one full copy",
    )  # fmt: skip
    p.add_argument(
        "--world", type=_ranks, default=None, metavar="N",
        help="ranks of the job that will resume (fsdp, ddp; single is 1)",
    )  # fmt: skip
    p.set_defaults(handler=_reshard)
    p = _action(actions, "diff", "compare two checkpoints' tensors; exit 1 if different")
    p.add_argument("a", type=location, metavar="A", help="the first checkpoint or weights file")
    p.add_argument("b", type=location, metavar="B", help="the second checkpoint or weights file")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("--trust", action="store_true", help=TRUST_HELP)
    p.set_defaults(handler=_diff)


def _action(
    actions: argparse._SubParsersAction[argparse.ArgumentParser], name: str, summary: str
) -> argparse.ArgumentParser:
    """One ``paratrain ckpt`` action, its summary also the first line of its ``--help``."""
    return actions.add_parser(name, help=summary, description=f"paratrain ckpt {name}: {summary}.")


DESCRIPTION = (
    "Inspect, verify, convert, reshard and diff checkpoints: paratrain checkpoint folders, "
    "torch.save files, safetensors files and DCP folders, on disk or at a URL (s3://...; "
    "reshard reads and writes local folders). A path that is not a readable checkpoint is a "
    "one-paragraph error and exit code 2."
)
PATH_HELP = "a checkpoint folder, a folder of checkpoints, a weights file, or a URL (s3://...)"
JSON_HELP = "print the report as JSON, for scripts, instead of lines for people"
TRUST_HELP = "allow pickled code, e.g. a whole nn.Module saved by torch.save (trusted files only)"


def location(text: str) -> str | Path:
    """A command-line path: a URL (``s3://...``) stays text, anything else is a Path."""
    return text if is_url(text) else Path(text)


def _emit(lines: list[str], code: int) -> int:
    """Print ``lines``; return ``code``, also when the reader of stdout has gone away.

    ``paratrain ckpt diff a b | head -1`` closes the pipe early. Python then raises
    BrokenPipeError on the next write and again when it flushes stdout at exit; pointing stdout
    at devnull ends the command quietly, as `cat` or `grep` would.
    """
    try:
        for line in lines:
            print(line)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return code


def _render(data: dict[str, Any], as_json: bool) -> list[str]:
    if as_json:
        return [json.dumps(data, indent=2)]
    return human(data)


NAMED_BY_DATA = {"max_abs_diff", "dtypes", "wrapper_prefixes"}
"""Dicts whose keys are tensor names or dtypes: shown as they are."""


def human(data: dict[str, Any], indent: str = "", *, words: bool = True) -> list[str]:
    """``data`` as lines a person reads: yes/no, "none" for nothing, sizes in MiB, nested
    dicts indented, lists as one bullet line per item (a record's fields indented under its
    bullet); never a Python repr. With ``words``, keys are shown as words (``first_keys``:
    "first keys")."""
    lines = []
    for key, value in data.items():
        label = indent + (str(key).replace("_", " ") if words else str(key))
        if key == "bytes" and isinstance(value, int) and not isinstance(value, bool):
            lines.append(f"{indent}size: {_size(value)}")
        elif isinstance(value, dict) and value:
            lines.append(f"{label}:")
            lines.extend(human(value, indent + "  ", words=key not in NAMED_BY_DATA))
        elif isinstance(value, (list, tuple)) and value:
            lines.append(f"{label}:")
            lines.extend(_bullets(value, indent + "  "))
        else:
            lines.append(f"{label}: {_word(value)}")
    return lines


def _bullets(items: list[Any] | tuple[Any, ...], indent: str) -> list[str]:
    """One ``- item`` line per item; a record's first field on its bullet, the rest below it."""
    lines = []
    for item in items:
        if isinstance(item, dict) and item:
            first, *rest = human(item, indent + "  ")
            lines += [f"{indent}- {first.lstrip()}", *rest]
        else:
            lines.append(f"{indent}- {_word(item)}")
    return lines


def _word(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None or value == [] or value == {}:
        return "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(_word(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_word(v)}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _size(count: int) -> str:
    if count < 2**20:
        return f"{count:,} bytes"
    return f"{count / 2**20:,.1f} MiB ({count:,} bytes)"


def _inspect(args: argparse.Namespace) -> int:
    from paratrain.checkpoint import inspection

    return _emit(_render(inspection.inspect(args.path, trust=args.trust), args.json), 0)


def _verify(args: argparse.Namespace) -> int:
    from paratrain.checkpoint import inspection

    ok, lines = inspection.verify(args.path)
    if not ok:
        lines.append(f"FAILED: {args.path} is not intact; resume would skip it.")
    return _emit(lines, 0 if ok else 1)


def _convert(args: argparse.Namespace) -> int:
    from paratrain.checkpoint import inspection

    mapping = Path(args.map) if args.map is not None else None
    if mapping is not None and not _is_file(mapping):
        raise CheckpointError(f"--map {args.map}: no such file. Give a .json or .py mapping file.")
    with _stopped_cleanly("ckpt convert", args.dst), _progress_bar() as progress:
        result = inspection.convert(
            args.src,
            args.dst,
            to=args.to,
            trust=args.trust,
            rename=mapping,
            max_shard_bytes=args.max_shard_size,
            progress=progress,
        )
    line = (
        f"wrote {result['path']} ({result['to']}, {result['tensors']} tensors, from "
        f"{result['from']}; {result['stripped']} keys lost a wrapper prefix)"
    )
    return _emit([line], 0)


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; False for a name the system cannot look up (too long)."""
    try:
        return path.is_file()
    except OSError:
        return False


class Stopped(BaseException):
    """A stop signal during a write (a BaseException, as KeyboardInterrupt: no ``except
    Exception`` on the way may take it for a failure to work around)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stopped_cleanly(what: str, dst: str | Path) -> Iterator[None]:
    """SIGTERM (``kill``, a scheduler ending the job) and Ctrl-C end a write the way a failed
    one ends: the staging files are removed on the way out, nothing is left at ``dst``, and one
    line says so (exit code 128 + the signal). Without this, SIGTERM killed the process where
    it stood and left its ``.tmp-*`` staging beside the output."""

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except (KeyboardInterrupt, Stopped) as err:
        signum = err.signum if isinstance(err, Stopped) else signal.SIGINT
        name = signal.Signals(signum).name
        where = (
            f"the upload to {dst} was not finished"
            if is_url(str(dst))
            else f"nothing was left at {dst}"
        )
        print(f"paratrain: {what} stopped by {name}; {where}.", file=sys.stderr)
        raise SystemExit(128 + signum) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _progress_bar() -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar of the bytes written, on a terminal's stderr (none in a pipe or a log)."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    with Progress(
        "converting", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        console=Console(stderr=True), transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("convert", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _ranks(text: str) -> int:
    """``--world``: a whole number of ranks, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of ranks (1 or more)")
    return value


def _reshard(args: argparse.Namespace) -> int:
    from paratrain.checkpoint.reshard_urls import reshard_urls

    world = args.world
    if world is None:
        if args.to_layout != "single":
            raise CheckpointError(
                f"--to-layout {args.to_layout} needs --world N: the number of ranks of the job "
                "that will resume from the output."
            )
        world = 1
    with _stopped_cleanly("ckpt reshard", args.dst), _progress_bar() as progress:
        result = reshard_urls(
            args.src, args.dst, layout=args.to_layout, world=world, progress=progress
        )
    line = (
        f"wrote {result['path']} ({result['to']}, step {result['step']}, {result['tensors']} "
        f"tensors, {_size(result['bytes'])}, from {result['from']})"
    )
    return _emit([line], 0)


def _diff(args: argparse.Namespace) -> int:
    from paratrain.checkpoint import inspection

    result = inspection.diff(args.a, args.b, trust=args.trust)
    return _emit(_render(result, args.json), 0 if result["identical"] else 1)
