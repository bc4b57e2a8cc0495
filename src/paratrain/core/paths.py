"""Paths from users, checked before any work starts, with errors that name the fix.

    existing("ckpt/step-100", "checkpoint", CheckpointError)   # a Path that exists, or the error
    check_creatable("runs/exp", "run_dir")   # ConfigError now, not a FileExistsError at step 900
    make_folder(Path("runs/exp"), "--run-dir")

A name the OS refuses (too long, a NUL byte) or cannot look at (permissions) is an error naming
the path, like a missing one. An output folder passes when it exists and takes a new file, or when
its nearest existing parent is a folder in which a new folder can really be made (tried and
removed again). Permission bits alone do not decide it: root may write anywhere by those bits, yet
nothing can be made under ``/proc``.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from paratrain.errors import ConfigError, ParatrainError

URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+)://(.*)$")
"""``protocol://rest``: a location on a file system fsspec opens (object storage, memory)."""


def is_url(value: object) -> bool:
    """True for a ``protocol://...`` string (a one-letter scheme is a Windows drive, not one)."""
    return isinstance(value, str) and URL.match(value) is not None


def _reason(err: OSError) -> str:
    return err.strerror or type(err).__name__


def _shown(path: object) -> str:
    text = str(path)
    return repr(text if len(text) <= 120 else text[:100] + "...")


def _look(path: object, what: str, error: type[ParatrainError]) -> tuple[Path, bool]:
    """(``path`` as a Path, whether it exists); ``error`` for a non-path or an unusable name."""
    if not isinstance(path, (str, os.PathLike)) or str(path) == "":
        raise error(f"{what} must be a path (str or pathlib.Path), got {path!r}.")
    target = Path(path)
    try:
        target.stat()
    except (FileNotFoundError, NotADirectoryError):
        return target, False
    except (OSError, ValueError) as err:
        reason = _reason(err) if isinstance(err, OSError) else str(err)
        raise error(f"{what} {_shown(target)} cannot be used ({reason}). Check the path.") from None
    return target, True


def existing(path: object, what: str, error: type[ParatrainError] = ConfigError) -> Path:
    """``path`` as a :class:`Path` that exists; else ``error`` naming ``what`` and the fix."""
    target, found = _look(path, what, error)
    if not found:
        raise error(f"{target} does not exist. Check the path.")
    return target


def _nearest(target: Path) -> Path:
    """The deepest of ``target`` and its parents that exists (``.`` for a relative path)."""
    for candidate in (target, *target.parents):
        try:
            candidate.stat()
        except (FileNotFoundError, NotADirectoryError):
            continue
        return candidate
    return Path(".")


def _check_names(target: Path, existing_part: Path, what: str) -> None:
    """Each folder still to be made must have a name the file system takes."""
    try:
        longest = os.pathconf(existing_part, "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = 255
    missing = (
        target.parts[len(existing_part.parts) :] if existing_part != Path(".") else target.parts
    )
    for name in missing:
        if len(os.fsencode(name)) > longest:
            raise ConfigError(
                f"{what} {_shown(target)} has a part of {len(name)} characters; this file system "
                f"takes at most {longest}. Choose a shorter folder name."
            )


def check_creatable(path: str | os.PathLike[str], what: str) -> None:
    """Raise :class:`ConfigError` unless ``path`` is, or can become, a writable folder.

    Leaves nothing behind: a probe file or folder is made and removed at once.
    """
    target = Path(path)
    try:
        existing_part = _nearest(target)
        is_dir = existing_part.is_dir()
    except (OSError, ValueError) as err:
        reason = _reason(err) if isinstance(err, OSError) else str(err)
        raise ConfigError(
            f"{what} {_shown(target)} cannot be used ({reason}). Choose a shorter, plain "
            "folder path."
        ) from None
    if not is_dir:
        where = "is a file" if existing_part == target else f"is inside {existing_part}, a file"
        raise ConfigError(
            f"{what} {_shown(target)} {where}, not a folder. Choose a folder path (a new one is "
            "made for you)."
        )
    _check_names(target, existing_part, what)
    try:
        if existing_part == target:
            fd, probe = tempfile.mkstemp(dir=existing_part, prefix=".paratrain-probe-")
            os.close(fd)
            os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(dir=existing_part, prefix=".paratrain-probe-"))
    except OSError as err:
        action = "written to" if existing_part == target else "created"
        raise ConfigError(
            f"{what} {_shown(target)} cannot be {action}: making anything in {existing_part} "
            f"fails ({_reason(err)}). Choose a folder on a writable disk, e.g. under your home "
            "or working directory."
        ) from None


def check_new(path: object, what: str, error: type[ParatrainError] = ConfigError) -> Path:
    """``path`` as a :class:`Path` that does not exist yet and can be written; else ``error``."""
    try:
        target, found = _look(path, what, error)
    except ParatrainError as err:
        raise error(f"{err} Nothing was written.") from None
    if found:
        raise error(f"{what} {target} already exists. Choose a new path; nothing was written.")
    try:
        check_creatable(target, what)
    except ConfigError as err:
        raise error(f"{err} Nothing was written.") from None
    return target


def check_output_file(path: object, what: str) -> Path:
    """``path`` as a :class:`Path` a file can be written to (made or replaced); else ConfigError."""
    target, found = _look(path, what, ConfigError)
    if found and target.is_dir():
        raise ConfigError(
            f"{what} {target} is a folder. Give a file path, e.g. {target / 'model.pt'}."
        )
    check_creatable(target.parent, what)
    _check_names(target, _nearest(target), what)
    return target


def make_folder(path: Path, what: str) -> Path:
    """``path.mkdir(parents=True, exist_ok=True)``, with a :class:`ConfigError` naming ``what``."""
    check_creatable(path, what)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"{what} {_shown(path)} cannot be created ({_reason(err)}). Choose a shorter folder "
            "path on a writable disk."
        ) from None
    return path
