"""The commit-rule and proposal slots of the one loop (:func:`dlm.sample.denoise`).

A denoising step proposes a token ``x0`` and a confidence for every position (:func:`propose`,
the proposal :class:`Proposal`); a *commit rule* (a :class:`CommitRule` registered in
:mod:`dlm.registry`) picks which still-masked positions take their proposal. The rules live with
their papers: ``topk`` (LLaDA, :mod:`dlm.llada`), ``threshold`` / ``factor`` (Fast-dLLM,
:mod:`fastdllm.rules`), ``first_hitting`` / ``ancestral`` (BD3-LM, :mod:`bd3lm.rules`), ``dream``
(:mod:`dream`). This module holds what they share: the proposal, the confidences, top-k selection.

All functions are batched, have no per-row Python loops and no ``.item()``, so they run inside
the step loop without host syncs.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from .registry import param, register

REMASKING = ("low_confidence", "random")
CONFIDENCES = REMASKING + ("neg_entropy",)  # what a rule may ask the proposal for (``CommitRule.confidence``)


def num_transfer_tokens(mask_count: Tensor, steps: int) -> Tensor:
    """LLaDA's linear schedule: ``n`` masked tokens over ``steps`` steps.

    Each step commits ``n // steps`` tokens and the first ``n % steps`` steps one more
    (LLaDA Alg. 2 with a linear alpha_t). mask_count: (B,) -> (B, steps) long.
    """
    check_int("steps", steps)
    base = (mask_count // steps)[:, None]  # (B, 1)
    rem = (mask_count % steps)[:, None]  # (B, 1)
    step_idx = torch.arange(steps, device=mask_count.device)[None, :]  # (1, steps)
    return base + (step_idx < rem).long()  # (B, steps)


def add_gumbel_noise(logits: Tensor, temperature: float, generator: Optional[torch.Generator]) -> Tensor:
    """Gumbel-max perturbation in float64 (LLaDA, app. B.3: low precision Gumbel hurts quality).

    argmax(exp(l) / (-log u)^T) = argmax(l / T + Gumbel) for T > 0; identity for T == 0.
    """
    if temperature == 0:
        return logits
    logits = logits.to(torch.float64)
    u = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
    u = u.clamp_min(torch.finfo(torch.float64).tiny)
    return logits.exp() / (-torch.log(u)) ** temperature


def id_tensor(token_ids: tuple[int, ...] | Tensor, device) -> Tensor:
    """``token_ids`` as a (n,) long tensor on ``device`` (a tensor is passed through: the loop builds
    it once per call, so no step copies host data to the device)."""
    if isinstance(token_ids, Tensor):
        return token_ids
    return torch.tensor(token_ids, dtype=torch.long, device=device)


def suppress_logits(logits: Tensor, token_ids: tuple[int, ...] | Tensor) -> Tensor:
    """A copy of ``logits`` with the logits of ``token_ids`` (a tuple or an (n,) tensor) set to -inf."""
    if not len(token_ids):
        return logits
    return logits.index_fill(-1, id_tensor(token_ids, logits.device), float("-inf"))


def top_p_filter(logp: Tensor, top_p: float) -> Tensor:
    """Nucleus filter: keep the smallest most-probable set with mass >= ``top_p``, others -inf.

    logp: (..., V) log-probabilities. The most probable token is always kept."""
    if top_p >= 1.0:
        return logp
    sorted_lp, order = logp.sort(dim=-1, descending=True)  # (..., V)
    probs = sorted_lp.exp()
    drop = (probs.cumsum(-1) - probs) >= top_p  # mass strictly before this token already >= p
    sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
    return torch.empty_like(logp).scatter_(-1, order, sorted_lp)


def propose(
    logits: Tensor,
    temperature: float,
    remasking: str,
    generator: Optional[torch.Generator],
    exclude: tuple[int, ...] | Tensor = (),
    top_p: Optional[float] = None,
) -> tuple[Tensor, Tensor]:
    """Proposed tokens and their confidence. logits (B, T, V) -> x0 (B, T), conf (B, T) float64.

    ``exclude``: ids never proposed, a tuple or an (n,) tensor (the samplers pass [MASK]: a trained
    model gives it ~0 mass, and a proposed [MASK] would leave its column masked; optionally EOS/EoT).
    ``top_p``: None proposes from the raw logits (LLaDA); a number from the float64 SUBS
    log-probabilities (BD3-LM / MDLM: excluded ids impossible), nucleus-filtered to ``top_p``.
    ``low_confidence``: conf = softmax(logits)[x0] (of the unperturbed logits, as LLaDA), computed
    as ``exp(l[x0] - max) / sum exp(l - max)`` (:func:`token_confidence`) without a vocabulary-sized
    float64 softmax. ``random``: conf ~ U(0, 1) (LLaDA's random remasking). ``neg_entropy``:
    conf = sum_v p_v log p_v of the proposal distribution (minus its entropy; float64).
    """
    if remasking not in CONFIDENCES:
        raise ValueError(f"unknown confidence {remasking!r}; expected one of {CONFIDENCES}")
    if top_p is not None:
        lp = suppress_logits(logits.to(torch.float64), exclude)
        logits, exclude = top_p_filter(torch.log_softmax(lp, dim=-1), top_p), ()
    with excluded(logits, exclude) as logits:
        if temperature == 0:  # max(dim) returns the first maximum's index, as argmax, in one faster pass
            top, x0 = logits.max(dim=-1)  # (B, T) each
        else:
            top, x0 = None, add_gumbel_noise(logits, temperature, generator).argmax(dim=-1)  # (B, T)
        if remasking == "random":
            return x0, torch.rand(x0.shape, dtype=torch.float64, device=x0.device, generator=generator)
        if remasking == "neg_entropy":
            p = torch.softmax(logits.to(torch.float64), dim=-1)  # (B, T, V); excluded ids: 0
            return x0, torch.special.xlogy(p, p).sum(-1)  # (B, T)
        return x0, token_confidence(logits, x0, top)


class excluded:
    """``with excluded(logits, ids) as l``: ``logits`` with the columns ``ids`` at -inf inside the
    block, restored after it. In place: a (B, T, len(ids)) write instead of a (B, T, V) copy."""

    def __init__(self, logits: Tensor, ids: tuple[int, ...]) -> None:
        self.logits, self.ids = logits, ids

    def __enter__(self) -> Tensor:
        if len(self.ids):
            self.idx = id_tensor(self.ids, self.logits.device)
            self.saved = self.logits.index_select(-1, self.idx)  # (B, T, n)
            self.logits.index_fill_(-1, self.idx, float("-inf"))
        return self.logits

    def __exit__(self, *exc) -> None:
        if len(self.ids):
            self.logits.index_copy_(-1, self.idx, self.saved)


def token_confidence(logits: Tensor, x0: Tensor, top: Optional[Tensor] = None) -> Tensor:
    """softmax(logits)[x0] in float64, (B, T, V), (B, T) -> (B, T), by log-sum-exp:

        c = exp(l[x0] - m) / sum_v exp(l_v - m),   m = max_v l_v,

    the exponentials in the logits' dtype, summed and divided in float64 (no (B, T, V) float64
    softmax). ``top``: the row maxima m (B, T) when the caller has them. Agrees with the float64
    softmax to ~1e-8 relative on float32 logits (the float32 exp's rounding, averaged by the sum)."""
    lx = logits.gather(-1, x0[..., None])  # (B, T, 1)
    m = logits.amax(dim=-1, keepdim=True) if top is None else top[..., None]  # (B, T, 1)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # an all -inf row stays nan-free
    total = torch.sub(logits, m).exp_().sum(dim=-1, dtype=torch.float64)  # (B, T)
    return torch.exp((lx - m).squeeze(-1).to(torch.float64)) / total


def confidence_ranks(confidence: Tensor) -> Tensor:
    """Rank of each entry within its row, 0 = most confident; ties broken by lower index."""
    order = torch.sort(confidence, dim=-1, descending=True, stable=True).indices  # (B, T)
    ranks = torch.empty_like(order)
    src = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    return ranks.scatter_(-1, order, src)


def masked_confidence(confidence: Tensor, eligible: Tensor) -> Tensor:
    """(B, T) eligible confidences clamped finite, ineligible -inf: eligible always rank first."""
    lowest = torch.finfo(confidence.dtype).min
    return torch.where(eligible, confidence.clamp_min(lowest), torch.full_like(confidence, float("-inf")))


def select_topk(confidence: Tensor, eligible: Tensor, k: Tensor) -> Tensor:
    """Per-row top-k among ``eligible`` positions: bool (B, T). k: (B,) long."""
    conf = masked_confidence(confidence, eligible)
    ranks = confidence_ranks(conf)
    return (ranks < k[:, None]) & eligible


# ------------------------------------------------------------------------------ rule objects
def check_real(name: str, value, low: float, high: float = math.inf, low_open: bool = True) -> float:
    """``value`` as a float in ``(low, high]`` (``[low, high]`` unless ``low_open``); TypeError for a
    non-number, ValueError for NaN, infinity or out of range, naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or v > high or v < low or (low_open and v == low):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}")
    return v


def check_int(name: str, value, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_sampling(temperature: float, remasking: str, cfg_scale: float = 0.0) -> None:
    """temperature, cfg_scale: finite numbers >= 0; remasking one of ``REMASKING``."""
    if remasking not in REMASKING:
        raise ValueError(f"unknown remasking {remasking!r}; expected one of {REMASKING}")
    for name, v in (("temperature", temperature), ("cfg_scale", cfg_scale)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")


@register("proposal", "llada")
@dataclass(frozen=True)
class Proposal:
    """How a step turns logits into proposals (:func:`propose`). top_p None: LLaDA's raw logits;
    a number: BD3-LM's SUBS log-probabilities with a nucleus filter. suppress_eos: EOS/EoT never
    proposed (LLaDA's ``logits_eos_inf``); eos_last: EOS/EoT proposals get the lowest confidence
    (LLaDA's ``confidence_eos_eot_inf``)."""

    temperature: float = field(default=0.0, metadata=param("Gumbel-max temperature (0: greedy)", min=0.0))
    remasking: str = field(default="low_confidence", metadata=param(
        "confidence of a proposal: its softmax probability or a uniform draw (LLaDA)", choices=REMASKING))
    top_p: Optional[float] = field(default=None, metadata=param(
        "nucleus filter: propose from the smallest token set holding this probability mass", min=0.0, max=1.0,
        open_min=True))
    suppress_eos: bool = field(default=False, metadata=param("never propose EOS/EoT (LLaDA's logits_eos_inf)"))
    eos_last: bool = field(default=False, metadata=param(
        "EOS/EoT proposals rank last (LLaDA's confidence_eos_eot_inf)"))

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.remasking)
        if self.top_p is not None:
            check_real("top_p", self.top_p, 0.0, 1.0)

    def __call__(self, logits: Tensor, where: Tensor, generator: Optional[torch.Generator],
                 exclude: tuple[int, ...] | Tensor = (), confidence: Optional[str] = None) -> tuple[Tensor, Tensor]:
        """:func:`propose` at every column (``where`` is not used: the noise covers the block);
        ``confidence`` (a rule's) overrides ``remasking``."""
        return propose(logits, self.temperature, confidence or self.remasking, generator, exclude, self.top_p)


class CommitRule:
    """Interface of a commit rule. ``block_steps(width)``: steps a block with ``width`` answer
    columns takes (None: until it is clean); ``begin(eligible, n_steps)``: per-block state;
    ``select(conf, eligible, i, state, generator) -> (commit (B, L) bool, state)``: never commits an
    ineligible column; ``commit_time(state)``: (B,) time recorded for this step's commits or None;
    ``confidence``: the confidence the rule needs (overrides the proposal's remasking);
    ``selects_first(i)``: at step ``i`` the rule selects without confidences (``conf`` None) and
    the proposal then samples only the selected columns; ``random``: it draws from the generator
    even at temperature 0. ``span``: the block's ``(lo, hi, T)``."""

    confidence: Optional[str] = None
    records_time = False
    random = False  # draws from the generator even at temperature 0

    def selects_first(self, i: int) -> bool:
        return False

    @property
    def label(self) -> str:
        return self.name

    def block_steps(self, width: int) -> Optional[int]:
        return None

    def begin(self, eligible: Tensor, n_steps: Optional[int], span: Optional[tuple] = None):
        return None

    def commit_time(self, state) -> Optional[Tensor]:
        return None


