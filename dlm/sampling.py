"""LLaDA-style baseline sampler (Nie et al. 2025, Alg. 2 "low-confidence remasking").

The answer is allocated as ``gen_length`` [MASK] columns after the prompt. Optionally it is split
into semi-autoregressive blocks of ``block_length``; ``steps`` are split evenly over blocks. Each
step runs one forward over prompt + whole answer (bidirectional; no cache is possible), proposes
a token per masked column, and commits ``num_transfer_tokens`` of them inside the current block:
the most confident (``low_confidence``) or uniformly random ones (``random``). Semantics follow
LLaDA's reference ``generate.py``; batching uses left padding with per-row positions so a row's
output does not depend on its neighbours.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .attention import key_padding_mask, padding_positions
from .commit import REMASKING, num_transfer_tokens, propose, select_topk
from .stats import ForwardTimer, SampleStats, tokens_until_eos


@dataclass
class GenerateOutput:
    """sequences: (B, P + gen_length) prompt included; commit_step: (B, gen_length) the
    denoising step that committed each answer column (-1 if never)."""

    sequences: Tensor
    stats: SampleStats
    commit_step: Tensor


@dataclass(frozen=True)
class PreparedBatch:
    """Validated inputs: x (B, P + G) with masks appended, attention mask, positions."""

    x: Tensor
    attention_mask: Optional[Tensor]  # (B, P + G) or None when there is no padding
    positions: Tensor  # (B, P + G)
    prompt_len: int
    mask_id: int


def check_int(name: str, value, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


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
    device = input_ids.device
    if attention_mask is not None:
        if not isinstance(attention_mask, Tensor) or attention_mask.shape != input_ids.shape:
            got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise ValueError(f"attention_mask must have the shape of input_ids {(B, P)}, got {got}")
        attention_mask = attention_mask.to(device=device, dtype=torch.long)
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


def check_sampling(temperature: float, remasking: str, cfg_scale: float = 0.0) -> None:
    if remasking not in REMASKING:
        raise ValueError(f"unknown remasking {remasking!r}; expected one of {REMASKING}")
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if not isinstance(cfg_scale, (int, float)) or cfg_scale < 0:
        raise ValueError(f"cfg_scale must be a number >= 0, got {cfg_scale!r}")


def eos_ids(model) -> tuple[int, ...]:
    cfg = model.config
    return tuple(i for i in (cfg.eos_token_id, cfg.eot_token_id) if i is not None)


@torch.no_grad()
def generate(
    model,
    input_ids: Tensor,
    attention_mask: Optional[Tensor] = None,
    gen_length: int = 128,
    steps: int = 128,
    block_length: int = 128,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    cfg_scale: float = 0.0,
    mask_id: Optional[int] = None,
    logits_eos_inf: bool = False,
    confidence_eos_eot_inf: bool = False,
    generator: Optional[torch.Generator] = None,
    backend: str = "sdpa",
) -> GenerateOutput:
    """LLaDA baseline: full-sequence (block_length == gen_length) or semi-AR blocks.

    logits_eos_inf: never propose EOS/EoT. confidence_eos_eot_inf: EOS/EoT proposals get the
    lowest confidence (committed only when nothing else is left), as LLaDA's option of that name.
    Randomness (Gumbel noise, random remasking) comes only from ``generator``.
    """
    steps_per_block = check_blocks(gen_length, block_length, steps)
    check_sampling(temperature, remasking, cfg_scale)
    batch = prepare_batch(model, input_ids, attention_mask, gen_length, mask_id)
    t_start = time.perf_counter()
    stats = SampleStats()
    timer = ForwardTimer(stats, batch.x.device)
    x, P, mid = batch.x, batch.prompt_len, batch.mask_id
    B, T = x.shape
    attn = key_padding_mask(batch.attention_mask)
    positions = batch.positions
    prompt_cols = torch.arange(T, device=x.device) < P  # (T,)
    if cfg_scale > 0:
        attn = None if attn is None else torch.cat([attn, attn])
        positions = torch.cat([positions, positions])
    stop_ids = eos_ids(model)
    stop_t = torch.tensor(stop_ids, dtype=torch.long, device=x.device)
    exclude = (mid,) + (stop_ids if logits_eos_inf else ())  # never proposed
    commit_step = torch.full((B, gen_length), -1, dtype=torch.long, device=x.device)
    first_eos = torch.full((B,), -1, dtype=torch.long, device=x.device)
    step = 0
    for b in range(gen_length // block_length):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        k_sched = num_transfer_tokens((x[:, lo:hi] == mid).sum(-1), steps_per_block)  # (B, spb)
        for i in range(steps_per_block):
            masked = x == mid  # (B, T)
            inp = x
            if cfg_scale > 0:
                uncond = torch.where(prompt_cols[None], torch.full_like(x, mid), x)
                inp = torch.cat([x, uncond])
            with timer(inp.shape[1]):
                logits = model(inp, positions=positions, attn_mask=attn, backend=backend,
                               logits_slice=slice(lo, hi))  # (B or 2B, L, V)
            if cfg_scale > 0:
                cond, uncond_logits = logits.chunk(2)
                logits = uncond_logits + (cfg_scale + 1) * (cond - uncond_logits)
            x0, conf = propose(logits, temperature, remasking, generator, exclude)  # (B, L)
            if confidence_eos_eot_inf and stop_ids:
                is_stop = torch.isin(x0, stop_t)
                conf = torch.where(is_stop, torch.full_like(conf, float("-inf")), conf)
            eligible = masked[:, lo:hi]
            commit = select_topk(conf, eligible, k_sched[:, i])  # (B, L)
            x[:, lo:hi] = torch.where(commit, x0, x[:, lo:hi])
            commit_step[:, lo - P:hi - P] = torch.where(commit, step, commit_step[:, lo - P:hi - P])
            if stop_ids:
                hit = (commit & torch.isin(x0, stop_t)).any(-1)
                first_eos = torch.where(hit & (first_eos < 0), step, first_eos)
            step += 1
    stats.steps = step
    stats.tokens_committed = gen_length  # per row
    stats.tokens_until_eos = tokens_until_eos(x[:, P:], model.config.eos_token_id)
    stats.first_eos_step = first_eos
    stats.seconds = time.perf_counter() - t_start
    return GenerateOutput(x, stats, commit_step)
