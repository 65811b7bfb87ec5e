"""Fast-dLLM sampling: block-wise KV caching + confidence-aware parallel decoding.

Wu et al. 2025, "Fast-dLLM: Training-free Acceleration of Diffusion LLM by Enabling KV Cache and
Parallel Decoding" (the reference ``generate_with_prefix_cache`` / ``generate_with_dual_cache``
before its torch.compile rewrite), as the one loop :func:`dlm.sample.denoise` with

- a cache policy of :mod:`fastdllm.policies` (``None``: recompute everything, LLaDA's cost);
- a commit rule of :mod:`dlm.commit`: LLaDA's top-k schedule (``steps`` split evenly over the
  blocks), the threshold rule (Thm. 1 / eq. 5) or the factor rule (eq. 6); the parallel rules
  run until the block has no [MASK] left.

With ``cache=None`` and no rule this is exactly :func:`dlm.sampling.generate`. No sampler ever
proposes [MASK] (its logit is set to -inf), so every step commits at least one real token in each
row whose block is unfinished and a parallel-decoded block takes at most ``block_length`` steps
(the reference loops forever if a model proposes [MASK]; trained models never do).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from dlm.sample import Callback, GenerateOutput, StepView, denoise  # noqa: F401  (StepView re-exported)
from dlm.sampling import blocks_after
from dlm.validate import check_blocks, prepare_batch

from .dream import block_sampler, resolve_rules
from .policies import cache_policy


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
    ``blocks_run``, ``cache`` and ``rule``.
    """
    family = resolve_rules(rules, model)
    policy = cache_policy(cache, refresh_every, at_block=family == "dream", delay=delay, tolerance=tolerance,
                          every_block=every_block)
    if threshold is not None and factor is not None:
        raise ValueError("give at most one of threshold and factor, not both")
    steps = gen_length if steps is None else steps
    steps_per_block = check_blocks(gen_length, block_length, steps)
    name = "threshold" if threshold is not None else "factor" if factor is not None else "topk"
    if family == "llada" and top_p is not None:
        raise ValueError("top_p is an option of rules='dream' (Dream's proposal)")
    rule, proposal = block_sampler(family, name, steps_per_block, threshold, factor, temperature, remasking,
                                   top_p, top_k, eps, alg_temp, cache)
    batch = prepare_batch(model, input_ids, attention_mask, gen_length, mask_id)
    return denoise(model, batch, blocks_after(batch.prompt_len, gen_length, block_length), policy, rule,
                   proposal, stop_at_eos=stop_at_eos, generator=generator, backend=backend, callback=callback)
