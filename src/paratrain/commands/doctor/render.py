"""Show a doctor report: a rich table with a summary line, JSON, or a block to paste."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from paratrain.commands.tables import table_console

STYLE = {"OK": "green", "WARN": "yellow", "FAIL": "bold red", "INFO": "cyan"}


def summary(report: dict[str, Any]) -> str:
    """``"2 FAIL, 1 WARN, 7 OK"`` (INFO measurements have no verdict and are not counted)."""
    statuses = [c["status"] for c in report["checks"]] + [
        m["status"] for m in report["measurements"]
    ]
    return ", ".join(f"{statuses.count(s)} {s}" for s in ("FAIL", "WARN", "OK"))


def as_json(report: dict[str, Any]) -> str:
    """The whole report as JSON."""
    return json.dumps(report, indent=2, default=str)


def paste_block(report: dict[str, Any]) -> str:
    """A compact markdown block for bug reports."""
    f = report["facts"]
    t = f["torch"]
    torch_line = t.get("error") or f"{t['version']} (CUDA {t['cuda_build'] or 'none'})"
    gpus = ", ".join(f"{g['name']} (cc {g['capability']})" for g in t.get("gpus", [])) or "none"
    lines = [
        "```",
        f"paratrain doctor: {summary(report)}",
        f"python {f['python']}, {f['platform']}",
        f"torch {torch_line}",
        f"gpus: {gpus}",
        f"driver: {(f['nvidia_smi'] or {}).get('driver') or 'none'}",
    ]
    lines += [
        f"{c['status']}: {c['name']}: {c['detail']}"
        for c in report["checks"]
        if c["status"] != "OK"
    ]
    return "\n".join([*lines, "```"])


def _build(t: dict[str, Any]) -> str:
    return f"CUDA {t['cuda_build']}" if t.get("cuda_build") else "CPU-only build"


def show(report: dict[str, Any], console: Console | None = None) -> None:
    """Print the report as tables."""
    console = console or table_console()
    f, t = report["facts"], report["facts"]["torch"]
    env = Table(title="environment", show_header=False)
    rows = [
        ("python", f["python"]),
        ("platform", f["platform"]),
        (
            "torch",
            t.get("error") or f"{t['version']} ({_build(t)})",
        ),
        ("cuDNN / NCCL", f"{t.get('cudnn')} / {t.get('nccl')}"),
        ("driver", str((f["nvidia_smi"] or {}).get("driver"))),
        ("CPU cores / RAM", f"{f['cpu_cores']} / {f['memory_gb'] or 0:.1f} GiB"),
        ("/dev/shm", f"{f['shm_gb'] or 0:.2f} GiB"),
        ("backends", ", ".join(k for k, v in t.get("backends", {}).items() if v)),
    ]
    for gpu in t.get("gpus", []):
        bw = f", {gpu['memory_bandwidth_gbs']:.0f} GB/s" if "memory_bandwidth_gbs" in gpu else ""
        rows.append(
            (
                f"cuda:{gpu['index']}",
                f"{gpu['name']}, cc {gpu['capability']}, "
                f"{gpu['memory_free_gb']:.1f}/{gpu['memory_total_gb']:.1f} GiB free{bw}",
            )
        )
    if t.get("p2p"):
        rows.append(
            ("P2P access", " ".join("".join("x" if v else "." for v in r) for r in t["p2p"]))
        )
    rows += [(k, v) for k, v in f["env"].items()]
    for key, value in rows:
        env.add_row(key, str(value))
    console.print(env)
    checks = Table(title="checks")
    for col in ("check", "status", "detail", "fix"):
        checks.add_column(col)
    for c in report["checks"]:
        checks.add_row(c["name"], f"[{STYLE[c['status']]}]{c['status']}", c["detail"], c["fix"])
    console.print(checks)
    if report["measurements"]:
        meas = Table(title="measured")
        for col in ("measurement", "value", "expected", "verdict"):
            meas.add_column(col)
        for m in report["measurements"]:
            meas.add_row(
                m["name"],
                f"{m['value']} {m['unit']}" if m["value"] is not None else "-",
                m.get("detail") or m["expected"],
                f"[{STYLE[m['status']]}]{m['status']}",
            )
        console.print(meas)
    console.print(f"[bold]paratrain doctor: {summary(report)}")
    console.print(
        "\npaste this into your issue:\n" + paste_block(report), highlight=False, markup=False
    )
