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
import sysconfig
from pathlib import Path

import numpy as np


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
        raise SystemExit(
            f"prepare.py: found no readable *.py files in {folder} (this Python ships without "
            "its library sources). Pass a text file with --input."
        )
    return "".join(parts)[:max_chars], f"{folder}/*.py"


def encode(text: str) -> tuple[np.ndarray, str]:
    """Token ids of ``text`` (one per character) and the characters in id order."""
    chars = "".join(sorted(set(text)))
    if len(chars) > np.iinfo(np.uint16).max + 1:
        raise SystemExit(f"prepare.py: {len(chars)} distinct characters do not fit in uint16.")
    ids = {c: i for i, c in enumerate(chars)}
    return np.array([ids[c] for c in text], dtype=np.uint16), chars


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", type=Path, help="a UTF-8 text file (default: stdlib sources)")
    p.add_argument("--out-dir", type=Path, default=Path("data/gpt"))
    p.add_argument("--max-chars", type=int, default=2_000_000, help="cut the text to this size")
    p.add_argument("--val-fraction", type=float, default=0.1)
    args = p.parse_args()
    if args.input is not None:
        text, source = args.input.read_text(encoding="utf-8")[: args.max_chars], str(args.input)
    else:
        text, source = stdlib_text(args.max_chars)
    tokens, chars = encode(text)
    n_val = int(len(tokens) * args.val_fraction)
    train, val = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    train.tofile(args.out_dir / "train.bin")
    val.tofile(args.out_dir / "val.bin")
    meta = {"vocab_size": len(chars), "chars": chars, "source": source}
    (args.out_dir / "meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(text):,} characters from {source}, vocab size {len(chars)}")
    print(f"train has {len(train):,} tokens, val has {len(val):,} tokens -> {args.out_dir}")


if __name__ == "__main__":
    main()
