"""Adaptive refresh of the dual cache, driven by a drift test (after Elastic-Cache, Nguyen-Tri et
al. 2025, "Attention Is All You Need for KV Cache in Diffusion LLMs": refresh only when the cache
has drifted), a cache policy for the one loop :func:`dlm.sample.denoise`.

Between refreshes every step is Fast-dLLM's dual-cache step: the block's window is recomputed
(and its K/V written into the cache in place, as the reference dual cache does), every other
column is read from the cache. After each step a cheap per-row drift test compares the keys of
one probe layer with those the cache held right after that row's last refresh,

    drift_t = 1 / L * sum_{j in answer[:hi]} mean_h (1 - cos(K^l_t[h, j], K^l_ref[h, j])),

the change of the answer's keys that the cached columns have not seen (kept per column: only the
window's columns change between refreshes, so a step costs one block of cosines), in units of a block of
``L`` columns changing completely (so the knob means the same at every generation length); when
``drift >= tolerance``
the row's next step is a full refresh (all columns recomputed and rewritten). ``tolerance = 0``
refreshes every step (uncached recomputation, token for token); ``inf`` never (with
``every_block``: Fast-dLLM's dual cache, token for token). ``every_block=False`` drops the dual
cache's unconditional refresh at each block start, so refreshes happen only on drift; the first
step of a block then also recomputes the previous block (its last commits were made after its
last forward, so the cache holds their [MASK] K/V).
Each row decides for itself: rows that do not refresh pin their cached columns
(:attr:`dlm.cache.KVCache.keep`) inside the batch's full-width forward, so a row decodes as alone.

Differences from Elastic-Cache, which this is not a reproduction of: the test watches the keys of
the answer at one layer, not the attention of the most-attended token, and a refresh recomputes
every layer, not only those from the first drifting layer on; no sliding window.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field

import torch
from torch import Tensor

from dlm.policy import CachePolicy, at_block_field
from dlm.registry import param, register
from dlm.sample import Run


@register("policy", "adaptive")
@dataclass(frozen=True)
class AdaptiveCache(CachePolicy):
    """Cache policy "adaptive": the dual cache, refreshed per row when its drift test fires."""

    tolerance: float = field(default=0.1, metadata=param(
        "adaptive cache: refresh a row when its probe drifts by more than this (inf: never)", min=0.0, max=math.inf,
        sweep=(0.02, 0.05, 0.1, 0.2, 0.5), tag="tol"))
    probe_layer: int = field(default=-1, metadata=param("adaptive cache: the layer whose drift is tested"))
    every_block: bool = field(default=True, metadata=param("adaptive cache: also refresh at every block start"))
    at_block: bool = at_block_field()
    approximate = True
    variants = {"nb": {"every_block": False}}  # the sweep's and caches grid's adaptive_nb

    def start(self, run: Run) -> None:
        n_layers = run.model.config.n_layers
        if not -n_layers <= self.probe_layer < n_layers:
            raise ValueError(f"probe_layer must lie in [{-n_layers}, {n_layers}), got {self.probe_layer}")
        run.new_cache()
        run.state["due"] = torch.ones(run.x.shape[0], dtype=torch.bool, device=run.x.device)  # (B,)

    def block_done(self, run: Run, lo: int, hi: int, last: bool) -> None:
        run.state["last_block"] = lo  # its last commits are in the cache with [MASK] K/V

    def logits(self, run: Run, lo: int, hi: int, i: int) -> Tensor:
        x, T = run.x, run.x.shape[1]
        cache = run.cache
        active = run.active if run.active is not None else torch.ones_like(run.state["due"])  # (B,)
        due = (active if self.every_block and i == 0 else run.state["due"]) & active
        first = lo - int(run.model.config.shift_logits and not self.at_block)  # hidden states needed from here
        if i == 0 and not self.every_block:  # the last block's final commits get their K/V once
            first = min(first, run.state.get("last_block", first))
        cols = torch.arange(T, device=x.device)
        window = (cols >= first) & (cols < hi)  # (T,)
        frozen = ~active[:, None]  # a finished row rides along unchanged, as if absent
        n_due = int(due.sum())  # one host sync per step
        run.refreshed = due
        if n_due == 0:  # the dual step for every row
            cache.keep = None if bool(active.all()) else frozen.expand(-1, T)
            start, stop, head, span = first, hi, slice(lo - first, hi - first), None
        else:
            keep = (~due[:, None] & ~window[None, :]) | frozen  # (B, T) columns read from the cache
            cache.keep = keep if bool(keep.any()) else None
            start, stop, head = 0, T, slice(lo, hi)
            span = (torch.where(due, 0, first), torch.where(due, T, hi))
        try:
            logits = run.forward(start, stop, run.key_padding, head, commit=True, row_span=span)  # (B, L, V)
        finally:
            cache.keep = None
        P, layer = run.prompt_len, self.probe_layer % run.model.config.n_layers
        keys = cache.k[layer, :, :, P:T]  # (B, H, G, D) the answer's keys as cached now
        ref = run.state.setdefault("ref", keys.clone())  # as of each row's last refresh
        col = run.state.setdefault("col_drift", torch.zeros(keys.shape[0], T - P, dtype=keys.dtype, device=x.device))
        a = max(first, P) - P  # only the window's columns changed since the last step (the rest are pinned)
        cos = torch.nn.functional.cosine_similarity(keys[:, :, a:hi - P], ref[:, :, a:hi - P], dim=-1)  # (B, H, W)
        col[:, a:hi - P] = (1 - cos.clamp(-1, 1)).mean(dim=1)
        ref[due], col[due] = keys[due], 0.0  # a refreshed row's reference is its fresh keys
        drift = col[:, :hi - P].sum(-1) / (hi - lo)  # (B,) in blocks' worth of change
        run.state["due"] = torch.where(active, drift >= self.tolerance, run.state["due"])
        return logits
