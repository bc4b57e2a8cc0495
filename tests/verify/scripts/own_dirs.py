"""Keeps its checkpoints in a fixed folder of its own (``own_dirs.py ckpt_dir DIR`` or
``own_dirs.py run_dir DIR``), outside the run dir it is given: runs made by
``paratrain verify-resume`` would share (and resume from) each other's checkpoints."""

from __future__ import annotations

import sys

import paratrain as pt


def main() -> None:
    setting, folder = sys.argv[1:3]
    with pt.Run(progress=False, **{setting: folder}):
        pass


if __name__ == "__main__":
    main()
