"""Pure, vectorized commit rules shared by every sampler.

A denoising step proposes a token ``x0`` and a confidence for every position; a *commit rule*
picks which still-masked positions take their proposal. All functions here are batched, have no
per-row Python loops and no ``.item()``, so they run inside the step loop without host syncs.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

REMASKING = ("low_confidence", "random")


def num_transfer_tokens(mask_count: Tensor, steps: int) -> Tensor:
    """LLaDA's linear schedule: ``n`` masked tokens over ``steps`` steps.

    Each step commits ``n // steps`` tokens and the first ``n % steps`` steps one more
    (LLaDA Alg. 2 with a linear alpha_t). mask_count: (B,) -> (B, steps) long.
    """
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")
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


def suppress_logits(logits: Tensor, token_ids: tuple[int, ...]) -> Tensor:
    """A copy of ``logits`` with the logits of ``token_ids`` set to -inf."""
    if not token_ids:
        return logits
    idx = torch.tensor(token_ids, dtype=torch.long, device=logits.device)
    return logits.index_fill(-1, idx, float("-inf"))


def propose(
    logits: Tensor,
    temperature: float,
    remasking: str,
    generator: Optional[torch.Generator],
    exclude: tuple[int, ...] = (),
) -> tuple[Tensor, Tensor]:
    """Proposed tokens and their confidence. logits (B, T, V) -> x0 (B, T), conf (B, T) float64.

    ``exclude``: ids never proposed (the samplers pass [MASK]: a trained model gives it ~0 mass,
    and a proposed [MASK] would leave its column masked; optionally EOS/EoT too).
    ``low_confidence``: conf = softmax(logits)[x0] (of the unperturbed logits, as LLaDA).
    ``random``: conf ~ U(0, 1) (LLaDA's random remasking).
    """
    logits = suppress_logits(logits, exclude)
    x0 = add_gumbel_noise(logits, temperature, generator).argmax(dim=-1)  # (B, T)
    if remasking == "low_confidence":
        p = torch.softmax(logits.to(torch.float64), dim=-1)
        conf = p.gather(-1, x0[..., None]).squeeze(-1)  # (B, T)
    elif remasking == "random":
        conf = torch.rand(x0.shape, dtype=torch.float64, device=x0.device, generator=generator)
    else:
        raise ValueError(f"unknown remasking {remasking!r}; expected one of {REMASKING}")
    return x0, conf


def confidence_ranks(confidence: Tensor) -> Tensor:
    """Rank of each entry within its row, 0 = most confident; ties broken by lower index."""
    order = torch.sort(confidence, dim=-1, descending=True, stable=True).indices  # (B, T)
    ranks = torch.empty_like(order)
    src = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    return ranks.scatter_(-1, order, src)


def _masked(confidence: Tensor, eligible: Tensor) -> Tensor:
    """Eligible confidences clamped finite, ineligible -inf: eligible always rank first."""
    lowest = torch.finfo(confidence.dtype).min
    return torch.where(eligible, confidence.clamp_min(lowest), torch.full_like(confidence, float("-inf")))


def select_topk(confidence: Tensor, eligible: Tensor, k: Tensor) -> Tensor:
    """Per-row top-k among ``eligible`` positions: bool (B, T). k: (B,) long."""
    conf = _masked(confidence, eligible)
    ranks = confidence_ranks(conf)
    return (ranks < k[:, None]) & eligible


def select_threshold(confidence: Tensor, eligible: Tensor, threshold: float) -> Tensor:
    """Fast-dLLM threshold rule: the most confident eligible position, plus every eligible one
    with confidence >= threshold (Wu et al. 2025, Thm. 1 / eq. 5). bool (B, T)."""
    conf = _masked(confidence, eligible)
    top = confidence_ranks(conf) == 0
    return ((conf >= threshold) | top) & eligible


def select_factor(confidence: Tensor, eligible: Tensor, factor: float) -> Tensor:
    """Fast-dLLM factor rule: with c(1) >= c(2) >= ... the sorted eligible confidences, commit
    the top n for the largest n with (n + 1)(1 - c(n)) < f, at least one (Wu et al. 2025, eq. 6).
    bool (B, T)."""
    conf = _masked(confidence, eligible)
    sorted_conf = torch.sort(conf, dim=-1, descending=True, stable=True).values  # (B, T)
    n = torch.arange(1, conf.shape[-1] + 1, device=conf.device, dtype=conf.dtype)  # (T,)
    ok = ((n + 1) * (1 - sorted_conf) < factor) & torch.isfinite(sorted_conf)  # (B, T)
    # largest n with ok[n-1] True: index of the last True + 1 (0 when none)
    last = torch.where(ok, n.expand_as(ok), torch.zeros_like(sorted_conf)).amax(dim=-1)  # (B,)
    k = last.clamp_min(1).long()
    return select_topk(confidence, eligible, k)
