"""NELBO perplexity of a BD3-LM over a dataset (Arriola et al., ICLR 2025, sec. 6.1).

``ppl = exp(sum NELBO / sum tokens)`` with the NELBO of BD3-LM eq. 8 estimated under the
*unclipped* schedule ``t ~ U[0, 1]`` (low-discrepancy over batch x blocks). The NELBO upper
bounds the NLL, so this perplexity upper bounds the true one; it is what BD3-LM Tables 1-3
report. For ``L' = 1`` the exact AR NLL is available: ``exact_ar=True`` masks every token
(``t = 1``, weight 1), so each token is predicted from the clean tokens before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

import torch
from torch import Tensor

from .loss import bd3_nelbo
from .schedules import UNCLIPPED


@dataclass(frozen=True)
class PerplexityResult:
    """``nelbo``: nats per token; ``ppl = exp(nelbo)``; ``tokens``: tokens scored."""

    nelbo: float
    ppl: float
    tokens: int
    total_nats: float
    exact: bool

    def to_dict(self) -> dict:
        return {"nelbo": self.nelbo, "ppl": self.ppl, "tokens": self.tokens, "exact": self.exact}


def _as_batch(batch) -> dict:
    if isinstance(batch, Tensor):
        return {"input_ids": batch}
    if isinstance(batch, dict):
        return {k: v for k, v in batch.items() if not k.startswith("bd3_")}  # never reuse training noise
    raise TypeError(f"batches must yield dicts or (B, L) tensors, got {type(batch).__name__}")


@torch.no_grad()
def perplexity(model, batches: Iterable, block_size: int, *, generator: Optional[torch.Generator] = None,
               exact_ar: bool = False, backend: str = "sdpa") -> PerplexityResult:
    """NELBO perplexity over ``batches`` (dicts as :mod:`bd3lm.loss`, or id tensors)."""
    if not isinstance(exact_ar, bool):
        raise TypeError(f"exact_ar must be a bool, got {type(exact_ar).__name__}")
    if exact_ar and block_size != 1:
        raise ValueError(f"exact_ar needs block_size=1 (the AR case), got block_size={block_size}")
    total: Optional[Tensor] = None
    tokens: Optional[Tensor] = None
    for batch in batches:
        out = bd3_nelbo(model, _as_batch(batch), block_size, schedule=UNCLIPPED, generator=generator,
                        fixed_t=1.0 if exact_ar else None, backend=backend)
        s, n = out.total.to(torch.float64), out.n_tokens
        total = s if total is None else total + s
        tokens = n if tokens is None else tokens + n
    if total is None:
        raise ValueError("batches: empty dataset, nothing to score")
    n_tok = int(tokens)
    if n_tok == 0:
        raise ValueError("batches: no real tokens to score")
    nats = float(total)
    nelbo = nats / n_tok
    return PerplexityResult(nelbo, math.exp(min(nelbo, 700.0)), n_tok, nats, exact_ar)
