"""NELBO perplexity of a BD3-LM over a dataset (Arriola et al., ICLR 2025, sec. 6.1).

``ppl = exp(sum NELBO / sum tokens)`` with the NELBO of BD3-LM eq. 8 estimated under the
*unclipped* schedule ``t ~ U[0, 1]`` (low-discrepancy over batch x blocks). The NELBO upper
bounds the NLL, so this perplexity upper bounds the true one; it is what BD3-LM Tables 1-3
report. The estimate is Monte Carlo (t and the masks are drawn): ``passes=K`` averages K passes
over the data with fresh noise and reports the pass-to-pass standard error of the mean.
For ``L' = 1`` the exact AR NLL is available: ``exact_ar=True`` masks every token
(``t = 1``, weight 1), so each token is predicted from the clean tokens before it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Optional

import torch
from torch import Tensor

from .loss import bd3_nelbo
from .schedules import UNCLIPPED


@dataclass(frozen=True)
class PerplexityResult:
    """``nelbo``: nats per token, the mean over ``passes``; ``ppl = exp(nelbo)``; ``tokens`` and
    ``total_nats``: tokens scored and nats per pass; ``pass_nelbo``: each pass's estimate;
    ``sem``: their standard error of the mean (None for one pass or the exact AR NLL)."""

    nelbo: float
    ppl: float
    tokens: int
    total_nats: float
    exact: bool
    pass_nelbo: tuple = ()
    sem: Optional[float] = None

    @property
    def passes(self) -> int:
        return max(1, len(self.pass_nelbo))

    def to_dict(self) -> dict:
        out = {"nelbo": self.nelbo, "ppl": self.ppl, "tokens": self.tokens, "exact": self.exact}
        if self.passes > 1:  # one-pass records keep their old keys
            out.update(passes=self.passes, pass_nelbo=list(self.pass_nelbo), nelbo_sem=self.sem)
        return out


def _as_batch(batch) -> dict:
    if isinstance(batch, Tensor):
        return {"input_ids": batch}
    if isinstance(batch, dict):
        return {k: v for k, v in batch.items() if not k.startswith("bd3_")}  # never reuse training noise
    raise TypeError(f"batches must yield dicts or (B, L) tensors, got {type(batch).__name__}")


@torch.no_grad()
def perplexity(model, batches: Iterable, block_size: int, *, generator: Optional[torch.Generator] = None,
               exact_ar: bool = False, backend: str = "sdpa", passes: int = 1) -> PerplexityResult:
    """NELBO perplexity over ``batches`` (dicts as :mod:`bd3lm.loss`, or id tensors), averaged
    over ``passes`` passes with fresh noise from ``generator`` (the exact AR NLL needs one)."""
    if not isinstance(exact_ar, bool):
        raise TypeError(f"exact_ar must be a bool, got {type(exact_ar).__name__}")
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"passes must be an int >= 1, got {passes!r}")
    if exact_ar and block_size != 1:
        raise ValueError(f"exact_ar needs block_size=1 (the AR case), got block_size={block_size}")
    batches = list(batches)
    runs = [_one_pass(model, batches, block_size, generator, exact_ar, backend)
            for _ in range(1 if exact_ar else passes)]  # [(nats, tokens)] per pass
    n_tok = runs[0][1]
    per = tuple(nats / n_tok for nats, _ in runs)
    nelbo = sum(per) / len(per)
    sem = statistics.stdev(per) / math.sqrt(len(per)) if len(per) > 1 else None
    nats = sum(n for n, _ in runs) / len(runs)  # per pass
    return PerplexityResult(nelbo, math.exp(min(nelbo, 700.0)), n_tok, nats, exact_ar,
                            per if len(per) > 1 else (), sem)


def _one_pass(model, batches: list, block_size: int, generator, exact_ar: bool, backend: str) -> tuple[float, int]:
    """(summed NELBO in nats, tokens scored) of one pass over ``batches``."""
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
    if int(tokens) == 0:
        raise ValueError("batches: no real tokens to score")
    return float(total), int(tokens)
