"""Input validation shared by every sampler entry: the block/step layout and the prompt batch
(left padding, per-row positions, [MASK] columns appended). Errors name the argument and come
before any compute."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .attention import padding_positions
from .commit import check_int, check_sampling  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class PreparedBatch:
    """Validated inputs: x (B, P + G) with masks appended, attention mask, positions."""

    x: Tensor
    attention_mask: Optional[Tensor]  # (B, P + G) or None when there is no padding
    positions: Tensor  # (B, P + G)
    prompt_len: int
    mask_id: int


def check_blocks(gen_length: int, block_length: int, steps: int) -> int:
    """Validate the block/step layout; returns steps per block."""
    check_int("gen_length", gen_length)
    check_int("block_length", block_length)
    check_int("steps", steps)
    if gen_length % block_length:
        raise ValueError(f"gen_length={gen_length} must be divisible by block_length={block_length}")
    num_blocks = gen_length // block_length
    if steps % num_blocks:
        raise ValueError(f"steps={steps} must be a positive multiple of the number of blocks ({num_blocks})")
    return steps // num_blocks


def prepare_batch(model, input_ids: Tensor, attention_mask: Optional[Tensor], gen_length: int,
                  mask_id: Optional[int]) -> PreparedBatch:
    """Validate a (left-padded) prompt batch and append ``gen_length`` mask columns."""
    cfg = model.config
    mask_id = cfg.mask_token_id if mask_id is None else mask_id
    check_int("mask_id", mask_id, 0)
    if mask_id >= cfg.vocab_size:
        raise ValueError(f"mask_id={mask_id} is outside the model's vocabulary [0, {cfg.vocab_size})")
    if not isinstance(input_ids, Tensor) or input_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise TypeError("input_ids must be an integer torch.Tensor of shape (B, P)")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, P), got shape {tuple(input_ids.shape)}")
    B, P = input_ids.shape
    if B == 0 or P == 0:
        raise ValueError("input_ids: empty prompt (need at least one prompt token per row)")
    if P + gen_length > cfg.max_seq_len:
        raise ValueError(f"prompt length {P} + gen_length {gen_length} exceeds the model's "
                         f"max_seq_len={cfg.max_seq_len}")
    bad = (input_ids < 0) | (input_ids >= cfg.vocab_size)  # (B, P), padding columns included
    if bool(bad.any()):
        r, c = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"input_ids[{r}, {c}] = {int(input_ids[r, c])} is outside the model's vocabulary "
                         f"[0, {cfg.vocab_size}) (padding columns too: pad with a real id)")
    device = input_ids.device
    if attention_mask is not None:
        if not isinstance(attention_mask, Tensor) or attention_mask.shape != input_ids.shape:
            got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise ValueError(f"attention_mask must have the shape of input_ids {(B, P)}, got {got}")
        if attention_mask.is_floating_point() or bool(((attention_mask != 0) & (attention_mask != 1)).any()):
            raise ValueError("attention_mask must be bool or integer 0/1 (1 = real token), got "
                             f"{attention_mask.dtype} with values {sorted(set(attention_mask.flatten().tolist()))[:5]}")
        attention_mask = attention_mask.to(device=device, dtype=torch.long)
        if bool((attention_mask[:, 1:] < attention_mask[:, :-1]).any()):
            raise ValueError("attention_mask must be left padding: each row 0s (padding) then 1s (the prompt)")
        if bool((attention_mask.sum(-1) == 0).any()):
            raise ValueError("attention_mask: a row has no real prompt token (empty prompt)")
        real = attention_mask.bool()
    else:
        real = torch.ones_like(input_ids, dtype=torch.bool)
    if bool(((input_ids == mask_id) & real).any()):
        raise ValueError(f"input_ids contains the mask id {mask_id} in the prompt")
    x = torch.full((B, P + gen_length), mask_id, dtype=torch.long, device=device)
    x[:, :P] = input_ids
    if attention_mask is not None and bool((attention_mask == 0).any()):
        full = torch.cat([attention_mask, attention_mask.new_ones(B, gen_length)], dim=1)
        positions = padding_positions(full)
    else:
        full = None
        positions = torch.arange(P + gen_length, device=device).expand(B, -1)
    return PreparedBatch(x, full, positions, P, mask_id)
