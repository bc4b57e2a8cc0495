"""``paratrain ckpt inspect|verify|convert|diff``: understand, check and convert checkpoints.

paratrain ckpt inspect runs/exp/checkpoints/step-00000300
paratrain ckpt verify runs/exp/checkpoints          # exit 1 when nothing valid is there
paratrain ckpt convert old_dp.pth model.safetensors --to safetensors
paratrain ckpt diff a.pt b.safetensors              # exit 1 when they differ
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

FORMATS = ("pt", "safetensors", "dcp")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paratrain ckpt`` and its four actions."""
    ckpt = subparsers.add_parser(
        "ckpt",
        help="inspect, verify, convert and diff checkpoints",
        description=__doc__.split("\n")[0],
    )
    actions = ckpt.add_subparsers(title="actions", metavar="ACTION", required=True)
    p = actions.add_parser("inspect", help="format, tensors, prefixes, saved run, resume state")
    p.add_argument("path", type=Path)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--trust", action="store_true", help="allow pickled code (trusted files)")
    p.set_defaults(handler=_inspect)
    p = actions.add_parser("verify", help="check checksums / read everything; exit 1 if bad")
    p.add_argument("path", type=Path)
    p.set_defaults(handler=_verify)
    p = actions.add_parser("convert", help="rewrite as pt, safetensors or dcp, prefixes removed")
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--to", required=True, choices=FORMATS)
    p.add_argument("--trust", action="store_true", help="allow pickled code (trusted files)")
    p.set_defaults(handler=_convert)
    p = actions.add_parser("diff", help="compare two checkpoints' tensors; exit 1 if different")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--trust", action="store_true", help="allow pickled code (trusted files)")
    p.set_defaults(handler=_diff)


def _print(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(data, indent=2))
        return
    for key, value in data.items():
        if isinstance(value, dict) and value:
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k}: {v}")
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            print(f"{key}:")
            for item in value:
                print("  " + ", ".join(f"{k}={v}" for k, v in item.items()))
        else:
            print(f"{key}: {value}")


def _inspect(args: argparse.Namespace) -> int:
    from paratrain.checkpoint import inspection

    _print(inspection.inspect(args.path, trust=args.trust), args.json)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from paratrain.checkpoint import inspection

    ok, lines = inspection.verify(args.path)
    for line in lines:
        print(line)
    if not ok:
        print(f"FAILED: {args.path} is not intact; resume would skip it.")
    return 0 if ok else 1


def _convert(args: argparse.Namespace) -> int:
    from paratrain.checkpoint import inspection

    result = inspection.convert(args.src, args.dst, to=args.to, trust=args.trust)
    print(
        f"wrote {result['path']} ({result['to']}, {result['tensors']} tensors, from "
        f"{result['from']}; {result['stripped']} keys lost a wrapper prefix)"
    )
    return 0


def _diff(args: argparse.Namespace) -> int:
    from paratrain.checkpoint import inspection

    result = inspection.diff(args.a, args.b, trust=args.trust)
    _print(result, args.json)
    return 0 if result["identical"] else 1
