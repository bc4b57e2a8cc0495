"""Mixed precision: autocast for the forward pass, dynamic loss scaling for fp16.

    prec = Precision("fp16", torch.device("cpu"))
    with prec.autocast():
        loss = model(x).sum()
    prec.scale(loss).backward()
    prec.unscale_(optimizer)          # before clipping
    prec.step(optimizer)              # skipped by the scaler when gradients overflowed
    prec.state_dict()                 # goes into checkpoints

With several optimizers the scale is updated once per round of steps, as in torch's AMP recipe
(``scaler.step(opt1); scaler.step(opt2); scaler.update()``): the update waits until every
optimizer that takes part has stepped, or until one steps a second time.

``bf16`` needs no scaler. Whether the device supports a dtype is checked once, up front, by running
a tiny autocast matmul: an unsupported combination is an error that names the alternative, never a
silent fall back to fp32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.amp.grad_scaler import OptState

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
        self.optimizers: set[int] = set()
        """ids of the optimizers that take part in a round (registered by the run)."""
        self._round: set[int] = set()

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
        """Divide the gradients by the loss scale in place, so clipping sees true values
        (once per round: a second call before the optimizer steps does nothing)."""
        if self.scaler is None:
            return
        self._begin(optimizer)
        state = self.scaler._per_optimizer_states[id(optimizer)]
        if state["stage"] is not OptState.UNSCALED:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step the optimizer (skipped on fp16 overflow); return whether it stepped."""
        if self.scaler is None:
            optimizer.step()
            return True
        self._begin(optimizer)
        self.scaler.step(optimizer)
        found = self.scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        stepped = not any(float(v) for v in found.values())
        self._round.add(id(optimizer))
        if self._round >= self.optimizers:
            self._update()
        return stepped

    def _begin(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) in self._round:  # a new round began: finish the last one first
            self._update()

    def _update(self) -> None:
        assert self.scaler is not None
        self.scaler.update()
        self._round = set()

    def state_dict(self) -> dict[str, object] | None:
        """The loss scaler's state (None without a scaler)."""
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, state: dict[str, object] | None) -> None:
        """Restore :meth:`state_dict` (ignored without a scaler or without state)."""
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


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
