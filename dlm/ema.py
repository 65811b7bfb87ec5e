"""Exponential moving average of parameters (Polyak averaging).

After every optimizer step ``ema <- decay * ema + (1 - decay) * param``. Shadows are kept in
float32 regardless of the parameter dtype. :meth:`EMA.applied_to` temporarily swaps the shadows
into the model (for evaluation and checkpointing) and restores the raw weights afterwards.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn as nn
from torch import Tensor


class EMA:
    """Float32 shadow copy of ``model``'s parameters, keyed by parameter name."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be a float in [0, 1), got {decay!r}")
        self.decay = float(decay)
        self.shadow: dict[str, Tensor] = {
            name: p.detach().to(torch.float32, copy=True) for name, p in model.named_parameters()
        }

    def _params(self, model: nn.Module) -> dict[str, Tensor]:
        params = dict(model.named_parameters())
        if params.keys() != self.shadow.keys():
            raise ValueError("model parameters do not match the EMA shadow names")
        return params

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """``ema = decay * ema + (1 - decay) * param`` for every parameter."""
        for name, p in self._params(model).items():
            self.shadow[name].lerp_(p.detach().to(torch.float32), 1.0 - self.decay)

    @contextmanager
    def applied_to(self, model: nn.Module) -> Iterator[nn.Module]:
        """Load the EMA weights into ``model`` for the duration of the block."""
        params = self._params(model)
        backup = {name: p.detach().clone() for name, p in params.items()}
        try:
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(self.shadow[name])
            yield model
        finally:
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(backup[name])

    def state_dict(self) -> dict:
        return {"decay": self.decay, "shadow": dict(self.shadow)}

    def load_state_dict(self, state: dict) -> None:
        if state["shadow"].keys() != self.shadow.keys():
            raise ValueError("EMA state does not match the model's parameter names")
        self.decay = float(state["decay"])
        for name, value in state["shadow"].items():
            self.shadow[name].copy_(value)
