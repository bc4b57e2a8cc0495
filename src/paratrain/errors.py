"""Errors a user can trigger. Each message says what was wrong, what is allowed, and the fix.

The CLI prints a ``ParatrainError`` as one paragraph and exits with code 2, never with a traceback:

    raise ConfigError("batch_size must be a positive integer, got 0. Pass e.g. batch_size=32.")
"""

from __future__ import annotations


class ParatrainError(Exception):
    """Base class of every error caused by input, configuration or environment (not by a bug)."""


class ConfigError(ParatrainError, ValueError):
    """A setting is invalid or two settings cannot be combined."""


class EnvironmentMismatchError(ParatrainError, RuntimeError):
    """The machine cannot do what was asked (no GPU for ``cuda``, more ranks than GPUs, ...)."""


class ModelError(ParatrainError, ValueError):
    """The model cannot be used as given (no parameters, wrong state, ...)."""


class CheckpointError(ParatrainError, RuntimeError):
    """A checkpoint cannot be read, trusted or matched to the model; the message says which."""


class CheckpointDamagedError(CheckpointError):
    """A checkpoint file is missing, resized, corrupted or unreadable (an older one may serve)."""


class StorageError(ParatrainError, RuntimeError):
    """Checkpoint storage at a URL (``ckpt_dir="s3://..."``) cannot be reached or refused an
    operation. Not a CheckpointError: an outage must stop a resume, not make it skip every
    checkpoint and start fresh."""


class DataError(ParatrainError, ValueError):
    """The data cannot be split or resumed as given (e.g. a stream whose order differs between
    DataLoader workers or ranks, which paratrain's split of the stream needs to be the same)."""


class JobFailedError(ParatrainError):
    """A launched job ended because a rank failed. The command exits with that rank's own code
    (``exit_code``), not with 2, which means a usage error."""

    def __init__(self, message: str, *, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


PEER_LOST = (
    "Connection closed by peer",
    "Connection reset",
    "remote worker",
    "Broken pipe",
    "Socket Timeout",
)
"""Error texts of a rank that failed because a peer went away, not because of its own code:
when one rank dies, every rank waiting on it in a collective fails a moment later with one of
these (gloo, NCCL, the TCP store)."""


def lost_a_peer(text: str) -> bool:
    """Whether ``text`` (an error message or a traceback) says a peer went away: another rank
    failed first, and its error is the one to read."""
    return any(marker in text for marker in PEER_LOST)
