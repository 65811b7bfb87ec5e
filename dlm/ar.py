"""Autoregressive decoding as a cache policy of the one loop (:func:`dlm.sample.denoise`): the
"AR + KV cache" row of ``experiments.bench.compute_cost``, for models trained left to right
(``dlm.objectives.ARSFTLoss``; a Dream-style model before its diffusion adaptation).

Blocks are single columns (``block_length = 1``, one step each). The first step prefills the
prompt: one causal forward over ``[0, P)`` (``[0, P]`` for shifted logits, whose logit ``P`` is
the hidden state of ``P - 1``) that writes its K/V and predicts column ``P`` from the hidden state
of column ``P - 1``. Every later step runs the one column decoded last, ``j - 1``,
causally over the cache, writes its K/V and predicts column ``j``:

    p(x_j | x_<j) = softmax(W h^L_{j-1}),   h_{j-1} attending to K/V of columns <= j - 1.

Column ``j``'s logit comes from hidden state ``j - 1`` whether the model shifts its logits
(Dream: the window's first logit is its own hidden state's) or not (a plain LM's logit at ``j - 1``
is the next token's), so one window serves both. The cache is exact: no column's K/V depend on
a later column. Left padding: key padding plus each query seeing itself (a padding query has no
real key before it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .attention import causal_mask
from .policy import CachePolicy
from .registry import register
from .sample import Run


@register("policy", "ar")
@dataclass(frozen=True)
class ARCache(CachePolicy):
    """Cache policy "ar": one prefill, then one column per step with the exact KV cache."""

    family_rules = False
    attention = "causal"

    @classmethod
    def check(cls, block_length: Optional[int], rule: str) -> None:
        if block_length != 1 or rule != "topk":
            raise ValueError("policy 'ar' decodes one column per step: block_length=1, rule='topk'")

    def start(self, run: Run) -> None:
        for lo, hi in run.blocks:
            if hi - lo != 1:
                raise ValueError(f"cache 'ar' decodes one column per block (block_length=1), got block [{lo}, {hi})")
        run.new_cache()

    def logits(self, run: Run, lo: int, hi: int, i: int) -> Tensor:
        run.refreshed = False
        shift = bool(run.model.config.shift_logits)
        if run.cache.length == 0:  # prefill [0, P), and column P itself where logit P needs the shift
            start, stop = 0, lo + shift
            head = slice(stop - 1, stop)
        else:  # the column decoded last; the window's only logit is its hidden state's, shifted or not
            start, stop, head = lo - 1, lo, slice(0, 1)
        cols = torch.arange(start, stop, device=run.x.device)  # (W,) query columns
        return run.forward(start, stop, ar_mask(cols, stop, run.attention_mask), head, commit=True)  # (B, 1, V)


def ar_mask(cols: Tensor, stop: int, attention_mask: Optional[Tensor]) -> Tensor:
    """(1|B, 1, W, stop): query columns ``cols`` see keys ``<=`` themselves among ``[0, stop)``,
    without the left padding, and each query sees itself (a padding query has no real key)."""
    am = attention_mask
    mask = causal_mask(cols, stop, None if am is None else am[:, :stop])
    if am is not None:
        mask = mask | (cols[:, None] == torch.arange(stop, device=cols.device)[None, :])
    return mask
