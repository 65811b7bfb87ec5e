"""LLaDA-style baseline sampler (Nie et al. 2025, Alg. 2 "low-confidence remasking").

The answer is allocated as ``gen_length`` [MASK] columns after the prompt. Optionally it is split
into semi-autoregressive blocks of ``block_length``; ``steps`` are split evenly over blocks. Each
step runs one forward over prompt + whole answer (bidirectional; no cache is possible), proposes
a token per masked column, and commits ``num_transfer_tokens`` of them inside the current block:
the most confident (``low_confidence``) or uniformly random ones (``random``). Semantics follow
LLaDA's reference ``generate.py``; batching uses left padding with per-row positions so a row's
output does not depend on its neighbours.

This module registers the LLaDA baseline: the commit rule ``topk`` (:class:`TopK`), the cache
policy ``none`` (:class:`FullSequence`, with LLaDA's classifier-free guidance) and the family
``llada``; :func:`generate` is the paper's entry (its argument names) over the one loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from .commit import CommitRule, check_int, num_transfer_tokens, select_topk
from .policy import CachePolicy
from .registry import param, register
from .sample import GenerateOutput, Run
from .spec import Family, Sampler
from .spec import generate as run_sampler


@register("rule", "topk")
@dataclass(frozen=True)
class TopK(CommitRule):
    """LLaDA's low-confidence remasking (Alg. 2): ``steps`` per block, ``num_transfer_tokens`` most
    confident per step."""

    steps: int = field(metadata=param("", derived="steps_per_block"))

    def __post_init__(self) -> None:
        check_int("steps", self.steps)

    def block_steps(self, width: int) -> int:
        return self.steps

    def begin(self, eligible: Tensor, n_steps: Optional[int], span: Optional[tuple] = None) -> Tensor:
        return num_transfer_tokens(eligible.sum(-1), n_steps)  # (B, steps)

    def select(self, conf, eligible, i, state, generator):
        return select_topk(conf, eligible, state[:, i]), state




@register("policy", "none")
@dataclass(frozen=True)
class FullSequence(CachePolicy):
    """Cache policy "none": every step recomputes prompt + whole answer, bidirectional with the
    key-padding mask; nothing is cached. ``cfg_scale > 0``: LLaDA's classifier-free guidance
    (Nie et al. 2025, app. B.6), ``uncond + (s + 1)(cond - uncond)`` with the unconditional
    branch's prompt masked, in one doubled batch."""

    cfg_scale: float = field(default=0.0, metadata=param("classifier-free guidance scale (LLaDA)", min=0.0))

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


@register("family", "llada")
@dataclass(frozen=True)
class LLaDAFamily(Family):
    """LLaDA-style models (and the block-diffusion and AR ones): every rule as registered, with
    LLaDA's proposal unless the rule names its own."""


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
    timed: bool = False,
) -> GenerateOutput:
    """LLaDA baseline: full-sequence (block_length == gen_length) or semi-AR blocks; a thin preset
    with the paper's argument names over :func:`dlm.spec.generate` (policy ``none``, rule ``topk``,
    family ``llada``).

    logits_eos_inf: never propose EOS/EoT. confidence_eos_eot_inf: EOS/EoT proposals get the
    lowest confidence (committed only when nothing else is left), as LLaDA's option of that name.
    Randomness (Gumbel noise, random remasking) comes only from ``generator``.
    callback(view): a :class:`dlm.sample.StepView` after every step (observation only).
    """
    sampler = Sampler.of("llada", family="llada", gen_length=gen_length, block_length=block_length, steps=steps,
                         temperature=temperature, remasking=remasking, cfg_scale=cfg_scale,
                         suppress_eos=logits_eos_inf, eos_last=confidence_eos_eot_inf)
    return run_sampler(model, input_ids, attention_mask, sampler, generator=generator, callback=callback,
                       backend=backend, mask_id=mask_id, timed=timed)
