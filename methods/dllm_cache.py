"""dLLM-Cache (Liu et al. 2025, "dLLM-Cache: Accelerating Diffusion Large Language Models with
Adaptive Caching"), a cache policy of the one loop, in K/V terms.

dLLM-Cache keeps the prompt's and the response's features and refreshes them on two clocks: the
prompt every ``K_p`` steps (``prompt_interval``), the response every ``K_r`` steps
(``gen_interval``); at the steps between, only the fraction ``rho`` (``transfer_ratio``) of
response tokens whose value vectors moved most from the cached ones (lowest cosine similarity)
is recomputed, the rest reused. Here the cache is the library's one :class:`dlm.cache.KVCache`:
a step recomputes some columns and reads every other column's K/V from the cache. Per row, at
its ``t``-th step of the call:

* ``t % K_p == 0``: every column (a full refresh; ``t = 0`` fills the cache);
* else ``t % K_r == 0``: the answer ``[P, T)`` over the cached prompt, its K/V rewritten;
* else: the current block (its logits are needed; with shifted logits from the column before
  it) plus the ``round(rho * n)`` of the ``n`` other answer columns whose first-layer value
  vectors ``v_j = W_v norm(embed(x_j))`` are least similar to their cached ones; their K/V
  rewritten.

Two differences from the paper, both forced by caching K/V rather than per-layer features: the
paper caches each layer's attention and MLP outputs and picks the changed tokens per layer from
that layer's values; here the picked columns go through every layer (their K/V exact given the
cache), picked once from the first layer's values, the only ones computable without a forward
(so the tokens committed since a column's K/V were written rank first). Rows keep their own clock
(a row decodes as it would alone): in a batch whose rows need different windows, or with a row
whose block is done, the forward covers the widest window and pins each row's other columns to
their cached K/V (``KVCache.keep``); the decision costs one host read per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from dlm.policy import CachePolicy
from dlm.registry import param, register
from dlm.sample import Run


@register("policy", "dllm_cache")
@dataclass(frozen=True)
class DLLMCache(CachePolicy):
    """Cache policy "dllm_cache": prompt refreshed every ``prompt_interval`` steps, the answer every
    ``gen_interval``, between them the block plus the ``transfer_ratio`` most-changed answer columns."""

    prompt_interval: int = field(default=20, metadata=param(
        "dLLM-Cache: refresh every column (the prompt too) every K_p steps of a row", min=1))
    gen_interval: int = field(default=4, metadata=param(
        "dLLM-Cache: refresh the answer's columns every K_r steps of a row", min=1, sweep=(2, 4, 8), tag="kr"))
    transfer_ratio: float = field(default=0.25, metadata=param(
        "dLLM-Cache: share of the other answer columns recomputed between refreshes (most-changed values)",
        min=0.0, max=1.0, sweep=(0.0, 0.1, 0.5), tag="rho"))
    # windows start at the block even with shifted logits (Fast-dLLM's Dream rules)
    at_block: bool = field(default=False, metadata=param("", derived="at_block"))
    approximate = True
    same_as = ("none", (("prompt_interval", 1),))  # every step a full forward: the uncached computation

    def start(self, run: Run) -> None:
        run.new_cache()
        run.state["t"] = torch.zeros(run.x.shape[0], dtype=torch.long, device=run.x.device)  # (B,) steps per row

    def changed(self, run: Run, first: int, hi: int, n: int) -> Tensor:
        """(B, n) answer columns outside ``[first, hi)`` whose layer-0 values moved most."""
        P, T = run.prompt_len, run.x.shape[1]
        model = run.model
        layer = model.layers[0]
        v = layer.attn.v_proj(layer.attn_norm(model.embed(run.x[:, P:])))  # (B, R, Hkv * D)
        cached = run.cache.v[0, :, :, P:T].transpose(1, 2).flatten(2)  # (B, R, Hkv * D)
        # (B, R); rounded so that float noise (cached K/V from windows of other widths) cannot reorder
        # the columns whose values did not change (similarity 1): those tie and go by column
        sim = torch.round(F.cosine_similarity(v.to(cached.dtype), cached, dim=-1), decimals=9)
        cols = torch.arange(P, T, device=run.x.device)
        sim = sim.masked_fill((cols >= first) & (cols < hi), float("inf"))  # the block is recomputed anyway
        pick = torch.sort(sim, dim=-1, stable=True).indices[:, :n]  # (B, n) least similar first
        return torch.sort(pick, dim=-1).values + P

    def logits(self, run: Run, lo: int, hi: int, i: int) -> Tensor:
        x, t, T, P = run.x, run.state["t"], run.x.shape[1], run.prompt_len
        active = run.active if run.active is not None else torch.ones_like(t, dtype=torch.bool)
        run.state["t"] = t + active
        first = lo - int(run.model.config.shift_logits and not self.at_block)  # hidden states needed from here
        if run.cache.length == 0:
            run.refreshed = True
            return run.forward(0, T, run.key_padding, slice(lo, hi), commit=True)  # (B, L, V)
        full = active & (t % self.prompt_interval == 0)  # (B,)
        answer = active & ~full & (t % self.gen_interval == 0)
        others = T - P - (hi - first)
        n = min(round(self.transfer_ratio * (T - P)), others)
        picked = self.changed(run, first, hi, n)  # (B, n)
        block = torch.arange(first, hi, device=x.device).expand(x.shape[0], -1)  # (B, hi - first)
        cols = torch.cat([picked, block], dim=-1)  # (B, n + hi - first)
        run.refreshed = full
        wide, widest, idle = torch.stack([answer.any(), full.any(), (~active).any()]).tolist()  # one host read
        if not (wide or widest or idle):  # every row between refreshes: one gathered window
            return run.forward_columns(cols, run.key_padding, slice(n + lo - first, n + hi - first))
        start = 0 if widest else min(P, first)
        own = torch.zeros_like(x, dtype=torch.bool).scatter_(1, cols, True)  # (B, T) a partial row's columns
        span = torch.arange(T, device=x.device)[None, :]
        recompute = torch.where(full[:, None], True, torch.where(answer[:, None], span >= min(P, first), own))
        run.cache.keep = ~recompute | ~active[:, None]  # a finished row rides along frozen, as if absent
        lo_r = torch.where(full, 0, torch.where(answer, min(P, first), P))  # (B,) per-row cost spans
        hi_r = torch.where(full | answer, T, P + cols.shape[1])
        try:
            return run.forward(start, T, run.key_padding, slice(lo - start, hi - start), commit=True,
                               row_span=(lo_r, hi_r))  # (B, L, V)
        finally:
            run.cache.keep = None
