"""Render benchmark results: a markdown table, ``bench.json`` and PNG plots.

print(markdown_table(rows))
write_json(run_dir / "bench.json", rows, meta)
plot(rows, run_dir)        # throughput_vs_ranks.png, memory_per_rank.png
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paratrain.errors import EnvironmentMismatchError

COLUMNS = (
    "strategy",
    "precision",
    "ranks",
    "samples/s",
    "step p50 ms",
    "step p90 ms",
    "peak mem/rank MB",
    "scaling eff.",
    "reference samples/s",
    "paratrain/reference (95% interval)",
)


def _cells(row: dict[str, Any]) -> list[str]:
    head = [row["strategy"], row["precision"], str(row["nproc"])]
    if "samples_per_s" not in row:
        reason = row.get("skipped") or row.get("error") or "no result"
        return head + [f"skipped: {reason}"] + [""] * (len(COLUMNS) - 4)
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
    return text


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One line per configuration; skipped ones say why."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def write_json(path: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> Path:
    """``{"meta": {...}, "results": [...]}`` (schema in the README)."""
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
    ax.set_xticks(sorted({r["nproc"] for r in ok}))
    ax.set(xlabel="ranks", ylabel="samples/s", title=f"{title}\n(dashed: hand-written loop)")
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
