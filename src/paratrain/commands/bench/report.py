"""Render benchmark results: a markdown table, ``bench.json`` and PNG plots.

print(markdown_table(rows))
write_json(run_dir / "bench.json", rows, meta)
plot(rows, run_dir)        # throughput_vs_ranks.png, memory_per_rank.png

Rows measured with ``--compare`` carry ``peers``; the table then gains each peer's samples/s
and its ratio to the same reference, and the throughput plot a dotted line per peer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paratrain.errors import EnvironmentMismatchError

COLUMNS = (
    "strategy",
    "precision",
    "layout",
    "ranks",
    "samples/s",
    "step p50 ms",
    "step p90 ms",
    "peak mem/rank MB",
    "scaling eff.",
    "reference samples/s",
    "paratrain/reference (95% interval)",
)


_PEER_MARKERS = {"accelerate": "^", "fabric": "s"}


def peer_names(rows: list[dict[str, Any]]) -> list[str]:
    """The peers compared in any row, in the order they were asked for."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row.get("peers", {})))
    return list(names)


def _columns(peers: list[str]) -> list[str]:
    extra = [c for name in peers for c in (f"{name} samples/s", f"{name}/reference")]
    return [*COLUMNS, *extra]


def _cells(row: dict[str, Any], peers: list[str]) -> list[str]:
    head = [row["strategy"], row["precision"], row.get("layout", "-"), str(row["nproc"])]
    if "samples_per_s" not in row:
        reason = row.get("skipped") or row.get("error") or "no result"
        return head + [f"skipped: {reason}"] + [""] * (len(_columns(peers)) - 5)
    return _own_cells(row, head) + [c for name in peers for c in _peer_cells(row, name)]


def _peer_cells(row: dict[str, Any], name: str) -> list[str]:
    """``[samples/s, ratio (interval)]`` of one peer, or why it was skipped."""
    peer = row.get("peers", {}).get(name)
    if peer is None:
        return ["", ""]
    if "samples_per_s" not in peer:
        return [f"skipped: {peer.get('skipped', 'no result')}", ""]
    text = f"{peer['ratio']:.3f} ({peer['ratio_low']:.3f}–{peer['ratio_high']:.3f})"
    return [f"{peer['samples_per_s']:.1f}", text + (" too noisy" if peer.get("noisy") else "")]


def _own_cells(row: dict[str, Any], head: list[str]) -> list[str]:
    eff = row.get("scaling_efficiency")
    return [
        *head,
        f"{row['samples_per_s']:.1f}",
        f"{row['step_ms_p50']:.2f}",
        f"{row['step_ms_p90']:.2f}",
        f"{max(row['peak_memory_mb']):.0f}",
        "-" if eff is None else f"{eff:.2f}",
        f"{row['reference_samples_per_s']:.1f}",
        _ratio(row),
    ]


def _ratio(row: dict[str, Any]) -> str:
    """The median paired ratio with its 95 % interval, flagged when the machine was too noisy."""
    text = f"{row['overhead_ratio']:.3f}"
    if "ratio_low" in row:
        text += f" ({row['ratio_low']:.3f}–{row['ratio_high']:.3f})"
    if row.get("noisy"):
        text += " too noisy"
    if row.get("out_of_time"):
        text += f" (budget spent after {row['pairs']} pairs)"
    return text


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One line per configuration; skipped ones say why. Peers' columns only when compared."""
    peers = peer_names(rows)
    columns = _columns(peers)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cells(r, peers)) + " |" for r in rows]
    return "\n".join(lines)


def write_json(path: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> Path:
    """``{"meta": {...}, "results": [...]}`` (schema in docs/howto/bench.md)."""
    path.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    return path


def plot(rows: list[dict[str, Any]], out_dir: Path, title: str) -> list[Path]:
    """Throughput against ranks (paratrain solid, reference dashed) and memory per rank."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise EnvironmentMismatchError(
            "Plots need matplotlib: `pip install 'paratrain[demo]'`, or pass --no-plot."
        ) from err
    ok = [r for r in rows if "samples_per_s" in r]
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in ok:
        series.setdefault((r["strategy"], r["precision"]), []).append(r)
    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    for (strategy, precision), items in sorted(series.items()):
        items.sort(key=lambda r: r["nproc"])
        xs = [r["nproc"] for r in items]
        line = ax.plot(
            xs, [r["samples_per_s"] for r in items], marker="o", label=f"{strategy} {precision}"
        )[0]
        ax.plot(
            xs,
            [r["reference_samples_per_s"] for r in items],
            linestyle="--",
            color=line.get_color(),
            alpha=0.6,
        )
        _plot_peers(ax, items, line.get_color())
    ax.set_xticks(sorted({r["nproc"] for r in ok}))
    ax.set(xlabel="ranks", ylabel="samples/s", title=f"{title}\n{_plot_key(rows)}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    throughput = out_dir / "throughput_vs_ranks.png"
    fig.savefig(throughput, dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    labels = [f"{r['strategy']} {r['precision']} x{r['nproc']}" for r in ok]
    width = 0.8 / max((len(r["peak_memory_mb"]) for r in ok), default=1)
    for rank in range(max((len(r["peak_memory_mb"]) for r in ok), default=0)):
        heights = [r["peak_memory_mb"][rank] if rank < len(r["peak_memory_mb"]) else 0 for r in ok]
        ax.bar([i + rank * width for i in range(len(ok))], heights, width, label=f"rank {rank}")
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(ok))], labels, rotation=30, ha="right", fontsize=8
    )
    ax.set(ylabel="peak memory per rank (MB)", title=title)
    ax.legend(fontsize=8)
    memory = out_dir / "memory_per_rank.png"
    fig.savefig(memory, dpi=110)
    plt.close(fig)
    return [throughput, memory]


def _plot_peers(ax: Any, items: list[dict[str, Any]], color: Any) -> None:
    """A dotted line per peer that ran at some rank count of this series."""
    for name in peer_names(items):
        points = [
            (r["nproc"], r["peers"][name]["samples_per_s"])
            for r in items
            if "samples_per_s" in r.get("peers", {}).get(name, {})
        ]
        if points:
            xs, ys = zip(*points, strict=True)
            marker = _PEER_MARKERS.get(name, "x")
            ax.plot(xs, ys, linestyle=":", marker=marker, color=color, alpha=0.8)


def _plot_key(rows: list[dict[str, Any]]) -> str:
    peers = [f"{name} {_PEER_MARKERS.get(name, 'x')}" for name in peer_names(rows)]
    dotted = f"; dotted: {', '.join(peers)}" if peers else ""
    return f"(dashed: hand-written loop{dotted})"
