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

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from dlm.commit import check_int
from dlm.sample import Run


@dataclass(frozen=True)
class DelayedCache:
    """Cache policy "delayed" (dKV-Cache-Decode): decoded columns cached ``delay`` steps late."""

    delay: int = 1
    refresh_every: Optional[int] = None
    at_block: bool = False  # shifted logits: windows start at the block (Fast-dLLM's Dream rules)
    name = "delayed"

    def __post_init__(self) -> None:
        check_int("delay", self.delay)
        if self.refresh_every is not None:
            check_int("refresh_every", self.refresh_every)

    def start(self, run: Run) -> None:
        run.new_cache()
        run.state["seen"] = torch.zeros_like(run.x)  # (B, T) forwards that computed a column with its token

    def block_done(self, run: Run, lo: int, hi: int, last: bool) -> None:
        pass

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
