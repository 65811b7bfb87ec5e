"""Fast-dLLM's block rules for Dream-family models (NVlabs/Fast-dLLM
``dream/model/generation_utils_block.py``), as commit rules of the one loop.

Fast-dLLM's Dream sampler differs from its LLaDA sampler in two rules:

1. the full forward at a block's start commits *exactly one* column, the block's first
   (``x[:, block_start] = x0[:, block_start]``), whatever the threshold (:class:`FirstColumn`);
2. since that column is then committed, the cached steps recompute the window starting *at* the
   block (prefix ``[lo, T)``, dual ``[lo, hi)``) and read column ``lo - 1`` from the cache filled
   at the block start (``PrefixCache(at_block=True)``): column ``lo``'s own logit, which the
   window's shift gives from its own hidden state, is never used.

Its non-threshold mode runs Dream's timestep schedule with negative-entropy confidence on the
block's remaining steps (:class:`dlm.dream.DreamSchedule` after the first column). The threshold
rule after the first step is :class:`dlm.commit.Threshold` (the reference: top-1 plus every
confidence >= tau), the factor rule :class:`dlm.commit.Factor` (not in the reference).

``rules``: ``"dream"`` these rules, ``"llada"`` the LLaDA rules (a Dream model then runs Fast-dLLM's
LLaDA sampler with the cached window widened by one column for the shifted logits), ``"auto"``
the Dream rules for models with ``config.shift_logits`` (Dream's family), else the LLaDA rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from dlm.commit import CommitRule, Proposal, check_sampling, make_rule
from dlm.dream import DreamProposal, DreamSchedule

RULE_SETS = ("auto", "llada", "dream")


def resolve_rules(rules: str, model) -> str:
    """``"llada"`` or ``"dream"``: ``rules`` with ``"auto"`` decided by ``model.config.shift_logits``."""
    if rules not in RULE_SETS:
        raise ValueError(f"rules must be one of {RULE_SETS}, got {rules!r}")
    if rules == "auto":
        return "dream" if model.config.shift_logits else "llada"
    return rules


@dataclass(frozen=True)
class FirstColumn(CommitRule):
    """Step 0 of a block commits only the block's first column (if still masked); later steps
    are ``inner``'s, with the same step index (Fast-dLLM's Dream sampler)."""

    inner: CommitRule

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def label(self) -> str:
        return f"{self.inner.label},first_column"

    @property
    def confidence(self) -> Optional[str]:
        return self.inner.confidence

    def block_steps(self, width: int) -> Optional[int]:
        return self.inner.block_steps(width)

    def selects_first(self, i: int) -> bool:  # step 0 samples the first column only
        return i == 0 or self.inner.selects_first(i)

    def begin(self, eligible: Tensor, n_steps: Optional[int], span: Optional[tuple] = None):
        return self.inner.begin(eligible, n_steps, span)

    def select(self, conf, eligible, i, state, generator):
        if i > 0:
            return self.inner.select(conf, eligible, i, state, generator)
        commit = torch.zeros_like(eligible)  # (B, L)
        commit[:, 0] = eligible[:, 0]
        return commit, state


def dream_block_rule(rule: str, steps_per_block: int, threshold: Optional[float] = None,
                     factor: Optional[float] = None, eps: float = 1e-3, alg_temp: Optional[float] = None,
                     cache: Optional[str] = None) -> FirstColumn:
    """Fast-dLLM's Dream rule for ``rule``: ``topk`` is the non-threshold mode (negative entropy on
    Dream's timesteps; ``alg_temp`` draws over the reference's confidence row of ``cache``:
    ``[lo, T)`` for prefix / no cache, the block for dual), ``threshold`` / ``factor`` those rules."""
    if rule == "topk":
        window = "block" if cache == "dual" else "to_end"
        return FirstColumn(DreamSchedule(steps_per_block, eps, "entropy", alg_temp, window))
    if alg_temp is not None:
        raise ValueError(f"alg_temp is an option of the scheduled Dream rule, not of {rule!r}")
    if rule not in ("threshold", "factor"):
        raise ValueError(f"the Dream block rules are 'topk', 'threshold' and 'factor', got {rule!r}")
    return FirstColumn(make_rule(rule, steps_per_block, threshold, factor))


def block_sampler(family: str, rule: str, steps_per_block: int, threshold: Optional[float] = None,
                  factor: Optional[float] = None, temperature: float = 0.0, remasking: str = "low_confidence",
                  top_p: Optional[float] = None, top_k: Optional[int] = None, eps: Optional[float] = None,
                  alg_temp: Optional[float] = None, cache: Optional[str] = None):
    """(commit rule, proposal) of Fast-dLLM's ``family`` (``"llada"`` / ``"dream"``) for ``rule``
    (``topk`` / ``threshold`` / ``factor``): the one place that picks a family's rule and proposal
    (:func:`fastdllm.generate` and ``experiments.strategy.Strategy`` both ask it).

    Dream: :func:`dream_block_rule` and Dream's ``sample_tokens`` proposal (``top_p``, ``top_k``);
    ``remasking`` is a LLaDA option. LLaDA: :func:`dlm.commit.make_rule` and LLaDA's proposal
    (``top_p``: BD3-LM's nucleus over SUBS log-probabilities); ``top_k``, ``eps`` and ``alg_temp``
    are Dream options. ``eps`` None means Dream's 1e-3."""
    check_sampling(temperature, remasking)
    if family == "dream":
        if remasking != "low_confidence":
            raise ValueError("remasking is an option of the LLaDA rules; the Dream rules rank by confidence")
        return (dream_block_rule(rule, steps_per_block, threshold, factor, 1e-3 if eps is None else eps, alg_temp,
                                 cache), DreamProposal(temperature, top_p, top_k))
    if family != "llada":
        raise ValueError(f"family must be 'llada' or 'dream', got {family!r}")
    for opt, value in (("top_k", top_k), ("eps", eps), ("alg_temp", alg_temp)):
        if value is not None:
            raise ValueError(f"{opt} is an option of the Dream rules (rules='dream')")
    return make_rule(rule, steps_per_block, threshold, factor), Proposal(temperature, remasking, top_p)
