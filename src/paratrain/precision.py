"""Mixed precision: autocast for the forward pass, dynamic loss scaling for fp16.

    prec = Precision("fp16", torch.device("cpu"))
    with prec.autocast():
        loss = model(x).sum()
    prec.scale(loss).backward()
    prec.unscale_(optimizer)          # before clipping
    prec.step(optimizer)              # skipped by the scaler when gradients overflowed
    prec.scaler.state_dict()          # goes into checkpoints

``bf16`` needs no scaler. Whether the device supports a dtype is checked once, up front, by running
a tiny autocast matmul: an unsupported combination is an error that names the alternative, never a
silent fall back to fp32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from paratrain.errors import EnvironmentMismatchError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """Autocast context and (for fp16) a GradScaler for one device."""

    def __init__(self, name: str, device: torch.device) -> None:
        self.name = name
        self.device = device
        self.dtype = _DTYPES.get(name)
        if self.dtype is not None:
            _check_supported(name, self.dtype, device)
        self.scaler: torch.amp.GradScaler | None = (
            torch.amp.GradScaler(device.type) if name == "fp16" else None
        )

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Run the enclosed forward pass in the low-precision dtype (no-op for fp32)."""
        if self.dtype is None:
            yield
            return
        with torch.autocast(device_type=self.device.type, dtype=self.dtype):
            yield

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """Multiply ``loss`` by the current loss scale (fp16) before backward."""
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the loss scale in place, so clipping sees true values."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step the optimizer (skipped on fp16 overflow); return whether it stepped."""
        if self.scaler is None:
            optimizer.step()
            return True
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        # The scaler lowers its scale exactly when it skipped the step for inf/nan gradients.
        return self.scaler.get_scale() >= before


def _check_supported(name: str, dtype: torch.dtype, device: torch.device) -> None:
    hint = "Use precision='fp32'" + (", or 'bf16'" if name == "fp16" else "")
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise EnvironmentMismatchError(
            f"precision='bf16' needs a GPU with bfloat16 support (compute capability >= 8.0); "
            f"{torch.cuda.get_device_name(device)} has none. Use precision='fp16' or 'fp32'."
        )
    try:
        with torch.autocast(device_type=device.type, dtype=dtype):
            probe = torch.ones(2, 2, device=device) @ torch.ones(2, 2, device=device)
    except (RuntimeError, ValueError, TypeError) as err:
        raise EnvironmentMismatchError(
            f"precision={name!r} is not supported on {device.type} by torch {torch.__version__}: "
            f"{err}. {hint}."
        ) from err
    if probe.dtype != dtype:
        raise EnvironmentMismatchError(
            f"precision={name!r}: torch {torch.__version__} autocast on {device.type} does not "
            f"compute in {dtype} (got {probe.dtype}). {hint}."
        )
