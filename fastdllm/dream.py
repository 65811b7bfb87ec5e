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
block's remaining steps (:class:`dream.sampler.DreamSchedule` after the first column). The
threshold rule after the first step is :class:`fastdllm.rules.Threshold` (the reference: top-1 plus
every confidence >= tau), the factor rule :class:`fastdllm.rules.Factor` (not in the reference).

Without a cache (``cache`` None or ``"none"``) Fast-dLLM runs another sampler, its
``dream/model/generation_utils.py`` (its eval's ``use_cache=false``): no blocks, no first-column
step. Its ``confidence_threshold`` mode has a per-step quota (masked columns // ``steps``): each
step takes the ``quota + carried`` most confident masked columns as candidates and commits the
first and every other one with confidence >= tau; the dropped candidates are carried to the next
step, and after ``steps`` steps it adds steps until nothing is left (:class:`StepQuota`). Its other
modes are Dream's own sampler (``alg="entropy"``: :class:`DreamSchedule` from the first step on).
Both run here inside each block; one block of ``gen_length`` is the reference, token for token.

These rules are the registered family ``dream`` (:class:`FastDreamFamily`): a sampler's
``family="dream"`` runs them, ``"llada"`` the LLaDA rules (a Dream model then runs Fast-dLLM's
LLaDA sampler with the cached window widened by one column for the shifted logits), ``"auto"``
the Dream rules for models with ``config.shift_logits`` (Dream's family), else the LLaDA rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from dlm import registry
from dlm.commit import CommitRule, check_int, num_transfer_tokens
from dlm.llada import LLaDAFamily
from dlm.registry import param, register
from dlm.spec import Family
from dream.sampler import DreamProposal, DreamSchedule, reference_row

NO_CACHE = (None, "none")  # no cache: fastdllm.generate's spelling and the policy's name


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


@dataclass(frozen=True)
class StepQuota(CommitRule):
    """Fast-dLLM's no-cache Dream sampler (``dream/model/generation_utils.py``, ``_sample`` with
    ``alg="confidence_threshold"``): the threshold or factor rule ``inner`` choosing among a quota.

    A block of ``n`` masked columns has ``quota = n // steps`` per step (the reference asserts
    ``n % steps == 0``; otherwise LLaDA's split, :func:`dlm.commit.num_transfer_tokens`). Step ``i``
    takes the ``current = quota_i + carried`` most confident masked columns as candidates
    (``torch.topk`` over the reference's whole-sequence confidence row, so ties break as there);
    threshold: it commits the first candidate and every other one with confidence >= tau (the
    reference drops those ``< threshold``); factor (not in the reference): the top ``m`` candidates
    for the largest ``m <= current`` with ``(m + 1)(1 - c(m)) < f``, at least one. The candidates
    left are carried to the next step. After ``steps`` steps the quota is 0 and the carried
    candidates, every masked column left, go on until the block is clean (the reference's
    ``steps += 1`` at its last step). Each step commits at least one column."""

    inner: CommitRule
    steps: int

    def __post_init__(self) -> None:
        check_int("steps", self.steps)
        if self.inner.name not in ("threshold", "factor"):
            raise ValueError(f"StepQuota wraps the threshold or factor rule, got {self.inner.name!r}")

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def label(self) -> str:
        return f"{self.inner.label},step_quota"

    @property
    def confidence(self) -> Optional[str]:
        return self.inner.confidence

    @property
    def random(self) -> bool:
        return bool(getattr(self.inner, "random", False))

    def block_steps(self, width: int) -> None:
        return None  # until the block is clean: ``steps`` steps and the reference's added ones

    def begin(self, eligible: Tensor, n_steps: Optional[int], span: Optional[tuple] = None):
        quota = num_transfer_tokens(eligible.sum(-1), self.steps)  # (B, steps)
        return quota, torch.zeros_like(quota[:, 0]), span  # carried: (B,)

    def select(self, conf, eligible, i, state, generator):
        quota, carried, span = state
        current = carried + quota[:, i] if i < self.steps else carried  # (B,) candidates of the step
        commit = torch.zeros_like(eligible)  # (B, L)
        kmax = int(current.max())
        if kmax == 0:
            return commit, state
        masked = torch.where(eligible, conf, torch.full_like(conf, float("-inf")))
        row, left = (masked, 0) if span is None else reference_row(masked, span, "row")  # (B, T)
        vals, idx = torch.topk(row, kmax, dim=-1)  # (B, kmax), most confident first
        pos = torch.arange(kmax, device=conf.device)[None, :]  # (1, kmax)
        cand = (pos < current[:, None]) & torch.isfinite(vals)  # (B, kmax), a prefix of each row
        if self.inner.name == "threshold":
            keep = cand & ((pos == 0) | (vals >= self.inner.threshold))
        else:
            ok = cand & ((pos + 2).to(vals.dtype) * (1 - vals) < self.inner.factor)  # m = pos + 1
            m = torch.where(ok, pos + 1, torch.zeros_like(pos)).amax(-1).clamp_min(1)  # (B,)
            keep = cand & (pos < m[:, None])
        hit = torch.zeros_like(row, dtype=torch.bool).scatter_(-1, idx, keep)  # (B, T)
        commit = hit[:, left:left + conf.shape[1]] & eligible
        kept = keep.sum(-1)  # (B,)
        carried = torch.minimum(current - kept, eligible.sum(-1) - kept)  # the second never binds
        return commit, (quota, carried, span)


def dream_block_rule(rule: str, steps_per_block: int, threshold: Optional[float] = None,
                     factor: Optional[float] = None, eps: float = 1e-3, alg_temp: Optional[float] = None,
                     cache: Optional[str] = None) -> CommitRule:
    """Fast-dLLM's Dream rule for ``rule`` under ``cache``. Cached (its block sampler,
    ``generation_utils_block.py``): :class:`FirstColumn` around ``topk`` (negative entropy on
    Dream's timesteps; ``alg_temp`` draws over the reference's confidence row of ``cache``:
    ``[lo, T)`` for prefix, the block for dual) or the ``threshold`` / ``factor`` rule. Without a
    cache (``NO_CACHE``; its ``generation_utils.py``): ``topk`` is Dream's entropy schedule from the
    block's first step (the confidence row the whole sequence), ``threshold`` / ``factor`` are
    :class:`StepQuota` with ``steps_per_block`` steps."""
    if rule == "topk":
        if cache in NO_CACHE:
            return DreamSchedule(steps_per_block, alg="entropy", eps=eps, alg_temp=alg_temp, window="row")
        window = "block" if cache == "dual" else "to_end"
        return FirstColumn(DreamSchedule(steps_per_block, alg="entropy", eps=eps, alg_temp=alg_temp, window=window))
    if alg_temp is not None:
        raise ValueError(f"alg_temp is an option of the scheduled Dream rule, not of {rule!r}")
    if rule not in ("threshold", "factor"):
        raise ValueError(f"the Dream block rules are 'topk', 'threshold' and 'factor', got {rule!r}")
    inner = make_rule(rule, steps_per_block, threshold, factor)
    return StepQuota(inner, steps_per_block) if cache in NO_CACHE else FirstColumn(inner)


def make_rule(name: str, steps_per_block: int, threshold: Optional[float] = None,
              factor: Optional[float] = None) -> CommitRule:
    """The registered rule ``name`` with its number (``threshold`` / ``factor``)."""
    numbers = {k: v for k, v in (("threshold", threshold), ("factor", factor)) if v is not None}
    return registry.build("rule", name, numbers, {"steps_per_block": steps_per_block})


DREAM_BLOCK_RULES = ("topk", "threshold", "factor")  # the rules Fast-dLLM's Dream sampler has


@register("family", "dream")
@dataclass(frozen=True)
class FastDreamFamily(Family):
    """Dream-style models (``config.shift_logits``) under Fast-dLLM's Dream sampler: ``topk`` /
    ``threshold`` / ``factor`` take their Dream block form (:func:`dream_block_rule`), proposals are
    Dream's (``sample_tokens``) and cached windows start at the block. Other rules, and policies
    without family rules (exact, ar), run as on a LLaDA-style model."""

    eps: float = field(default=1e-3, metadata=param("Dream's timestep floor: t runs from 1 to eps", min=0.0,
                                                    max=1.0, open_min=True))
    alg_temp: Optional[float] = field(default=None, metadata=param(
        "Dream: draw the committed columns from softmax(confidence / alg_temp) (unset: the most confident)",
        min=0.0))
    proposal = "dream"

    @classmethod
    def matches(cls, config) -> bool:
        return bool(config.shift_logits)

    def compose(self, rule: str, options: dict, steps_per_block: int, policy_cls):
        if rule not in DREAM_BLOCK_RULES or not policy_cls.family_rules:
            return LLaDAFamily().compose(rule, options, steps_per_block, policy_cls)
        commit = dream_block_rule(rule, steps_per_block, options.get("threshold"), options.get("factor"), self.eps,
                                  self.alg_temp, policy_cls.name)
        proposal = {k: v for k, v in options.items() if k in ("temperature", "top_p", "top_k")}
        return commit, DreamProposal(**proposal), True
