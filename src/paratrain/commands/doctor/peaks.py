"""Datasheet peak matmul throughput of the GPUs paratrain knows, looked up by device name.

    peak = bf16_peak("NVIDIA H100 80GB HBM3", (9, 0))   # Peak(name="H100 SXM", tflops=989.0)
    bf16_peak("Quadro P1000", (6, 1))                    # None: unknown GPU, no verdict

Dense bf16 tensor-core TFLOP/s without sparsity, from the vendor datasheets. ``paratrain doctor``
judges its matmul against it and ``paratrain bench`` divides by it for model FLOP utilisation.
Names are matched most specific first ("H100 PCIe" before "H100"); the compute capability must
agree, so a renamed or unlisted card is reported as unknown rather than judged against a wrong
peak.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Peak:
    """A known GPU's datasheet peak."""

    name: str
    """Short name of the product, e.g. ``"H100 SXM"``."""
    tflops: float
    """Dense bf16 tensor-core TFLOP/s."""


# (substring of torch.cuda.get_device_name, compute capability, product, dense bf16 TFLOP/s)
_KNOWN: tuple[tuple[str, tuple[int, int], str, float], ...] = (
    ("B200", (10, 0), "B200", 2250.0),
    ("GH200", (9, 0), "GH200", 989.0),
    ("H200", (9, 0), "H200", 989.0),
    ("H100 PCIe", (9, 0), "H100 PCIe", 756.0),
    ("H100 NVL", (9, 0), "H100 NVL", 835.0),
    ("H100", (9, 0), "H100 SXM", 989.0),
    ("A100", (8, 0), "A100", 312.0),
    ("A800", (8, 0), "A800", 312.0),
    ("L40S", (8, 9), "L40S", 362.0),
    ("L40", (8, 9), "L40", 181.0),
    ("L4", (8, 9), "L4", 121.0),
    ("A40", (8, 6), "A40", 150.0),
    ("A10G", (8, 6), "A10G", 125.0),
    ("A10", (8, 6), "A10", 125.0),
)


def bf16_peak(device_name: str, capability: tuple[int, int]) -> Peak | None:
    """The datasheet peak of this GPU, or None when paratrain does not know it."""
    for needle, cc, product, tflops in _KNOWN:
        if needle in device_name and cc == capability:
            return Peak(product, tflops)
    return None
