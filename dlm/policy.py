"""The cache-policy slot of the one loop (:func:`dlm.sample.denoise`): which window of columns a
step recomputes, under which attention mask, and when K/V are (re)written.

A policy is a frozen dataclass registered with ``@register("policy", name)`` (:mod:`dlm.registry`)
that subclasses :class:`CachePolicy`: ``start(run)`` before the first block, ``logits(run, lo, hi,
i) -> (B, hi - lo, V)`` at step ``i`` of block ``[lo, hi)`` (setting ``run.refreshed``: the forward
recomputed every column), ``block_done(run, lo, hi, last)`` once a block is clean, and
``layout(P, G, L, attention_mask)``: the blocks ``(lo, hi)`` it decodes.
"""

from __future__ import annotations

from dataclasses import field
from typing import Optional

from torch import Tensor

from .registry import param


def refresh_every_field():
    """The ``refresh_every`` option of the caches refreshed at block starts: also redo the full
    committing forward every k-th step of a block (k = 1: the uncached computation)."""
    return field(default=None, metadata=param("also refresh the whole cache every k-th step of a block", min=1,
                                              sweep=(2, 4, 8), tag="re"))


def at_block_field():
    """The derived ``at_block`` of a windowed cache: windows start at the block even with shifted
    logits (set by Fast-dLLM's Dream rules, :class:`fastdllm.dream.FastDreamFamily`)."""
    return field(default=False, metadata=param("", derived="at_block"))


def blocks_after(prompt_len: int, gen_length: int, block_length: int) -> tuple[tuple[int, int], ...]:
    """Absolute columns ``(lo, hi)`` of the answer's blocks after a prompt of ``prompt_len``."""
    return tuple((prompt_len + lo, prompt_len + lo + block_length) for lo in range(0, gen_length, block_length))


class CachePolicy:
    """Base of the registered cache policies. Class flags: ``block_model``: needs a
    block-diffusion model, its block size as the block length (``derived="block_length"``);
    ``family_rules``: a model family's own block rules apply under it (Fast-dLLM's Dream rules);
    ``approximate``: it reuses K/V a full recompute would change; ``same_as``: ``(policy,
    ((option, value), ...))``: with those options it equals that policy token for token (the
    contract tests check it); ``attention``: the attention the decoded model was trained with
    (``bidirectional``, ``block_causal`` or ``causal``; :mod:`dlm.kind` refuses a checkpoint of another)."""

    attention = "bidirectional"
    block_model = False
    family_rules = True
    approximate = False  # reuses K/V that a full recompute would change (the caches grid sweeps these)
    same_as: Optional[tuple[str, tuple]] = None  # (policy, options) this one equals token for token with options

    def start(self, run) -> None:
        pass

    def block_done(self, run, lo: int, hi: int, last: bool) -> None:
        pass

    def layout(self, prompt_len: int, gen_length: int, block_length: int,
               attention_mask: Optional[Tensor]) -> tuple[tuple[int, int], ...]:
        return blocks_after(prompt_len, gen_length, block_length)

    @classmethod
    def check(cls, block_length: Optional[int], rule: str) -> None:
        """Raise ValueError when the sampler's block length or rule cannot run under this policy."""
