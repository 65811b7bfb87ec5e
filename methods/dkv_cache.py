"""Delayed caching (dKV-Cache, Ma et al. 2025, "dKV-Cache: The Cache for Diffusion Language
Models", Sec. 4.2 "dKV-Cache-Decode"), a cache policy for the one loop :func:`dlm.sample.denoise`.

A column's K/V are cached only once its token is decoded, and one step late: the step that
commits a token computed its K/V with the column still [MASK]; the next forward recomputes them
with the token in place, and from then on they are read from the cache and never recomputed
(``delay`` = 1; ``delay`` = d: the d-th forward after the commit writes them). Masked columns are
never cached: every step recomputes each row's window from its first column that is not yet
cached to the end (the block and the masked suffix), reading the prompt and the settled answer
columns from the cache (per row: :attr:`dlm.cache.KVCache.keep` pins a row's cached columns
inside the batch's window, so a row decodes as it would alone). Only the run's first forward is
full; no block start refreshes the cache (the Fast-dLLM caches do); ``refresh_every = k`` adds a
full forward at every k-th step of a block (k = 1: uncached recomputation, token for token).

With the notation of dKV-Cache eq. 6: at step t the cached set is ``{i : x_i decoded at a step
< t - delay + 1}``; ``K_t[i] = K_cache[i]`` for those, recomputed otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from dlm.policy import CachePolicy, at_block_field, refresh_every_field
from dlm.registry import param, register
from dlm.sample import Run


@register("policy", "delayed")
@dataclass(frozen=True)
class DelayedCache(CachePolicy):
    """Cache policy "delayed" (dKV-Cache-Decode): decoded columns cached ``delay`` steps late."""

    delay: int = field(default=1, metadata=param("delayed cache: a decoded column's K/V cached this many steps late",
                                                 min=1))
    refresh_every: Optional[int] = refresh_every_field()
    at_block: bool = at_block_field()
    approximate = True
    same_as = ("none", (("refresh_every", 1),))  # every step a full forward: the uncached computation

    def start(self, run: Run) -> None:
        run.new_cache()
        run.state["seen"] = torch.zeros_like(run.x)  # (B, T) forwards that computed a column with its token

    def logits(self, run: Run, lo: int, hi: int, i: int) -> Tensor:
        x, seen, T = run.x, run.state["seen"], run.x.shape[1]
        decoded = x != run.mask_id  # (B, T) before this step's commits
        full = run.cache.length == 0 or (self.refresh_every is not None and i % self.refresh_every == 0)
        run.refreshed = full
        if full:
            logits = run.forward(0, T, run.key_padding, slice(lo, hi), commit=True)  # (B, L, V)
            run.state["seen"] = seen + decoded
            return logits
        settled = seen >= self.delay  # (B, T) columns read from the cache
        first = lo - int(run.model.config.shift_logits and not self.at_block)  # hidden states needed from here
        cols = torch.arange(T, device=x.device)
        unsettled_from = torch.where(~settled, cols, T).amin(-1)  # (B,) each row's first uncached column
        row_start = unsettled_from.clamp_max(first)  # (B,)
        active = run.active if run.active is not None else torch.ones_like(row_start, dtype=torch.bool)
        start = int(torch.where(active, row_start, first).amin())  # one host sync per step
        run.cache.keep = settled | ~active[:, None]  # a finished row rides along frozen, as if absent
        try:
            logits = run.forward(start, T, run.key_padding, slice(lo - start, hi - start), commit=True,
                                 row_span=(row_start, torch.full_like(row_start, T)))  # (B, L, V)
        finally:
            run.cache.keep = None
        run.state["seen"] = seen + (decoded & ~settled & (cols >= start) & active[:, None])
        return logits
