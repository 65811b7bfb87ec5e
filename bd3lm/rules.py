"""BD3-LM's commit rules (Arriola et al., ICLR 2025) for the one loop, registered:

* ``first_hitting`` (Zheng et al. 2025, used by BD3-LM's sampler): one uniformly chosen masked
  column per step, at the hitting time ``t <- t * u^(1 / n_masked)``; one step per masked column;
* ``ancestral``: the MDLM / BD3-LM reverse step ``q(x_s | x_t, x_theta)`` on ``t_i = 1 - i /
  steps``: each masked column is unmasked with probability ``(t - s) / t = 1 / (steps - i)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from dlm.commit import CommitRule, check_int, select_topk
from dlm.registry import param, register


@register("rule", "first_hitting")
@dataclass(frozen=True)
class FirstHitting(CommitRule):
    """Zheng et al.'s first-hitting sampler: one uniformly chosen masked column per step (random
    confidences, top 1), at the hitting time ``t <- t * u^(1 / n_masked)``."""

    confidence = "random"
    records_time = True
    random = True

    def block_steps(self, width: int) -> int:
        return width

    def begin(self, eligible: Tensor, n_steps: Optional[int], span: Optional[tuple] = None) -> Tensor:
        return torch.ones(eligible.shape[0], dtype=torch.float64, device=eligible.device)  # t = 1

    def select(self, conf, eligible, i, t_hit, generator):
        B = conf.shape[0]
        commit = select_topk(conf, eligible, torch.ones(B, dtype=torch.long, device=conf.device))
        n_masked = eligible.sum(-1)  # (B,)
        u = torch.rand(B, generator=generator, device=conf.device, dtype=torch.float64)
        t_hit = torch.where(n_masked > 0, t_hit * u ** (1.0 / n_masked.clamp_min(1).double()), t_hit)
        return commit, t_hit

    def commit_time(self, t_hit: Tensor) -> Tensor:
        return t_hit


@register("rule", "ancestral")
@dataclass(frozen=True)
class Ancestral(CommitRule):
    """MDLM / BD3-LM's ancestral reverse step on ``t_i = 1 - i / steps``: each masked column is
    unmasked with probability ``1 / (steps - i)``."""

    steps: int = field(metadata=param("", derived="steps_per_block"))
    random = True

    def __post_init__(self) -> None:
        check_int("steps", self.steps)

    def block_steps(self, width: int) -> int:
        return self.steps

    def select(self, conf, eligible, i, state, generator):
        u = torch.rand(eligible.shape, generator=generator, device=eligible.device, dtype=torch.float64)
        return eligible & (u < 1.0 / (self.steps - i)), state
