"""Per-step randomness of :func:`dlm.train.train`: every (seed, step, stream) has its own generator,
so a resumed run needs only the step counter to draw what an uninterrupted run would."""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def derive_seed(*parts: int) -> int:
    """Deterministic 63-bit seed from integers (FNV-1a style mixing)."""
    h = 0xCBF29CE484222325
    for part in parts:
        h = ((h ^ (part & _MASK64)) * 0x100000001B3) & _MASK64
        h ^= h >> 31
    return h & ((1 << 63) - 1)


def step_generator(seed: int, step: int, stream: int, device: torch.device) -> torch.Generator:
    """Generator for one (step, stream): stream 0 = data, 1 = noise, 2 + k = micro-batch k."""
    return torch.Generator(device=device).manual_seed(derive_seed(seed, step, stream))
