"""BD3-LM's exact block-causal cache policy (Arriola et al., ICLR 2025, Alg. 2) for the one loop
:func:`dlm.sample.denoise`.

Blocks are generated left to right, ``p(x) = prod_b p(x^b | x^{<b})`` (BD3-LM eq. 2). Within a
block every step recomputes the *current noisy block only*: the window of ``L'`` columns attends
block-causally (its own block and every earlier one) and reads the K/V of everything before it
from the :class:`dlm.cache.KVCache`. The context's K/V are committed once; when a block is clean
ONE forward with ``commit=True`` writes its K/V (the K/V a clean block has under the training
mask ``M_BC``, BD3-LM eq. 4). A noisy block's K/V are never committed, so the cache is *exact*:
``use_cache=False`` (rerun the whole prefix with the block-causal mask at every step) gives the
same logits up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from dlm.attention import block_causal_mask, block_ids
from dlm.policy import CachePolicy
from dlm.registry import param, register
from dlm.sample import Run

ALIGNS = ("prompt", "absolute")


@register("policy", "exact")
@dataclass(frozen=True)
class ExactBlockCache(CachePolicy):
    """BD3-LM's exact block-causal cache: each step recomputes the current block only, and a
    finished block's K/V are written once. align ``prompt``: block ids count from the prompt end
    (SFT layout); ``absolute``: from column 0 (pre-training chunks)."""

    block_size: int = field(metadata=param("", derived="block_length"))
    align: str = field(default="prompt", metadata=param(
        "block-diffusion layout: blocks after the prompt (SFT) or at multiples of the block size", choices=ALIGNS))
    use_cache = True
    block_model = True
    attention = "block_causal"
    family_rules = False
    same_as = ("block_causal", ())  # the cache is exact

    def layout(self, prompt_len: int, gen_length: int, block_length: int,
               attention_mask: Optional[Tensor]) -> tuple[tuple[int, int], ...]:
        return block_layout(self.align, prompt_len, gen_length, block_length, attention_mask)

    def _mask(self, run: Run, lo: int, hi: int) -> Optional[Tensor]:
        """(1|B, 1, hi - lo, hi) bool: queries ``[lo, hi)`` over keys ``[0, hi)``, block-causal; a
        padded row's queries always see themselves (no empty softmax row). Built once per window
        (a block's steps share it). A window inside one block sees every key before ``hi`` (the
        keys' blocks are its own or earlier), so only padding hides keys: None without padding."""
        memo = run.state.get("bd3_mask")
        if memo is not None and memo[0] == (lo, hi):
            return memo[1]
        start, am = run.prompt_len if self.align == "prompt" else 0, run.attention_mask
        L = self.block_size
        one_block = hi <= start or lo >= start and (lo - start) // L == (hi - 1 - start) // L
        if am is None and one_block:
            m = None
        else:
            ids = block_ids(hi, self.block_size, start, device=run.x.device)  # (hi,)
            m = block_causal_mask(ids[lo:hi], ids, None if am is None else am[:, :hi])
            if am is not None:
                cols = torch.arange(hi, device=run.x.device)
                m = m | (cols[lo:hi, None] == cols[None, :])
        run.state["bd3_mask"] = ((lo, hi), m)
        return m

    def start(self, run: Run) -> None:
        ctx_end = run.blocks[0][0] if run.blocks else run.x.shape[1]
        if self.use_cache:
            run.new_cache()
            if ctx_end > 0:
                run.forward(0, ctx_end, self._mask(run, 0, ctx_end), None, commit=True)  # context, once

    def logits(self, run: Run, lo: int, hi: int, i: int) -> Tensor:
        run.refreshed = not self.use_cache
        if self.use_cache:
            return run.forward(lo, hi, self._mask(run, lo, hi), slice(0, hi - lo))  # (B, L', V)
        return run.forward(0, hi, self._mask(run, 0, hi), slice(lo, hi))

    def block_done(self, run: Run, lo: int, hi: int, last: bool) -> None:
        if self.use_cache and not last:
            run.forward(lo, hi, self._mask(run, lo, hi), None, commit=True)  # the clean block's K/V, once


@register("policy", "block_causal")
@dataclass(frozen=True)
class BlockCausal(ExactBlockCache):
    """The exact policy's attention without its cache: the whole prefix recomputed every step
    (the reference the exact cache equals)."""

    use_cache = False
    same_as = None


def block_layout(align: str, P: int, G: int, L: int, attention_mask: Optional[Tensor]) -> tuple[tuple[int, int], ...]:
    """The noisy blocks ``(lo, hi)`` after the clean context (``[0, P)`` for ``prompt``; for
    ``absolute`` the prompt's trailing partial block is the first noisy block)."""
    if align == "prompt":
        if G % L:
            raise ValueError(f"block_size={L} must divide the generation length {G}")
        ctx_end = P
    else:
        r = P % L
        if (r + G) % L:
            raise ValueError(f"align='absolute': block_size={L} must divide the total length {P + G}")
        if attention_mask is not None:
            pad = attention_mask.shape[1] - attention_mask.long().sum(-1)
            if bool((pad % L != 0).any()):
                raise ValueError("align='absolute' needs every row's left padding to be a multiple of block_size")
        ctx_end = P - r
    return tuple((lo, lo + L) for lo in range(ctx_end, P + G, L))
