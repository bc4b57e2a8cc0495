"""A launching command's line in two: its own options, then the script's, untouched.

    own, target = split_target(["--nproc", "2", "train.py", "--n", "5"])
    # own == ["--nproc", "2"], target == ["train.py", "--n", "5"]
    own, target = split_target(["--kills", "2", "train.py"], VALUED_OPTIONS["verify-resume"])

The commands that run a script (``paratrain run``, ``paratrain verify-resume``) are split so.

argparse cannot be left to find the script: it reads every option-like word of the whole line
first, so the script's ``--n 5`` was refused as an ambiguous abbreviation of ``--nproc``,
``--nnodes`` or ``--node-rank``, and a ``--`` among the script's arguments was taken for its own.
The target starts at the first word that is neither one of paratrain's options nor its value: a
script path, ``-m`` (a module follows), or after a ``--``.
"""

from __future__ import annotations

__all__ = ["VALUED_OPTIONS", "split_target"]

VALUED_OPTIONS = {
    "run": frozenset(
        {
            "--nproc",
            "--nnodes",
            "--node-rank",
            "--rdzv-endpoint",
            "--rdzv-id",
            "--max-restarts",
            "--run-dir",
            "--backend",
            "--torchrun-arg",
        }
    ),
    "verify-resume": frozenset(
        {"--nproc", "--kills", "--seed", "--run-dir", "--compare-files", "--atol", "--exclude"}
    ),
}
"""Per command, the options that take a value (``--nproc 2`` or ``--nproc=2``)."""


def split_target(
    argv: list[str], valued: frozenset[str] = VALUED_OPTIONS["run"]
) -> tuple[list[str], list[str]]:
    """(the command's options, ``[script.py, args...]`` or ``[-m, module, args...]``)."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[:i], argv[i + 1 :]
        if word == "-m" or not word.startswith("-") or word == "-":
            return argv[:i], argv[i:]
        i += 2 if word in valued else 1
    return argv, []
