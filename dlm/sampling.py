"""LLaDA-style baseline sampler (Nie et al. 2025, Alg. 2 "low-confidence remasking").

The answer is allocated as ``gen_length`` [MASK] columns after the prompt. Optionally it is split
into semi-autoregressive blocks of ``block_length``; ``steps`` are split evenly over blocks. Each
step runs one forward over prompt + whole answer (bidirectional; no cache is possible), proposes
a token per masked column, and commits ``num_transfer_tokens`` of them inside the current block:
the most confident (``low_confidence``) or uniformly random ones (``random``). Semantics follow
LLaDA's reference ``generate.py``; batching uses left padding with per-row positions so a row's
output does not depend on its neighbours.

This module holds the cache policy "none" (:class:`FullSequence`, with LLaDA's classifier-free
guidance) and :func:`generate`, the LLaDA entry over the one loop :func:`dlm.sample.denoise`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .commit import Proposal, TopK, check_int, check_real, check_sampling  # noqa: F401  (re-exported)
from .sample import GenerateOutput, Run, StepView, denoise, stop_ids  # noqa: F401  (re-exported)
from .validate import PreparedBatch, check_blocks, prepare_batch  # noqa: F401  (re-exported)

eos_ids = stop_ids  # the name callers used before the one loop


@dataclass(frozen=True)
class FullSequence:
    """Cache policy "none": every step recomputes prompt + whole answer, bidirectional with the
    key-padding mask; nothing is cached. ``cfg_scale > 0``: LLaDA's classifier-free guidance
    (Nie et al. 2025, app. B.6), ``uncond + (s + 1)(cond - uncond)`` with the unconditional
    branch's prompt masked, in one doubled batch."""

    cfg_scale: float = 0.0
    name = "none"

    def __post_init__(self) -> None:
        check_real("cfg_scale", self.cfg_scale, 0.0, low_open=False)

    def start(self, run: Run) -> None:
        pass

    def block_done(self, run: Run, lo: int, hi: int, last: bool) -> None:
        pass

    def logits(self, run: Run, lo: int, hi: int, i: int) -> Tensor:
        x, T = run.x, run.x.shape[1]
        run.refreshed = True
        if self.cfg_scale <= 0:
            return run.forward(0, T, run.key_padding, slice(lo, hi))  # (B, L, V)
        prompt = torch.arange(T, device=x.device)[None] < run.prompt_len  # (1, T)
        uncond = torch.where(prompt, torch.full_like(x, run.mask_id), x)
        attn = None if run.key_padding is None else torch.cat([run.key_padding, run.key_padding])
        logits = run.forward(0, T, attn, slice(lo, hi), inputs=torch.cat([x, uncond]),
                             positions=torch.cat([run.positions, run.positions]), copies=2)
        cond, free = logits.chunk(2)  # (B, L, V) each
        return free + (self.cfg_scale + 1) * (cond - free)


def blocks_after(prompt_len: int, gen_length: int, block_length: int) -> tuple[tuple[int, int], ...]:
    """Absolute columns ``(lo, hi)`` of the answer's blocks after a prompt of ``prompt_len``."""
    return tuple((prompt_len + lo, prompt_len + lo + block_length) for lo in range(0, gen_length, block_length))


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
    callback=None,
) -> GenerateOutput:
    """LLaDA baseline: full-sequence (block_length == gen_length) or semi-AR blocks.

    logits_eos_inf: never propose EOS/EoT. confidence_eos_eot_inf: EOS/EoT proposals get the
    lowest confidence (committed only when nothing else is left), as LLaDA's option of that name.
    Randomness (Gumbel noise, random remasking) comes only from ``generator``.
    callback(view): a :class:`dlm.sample.StepView` after every step (observation only).
    """
    steps_per_block = check_blocks(gen_length, block_length, steps)
    check_sampling(temperature, remasking, cfg_scale)
    batch = prepare_batch(model, input_ids, attention_mask, gen_length, mask_id)
    proposal = Proposal(temperature, remasking, suppress_eos=logits_eos_inf, eos_last=confidence_eos_eot_inf)
    return denoise(model, batch, blocks_after(batch.prompt_len, gen_length, block_length),
                   FullSequence(cfg_scale), TopK(steps_per_block), proposal, generator=generator,
                   backend=backend, callback=callback)
