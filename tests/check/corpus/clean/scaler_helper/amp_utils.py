"""Loss-scaling helper shared by the training scripts of a vision project (timm/DeiT style).

The helper owns the GradScaler; the engine that calls it runs the forward pass under autocast.
This module alone has no autocast, and needs none.
"""

from __future__ import annotations

import torch


class LossScaler:
    """scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters())"""

    def __init__(self) -> None:
        self._scaler = torch.amp.GradScaler("cuda")

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, update_grad=True):
        self._scaler.scale(loss).backward()
        if update_grad:
            if clip_grad is not None:
                self._scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            self._scaler.step(optimizer)
            self._scaler.update()

    def state_dict(self):
        return self._scaler.state_dict()

    def load_state_dict(self, state):
        self._scaler.load_state_dict(state)
