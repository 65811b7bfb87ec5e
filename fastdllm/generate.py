"""Fast-dLLM sampling: block-wise KV caching + confidence-aware parallel decoding.

Wu et al. 2025, "Fast-dLLM: Training-free Acceleration of Diffusion LLM by Enabling KV Cache and
Parallel Decoding" (the reference ``generate_with_prefix_cache`` / ``generate_with_dual_cache``
before its torch.compile rewrite), as the one loop :func:`dlm.sample.denoise` with

- a registered cache policy (``None``: recompute everything, LLaDA's cost; prefix / dual of
  :mod:`fastdllm.policies`, or any other by name);
- a commit rule: LLaDA's top-k schedule (``steps`` split evenly over the blocks), the threshold
  rule (Thm. 1 / eq. 5) or the factor rule (eq. 6) of :mod:`fastdllm.rules`; the parallel rules
  run until the block has no [MASK] left.

This entry keeps the paper's argument names: a thin preset over :func:`dlm.spec.generate`. With
``cache=None`` and no rule it is exactly :func:`dlm.llada.generate`. No sampler ever
proposes [MASK] (its logit is set to -inf), so every step commits at least one real token in each
row whose block is unfinished and a parallel-decoded block takes at most ``block_length`` steps
(the reference loops forever if a model proposes [MASK]; trained models never do).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from dlm.sample import Callback, GenerateOutput
from dlm.spec import Sampler, resolve_family
from dlm.spec import generate as run_sampler


def generate(
    model,
    input_ids: Tensor,
    attention_mask: Optional[Tensor] = None,
    gen_length: int = 128,
    block_length: int = 32,
    steps: Optional[int] = None,
    cache: Optional[str] = None,
    threshold: Optional[float] = None,
    factor: Optional[float] = None,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    stop_at_eos: bool = False,
    refresh_every: Optional[int] = None,
    mask_id: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    backend: str = "sdpa",
    callback: Optional[Callback] = None,
    rules: str = "auto",
    top_p: Optional[float] = None,
    top_k: Optional[int] = None,
    eps: Optional[float] = None,
    alg_temp: Optional[float] = None,
    delay: Optional[int] = None,
    tolerance: Optional[float] = None,
    every_block: bool = True,
    timed: bool = False,
) -> GenerateOutput:
    """Fast-dLLM generation for a (left-padded) prompt batch ``input_ids`` (B, P).

    cache: ``None`` | ``"prefix"`` | ``"dual"`` (Fast-dLLM Sec. 3.2) | ``"delayed"`` (dKV-Cache,
    :mod:`fastdllm.delayed`, ``delay``) | ``"adaptive"`` (drift-refreshed dual,
    :mod:`fastdllm.adaptive`, ``tolerance``, ``every_block``); refresh_every: also redo the full
    committing forward every k-th step of a block. threshold (in (0, 1]) / factor (> 0):
    confidence-aware parallel decoding (eq. 5 / eq. 6); otherwise ``steps`` (default
    ``gen_length``) are split evenly over the blocks as LLaDA's linear top-k schedule.
    stop_at_eos: a row whose answer holds ``config.eos_token_id`` after a block commits nothing
    more; the remaining blocks are skipped once every row has one; everything after a row's
    first EOS is EOS (the run-to-the-end output truncated the same way).

    rules: ``"auto"`` (default: Fast-dLLM's Dream rules for Dream-family models, i.e. with
    ``config.shift_logits``, its LLaDA rules otherwise), ``"dream"`` or ``"llada"``
    (:mod:`fastdllm.dream`). Under the Dream rules a block's full step commits its first column,
    cached windows start at the block, the scheduled mode is Dream's negative-entropy timestep
    schedule (``eps``, default 1e-3; ``alg_temp``) and proposals follow Dream's ``sample_tokens``
    (``temperature``, ``top_p``, ``top_k``); ``remasking`` is a LLaDA-rules option.

    callback(view): called after every step with a :class:`dlm.sample.StepView` (observation only).
    ``stats.extra`` holds ``flops`` (:func:`dlm.stats.forward_flops` of all forwards),
    ``blocks_run``, ``cache`` and ``rule``; ``timed``: synchronised forward timings
    (:func:`dlm.sample.denoise`).
    """
    if threshold is not None and factor is not None:
        raise ValueError("give at most one of threshold and factor, not both")
    rule = "threshold" if threshold is not None else "factor" if factor is not None else "topk"
    options = dict(threshold=threshold, factor=factor, temperature=temperature, remasking=remasking,
                   refresh_every=refresh_every, top_p=top_p, top_k=top_k, eps=eps, alg_temp=alg_temp, delay=delay,
                   tolerance=tolerance, every_block=None if every_block else False)
    family = resolve_family(rules, model.config)  # the model is known: its options are checked against it
    sampler = Sampler.of("fastdllm", policy="none" if cache is None else cache, rule=rule, family=family,
                         gen_length=gen_length, block_length=block_length, steps=steps, stop_at_eos=stop_at_eos,
                         **options)
    return run_sampler(model, input_ids, attention_mask, sampler, generator=generator, callback=callback,
                       backend=backend, mask_id=mask_id, timed=timed)
