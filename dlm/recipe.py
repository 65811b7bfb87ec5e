"""The training recipe of :func:`dlm.train.train` apart from its loop: the learning-rate schedule,
AdamW's parameter groups (``config`` is a :class:`dlm.train.TrainConfig`) and the per-step
randomness (every (seed, step, stream) has its own generator, so a resumed run needs only the step
counter to draw what an uninterrupted run would)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

def lr_at(step: int, config) -> float:
    """Learning rate of optimizer update ``step`` (0-based): linear warm-up to ``lr`` over
    ``warmup_steps`` updates, then cosine decay to ``lr * min_lr_ratio`` at ``max_steps``
    (SGDR, Loshchilov & Hutter 2017, eq. 5 without restarts)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, config.max_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    min_lr = config.lr * config.min_lr_ratio
    return min_lr + 0.5 * (config.lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay matrices; no decay on norms, biases (ndim < 2) and embeddings."""
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or id(p) in embedding_ids else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


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
