"""The ranks' tracebacks in torchrun's output: the failing rank's shown first, whole; the ranks
that only lost it reduced to one line each.

    ranks = RankTracebacks()
    for line in torchrun_stderr:
        for shown in ranks.feed(line):
            sys.stderr.write(shown)
    ranks.flush()                        # whatever is still held
    ranks.own[1]                         # rank 1's traceback, without the "[rank1]: " prefixes

When rank 1 raises, rank 0 fails a moment later in its next collective ("Connection closed by
peer") and torchrun prints both. Rank 0's traceback often comes first and is long; it says nothing
about the bug. So a rank's traceback is held until its exception line: a peer-loss error becomes
one line (its full text is shown at the end only if no rank failed on its own), any other is shown
as it came.
"""

from __future__ import annotations

import re

from paratrain.errors import PEER_LOST, lost_a_peer

PREFIX = re.compile(r"^\[rank(\d+)\]: ?")
_LAUNCHER_EXCEPTIONS = ("torch.distributed.elastic", "ChildFailedError", "KeyboardInterrupt")
"""Exceptions of torchrun itself (its agent), never a rank's."""
TRACEBACK = "Traceback (most recent call last):"


class RankTracebacks:
    """A filter over torchrun's stderr lines (see the module docstring)."""

    def __init__(self) -> None:
        self.own: dict[int, list[str]] = {}
        """Each rank's last traceback that was not a peer loss, lines without the prefix."""
        self.lost_peer: dict[int, list[str]] = {}
        """Each rank's last peer-loss traceback, as printed (with prefixes)."""
        self._held: dict[int, list[str]] = {}
        self.unprefixed: list[str] | None = None
        """The last traceback printed without a ``[rankN]:`` prefix (a rank without a process
        group: one process, or an error before or inside ``pt.Run()``), shown as it came."""
        self._loose: list[str] | None = None

    def feed(self, line: str) -> list[str]:
        """The lines to show now, given the next line of output."""
        match = PREFIX.match(line)
        if match is None:
            self._follow_unprefixed(line)
            return [line]
        rank, text = int(match.group(1)), line[match.end() :]
        held = self._held.get(rank)
        if held is None:
            if text.startswith(TRACEBACK):
                self._held[rank] = [line]
                return []
            return [line]
        held.append(line)
        if text[:1].isspace() or text.startswith(TRACEBACK) or not text.strip():
            return []  # a frame, its source line, or the carets under it
        return self._close(rank, text)

    def _follow_unprefixed(self, line: str) -> None:
        text = line.rstrip("\n")
        if text.startswith(TRACEBACK):
            self._loose = [text]
        elif self._loose is not None:
            self._loose.append(text)
            if text and not text[:1].isspace() and not text.startswith(TRACEBACK):
                if not text.startswith(_LAUNCHER_EXCEPTIONS) and not lost_a_peer(text):
                    self.unprefixed = self._loose  # the exception line ends it
                self._loose = None

    def _close(self, rank: int, exception_line: str) -> list[str]:
        block = self._held.pop(rank)
        if lost_a_peer(exception_line):
            self.lost_peer[rank] = block
            kind = exception_line.split(":", 1)[0].strip()
            marker = next(m for m in PEER_LOST if m in exception_line)
            return [
                f"[rank{rank}]: {kind}: {marker} (a peer failed; its error is the one to read)\n"
            ]
        self.own[rank] = [PREFIX.sub("", held, count=1) for held in block]
        return block

    def flush(self, *, failed: bool = True) -> list[str]:
        """At the end of the output: tracebacks still held, and, when the job ``failed`` and
        no rank failed on its own, the peer-loss tracebacks in full (then they are all there
        is to read; a job that went on after a restart needs none of them)."""
        shown = [line for rank in sorted(self._held) for line in self._held[rank]]
        self._held = {}
        if failed and not self.own:
            shown += [line for rank in sorted(self.lost_peer) for line in self.lost_peer[rank]]
        return shown


def raised_at(traceback: list[str], *, skip: tuple[str, ...] = ()) -> tuple[str, str] | None:
    """(the exception line, ``file:line`` of the deepest frame whose path contains none of
    ``skip``) of a traceback, or None when it holds no frame."""
    frames = [
        (m.group(1), m.group(2))
        for line in traceback
        if (m := re.match(r'\s*File "([^"]+)", line (\d+)', line))
    ]
    if not frames:
        return None
    own = [
        f
        for f in frames
        if not f[0].startswith("<") and not any(folder in f[0] for folder in skip)  # <string>
    ]
    path, number = (own or frames)[-1]
    ends = [line.strip() for line in traceback if line.strip() and not line[:1].isspace()]
    return (ends[-1] if ends else "", f"{path}:{number}")
