"""Character-level token files for ``train.py``, made from text already on this machine.

    python examples/gpt/prepare.py                          # Python's standard library sources
    python examples/gpt/prepare.py --input input.txt        # any UTF-8 text file
    python examples/gpt/prepare.py --max-chars 200000 --out-dir data/gpt

Writes ``train.bin`` and ``val.bin`` (token ids as ``np.uint16``, the first 90 % and the last
10 % of the text) and ``meta.json`` (``vocab_size`` and ``chars``, the character of each id)
to ``--out-dir``, as nanoGPT's ``data/shakespeare_char/prepare.py`` does (which writes
``meta.pkl``). Without ``--input`` the text is the ``*.py`` files of the running Python's
standard library, in name order, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import sysconfig
from pathlib import Path
from typing import NoReturn

import numpy as np


def fail(message: str) -> NoReturn:
    """Stop with ``message`` and status 2, as argparse does for a bad flag: bad input, not a bug."""
    print(f"prepare.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def stdlib_text(max_chars: int) -> tuple[str, str]:
    """Up to ``max_chars`` characters of the standard library's ``*.py`` files, and where from."""
    folder = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    size = 0
    for path in sorted(folder.glob("*.py")):
        if size >= max_chars:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(text)
        size += len(text)
    if not parts:
        fail(
            f"found no readable *.py files in {folder} (this Python ships without its library "
            "sources). Pass a text file with --input."
        )
    return "".join(parts)[:max_chars], f"{folder}/*.py"


def encode(text: str) -> tuple[np.ndarray, str]:
    """Token ids of ``text`` (one per character) and the characters in id order."""
    chars = "".join(sorted(set(text)))
    if len(chars) > np.iinfo(np.uint16).max + 1:
        fail(f"{len(chars)} distinct characters do not fit in uint16.")
    ids = {c: i for i, c in enumerate(chars)}
    return np.array([ids[c] for c in text], dtype=np.uint16), chars


def read_input(path: Path) -> str:
    """The text of ``--input``; fail with the fix when it is missing or not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        fail(
            f"--input {path} is not UTF-8 text (byte {err.start} is {err.object[err.start]:#x}): "
            "convert it first (e.g. iconv -f latin1 -t utf-8 for Latin-1 text)."
        )
    except OSError as err:
        fail(f"cannot read --input {path}: {err.strerror}. Pass a UTF-8 text file.")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", type=Path, help="a UTF-8 text file (default: stdlib sources)")
    p.add_argument("--out-dir", type=Path, default=Path("data/gpt"))
    p.add_argument("--max-chars", type=int, default=2_000_000, help="cut the text to this size")
    p.add_argument("--val-fraction", type=float, default=0.1)
    args = p.parse_args()
    if args.max_chars < 1:
        p.error(f"--max-chars {args.max_chars}: pass a number of characters of at least 1.")
    if not 0 < args.val_fraction < 1:
        p.error(f"--val-fraction {args.val_fraction}: pass a fraction above 0 and below 1.")
    if args.input is not None:
        text, source = read_input(args.input)[: args.max_chars], str(args.input)
    else:
        text, source = stdlib_text(args.max_chars)
    tokens, chars = encode(text)
    n_val = int(len(tokens) * args.val_fraction)
    train, val = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]
    if not len(train) or not len(val):  # train.py would have nothing to read
        need = max(2, math.ceil(1 / args.val_fraction))
        fail(
            f"{source} gives {len(text)} characters; train and val need at least one each, so "
            f"--val-fraction {args.val_fraction} needs {need} or more. Pass a longer text (or a "
            "larger --max-chars)."
        )
    try:
        args.out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        fail(f"cannot make --out-dir {args.out_dir}: {err.strerror}. Pass a folder you can write.")
    train.tofile(args.out_dir / "train.bin")
    val.tofile(args.out_dir / "val.bin")
    meta = {"vocab_size": len(chars), "chars": chars, "source": source}
    (args.out_dir / "meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(text):,} characters from {source}, vocab size {len(chars)}")
    print(f"train has {len(train):,} tokens, val has {len(val):,} tokens -> {args.out_dir}")


if __name__ == "__main__":
    main()
