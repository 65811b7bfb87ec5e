"""BD3-LM block-diffusion sampling: the one loop :func:`dlm.sample.denoise` with the exact
block-causal cache policy (:class:`bd3lm.policy.ExactBlockCache`, Arriola et al., ICLR 2025,
Alg. 2) and a commit rule of :mod:`dlm.commit`. This entry keeps BD3-LM's argument names
(``block_size``, ``steps_per_block``, ``mode``, ``use_cache``): a thin preset; the same run is
``dlm.spec.Sampler.of(policy="exact", rule=...)``.

Commit rules per step (``mode``; :mod:`bd3lm.rules`, any other registered rule works too):

- ``topk``: low-confidence remasking; the linear schedule commits ``num_transfer_tokens`` of the
  block's masked tokens per step, the most confident first (LLaDA Alg. 2 inside a block);
- ``first_hitting``: Zheng et al. (2025) first-hitting sampler: exactly one uniformly chosen
  masked token is unmasked per step, at the hitting time ``t <- t * u^(1/n_masked)``
  (recorded in ``stats.extra["hitting_time"]``; the model has no time input). Takes one step per
  masked token of the block, ignoring ``steps_per_block``;
- ``ancestral``: the MDLM / BD3-LM reverse step ``q(x_s | x_t, x_theta)`` on the grid
  ``t_i = 1 - i / steps``: each masked token is unmasked with probability ``(t - s) / t``.

Tokens are drawn from the SUBS distribution (mask logit -inf), nucleus-filtered (``top_p``),
with float64 Gumbel noise at ``temperature`` (argmax at 0) (:func:`dlm.commit.propose`).

Layout. ``align="prompt"`` (default; matches SFT training): the prompt is one clean block and
blocks start right after it. ``align="absolute"`` (matches pre-training on chunks that start
with BOS): blocks sit at real positions that are multiples of ``L'``; the prompt's trailing
partial block is the first noisy block with its prompt tokens fixed. Batches are left padded
(``dlm.sampling.prepare_batch``); with ``absolute`` every row's padding must be a multiple of L'.

Variable length: ``stop_at_eos`` (default True here) as in :func:`dlm.sample.denoise`.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from dlm import registry
from dlm.commit import Proposal, check_int, check_real
from dlm.sample import GenerateOutput, denoise
from dlm.validate import prepare_batch

from .loss import model_config
from .policy import ALIGNS


def _check_args(block_size, steps_per_block, top_p, mode, stop_at_eos, use_cache) -> int:
    check_int("block_size", block_size)
    steps = block_size if steps_per_block is None else steps_per_block
    check_int("steps_per_block", steps)
    check_real("top_p", top_p, 0.0, 1.0)
    if mode not in registry.names("rule"):
        raise ValueError(f"mode must be a registered rule ({', '.join(registry.names('rule'))}), got {mode!r}")
    for name, flag in (("stop_at_eos", stop_at_eos), ("use_cache", use_cache)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    return steps


def _gen_length(prompt_len: int, max_length: Optional[int], gen_length: Optional[int], max_seq_len: int) -> int:
    if (max_length is None) == (gen_length is None):
        raise ValueError("give exactly one of max_length (prompt + generation) or gen_length")
    if max_length is not None:
        check_int("max_length", max_length)
        gen = max_length - prompt_len
        if gen < 1:
            raise ValueError(f"max_length={max_length} leaves no room after the prompt of {prompt_len}")
    else:
        check_int("gen_length", gen_length)
        gen = gen_length
    if prompt_len + gen > max_seq_len:
        raise ValueError(f"max length {prompt_len + gen} (prompt {prompt_len} + generation {gen}) exceeds "
                         f"the model's max_seq_len={max_seq_len}")
    return gen


def sample(
    model,
    input_ids: Tensor,
    attention_mask: Optional[Tensor] = None,
    *,
    block_size: int,
    max_length: Optional[int] = None,
    gen_length: Optional[int] = None,
    steps_per_block: Optional[int] = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    mode: str = "topk",
    stop_at_eos: bool = True,
    generator: Optional[torch.Generator] = None,
    use_cache: bool = True,
    align: str = "prompt",
    backend: str = "sdpa",
    mask_id: Optional[int] = None,
    threshold: Optional[float] = None,
    factor: Optional[float] = None,
    callback: Optional[Callable] = None,
) -> GenerateOutput:
    """Generate after the (left-padded) prompts ``input_ids`` (B, P); see the module docstring.

    max_length: prompt + generation columns, or gen_length: generated columns (one of them).
    steps_per_block: denoising steps per block (default ``block_size``); threshold / factor: the
    numbers of ``mode="threshold"`` / ``"factor"`` (Fast-dLLM's rules inside each block).
    callback(view): a :class:`dlm.sample.StepView` after every denoising step.
    Returns :class:`dlm.sample.GenerateOutput` (sequences (B, P + G), commit_step (B, G)).
    """
    steps = _check_args(block_size, steps_per_block, top_p, mode, stop_at_eos, use_cache)
    numbers = {k: v for k, v in (("threshold", threshold), ("factor", factor)) if v is not None}
    rule = registry.build("rule", mode, numbers, {"steps_per_block": steps})
    proposal = Proposal(temperature, top_p=top_p)
    if align not in ALIGNS:
        raise ValueError(f"align must be one of {ALIGNS}, got {align!r}")
    cfg = model_config(model)
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise TypeError("input_ids must be an integer torch.Tensor of shape (B, P)")
    G = _gen_length(input_ids.shape[1], max_length, gen_length, cfg.max_seq_len)
    policy = registry.build("policy", "exact" if use_cache else "block_causal", {"align": align},
                            {"block_length": block_size})
    blocks = policy.layout(input_ids.shape[1], G, block_size, attention_mask)
    batch = prepare_batch(model, input_ids, attention_mask, G, mask_id)
    out = denoise(model, batch, blocks, policy, rule, proposal,
                  stop_at_eos=stop_at_eos and cfg.eos_token_id is not None, generator=generator,
                  backend=backend, callback=callback)
    out.stats.extra.update({"blocks": out.stats.extra["blocks_run"], "mode": mode, "use_cache": use_cache,
                            "block_size": block_size})
    return out
