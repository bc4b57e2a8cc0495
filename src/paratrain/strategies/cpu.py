"""``cpu``: one process on the CPU. The reference every parallel strategy is tested against."""

from __future__ import annotations

from typing import ClassVar

from paratrain.strategies.base import Strategy


class CPUStrategy(Strategy):
    """Train in this process on the CPU; nothing to wrap or synchronise."""

    name: ClassVar[str] = "cpu"
