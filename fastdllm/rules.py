"""Fast-dLLM's confidence-aware parallel decoding rules (Wu et al. 2025, Sec. 3.3) as registered
commit rules of the one loop: a block steps until it is clean, each step committing

* ``threshold`` (Thm. 1 / eq. 5): the most confident masked column, plus every masked column with
  confidence >= tau;
* ``factor`` (eq. 6): with c(1) >= c(2) >= ... the sorted masked confidences, the top n for the
  largest n with ``(n + 1)(1 - c(n)) < f``, at least one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from dlm.commit import CommitRule, confidence_ranks, masked_confidence, select_topk
from dlm.registry import param, register


def select_threshold(confidence: Tensor, eligible: Tensor, threshold: float) -> Tensor:
    """Eq. 5: the most confident eligible position, plus every eligible one with confidence >=
    ``threshold``. confidence (B, T) float, eligible (B, T) bool -> bool (B, T)."""
    conf = masked_confidence(confidence, eligible)
    top = confidence_ranks(conf) == 0
    return ((conf >= threshold) | top) & eligible


def select_factor(confidence: Tensor, eligible: Tensor, factor: float) -> Tensor:
    """Eq. 6: the top n eligible positions for the largest n with ``(n + 1)(1 - c(n)) < factor``,
    at least one. confidence (B, T) float, eligible (B, T) bool -> bool (B, T)."""
    conf = masked_confidence(confidence, eligible)
    sorted_conf = torch.sort(conf, dim=-1, descending=True, stable=True).values  # (B, T)
    n = torch.arange(1, conf.shape[-1] + 1, device=conf.device, dtype=conf.dtype)  # (T,)
    ok = ((n + 1) * (1 - sorted_conf) < factor) & torch.isfinite(sorted_conf)  # (B, T)
    # largest n with ok[n-1] True: index of the last True + 1 (0 when none)
    last = torch.where(ok, n.expand_as(ok), torch.zeros_like(sorted_conf)).amax(dim=-1)  # (B,)
    return select_topk(confidence, eligible, last.clamp_min(1).long())


@register("rule", "threshold")
@dataclass(frozen=True)
class Threshold(CommitRule):
    """Fast-dLLM's threshold rule (eq. 5, :func:`select_threshold`): steps until the block is clean."""

    threshold: float = field(default=0.9, metadata=param(
        "threshold rule: commit every column this confident, at least the top one", min=0.0, max=1.0,
        open_min=True, sweep=(0.5, 0.7, 0.8, 0.9, 0.95, 0.99), tag="thr", probe=0.2))

    @property
    def label(self) -> str:
        return f"threshold={self.threshold:g}"

    def select(self, conf, eligible, i, state, generator):
        return select_threshold(conf, eligible, self.threshold), state


@register("rule", "factor")
@dataclass(frozen=True)
class Factor(CommitRule):
    """Fast-dLLM's factor rule (eq. 6, :func:`select_factor`): steps until the block is clean."""

    factor: float = field(default=1.0, metadata=param(
        "factor rule: the largest n with (n + 1)(1 - c(n)) < factor", min=0.0, open_min=True,
        sweep=(0.5, 1.0, 2.0, 4.0), tag="f", probe=2.5))

    @property
    def label(self) -> str:
        return f"factor={self.factor:g}"

    def select(self, conf, eligible, i, state, generator):
        return select_factor(conf, eligible, self.factor), state
