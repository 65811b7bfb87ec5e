"""EB-Sampler (Ben-Hamu et al. 2025, "Accelerated Sampling from Masked Diffusion Models via Entropy
Bounded Unmasking"), a commit rule of the one loop.

Each step sorts the still-masked columns by the entropy of their proposal distribution, lowest
first, and commits the longest prefix ``U`` of that order whose entropies satisfy

    sum_{l in U} H(p_l) - max_{l in U} H(p_l) <= gamma,

an upper bound on the mutual information between the committed tokens (so they are close to
independent and one forward may decide them together); at least one column per step (the sum over
one column minus its max is 0). The block steps until it is clean; ``gamma = 0`` commits one
column per step, the most certain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from dlm.commit import CommitRule, masked_confidence, select_topk
from dlm.registry import param, register


def select_entropy_bounded(neg_entropy: Tensor, eligible: Tensor, gamma: float) -> Tensor:
    """The EB rule: neg_entropy (B, L) float (sum p log p of each column's proposal), eligible
    (B, L) bool -> (B, L) bool, the longest lowest-entropy prefix with sum - max <= gamma."""
    conf = masked_confidence(neg_entropy, eligible)  # (B, L), ineligible -inf
    h = (-torch.sort(conf, dim=-1, descending=True, stable=True).values).clamp_min(0.0)  # (B, L) ascending
    before = h.cumsum(-1) - h  # (B, L): sum of the prefix minus its largest (its last) entropy
    k = ((before <= gamma) & torch.isfinite(h)).sum(-1)  # (B,): a prefix, since before never decreases
    return select_topk(neg_entropy, eligible, k.clamp_min(1))


@register("rule", "eb")
@dataclass(frozen=True)
class EntropyBounded(CommitRule):
    """EB-Sampler's entropy-bounded commit (:func:`select_entropy_bounded`); steps until the block is clean."""

    gamma: float = field(default=0.1, metadata=param(
        "EB-Sampler: commit the lowest-entropy columns while their summed entropy minus its largest <= gamma",
        min=0.0, sweep=(0.01, 0.1, 0.5, 1.0, 2.0), tag="g", probe=8.0))
    confidence = "neg_entropy"

    @property
    def label(self) -> str:
        return f"eb={self.gamma:g}"

    def select(self, conf, eligible, i, state, generator):
        return select_entropy_bounded(conf, eligible, self.gamma), state
