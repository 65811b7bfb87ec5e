"""LLaDA's Monte-Carlo ELBO (Nie et al. 2025, eq. 6) of a bidirectional masked diffusion model.

For a continuation ``x`` of ``L`` tokens after a clean prefix,

    -log p(x) <= E_{l ~ U{1..L}} E_{|M| = l} (L / l) * sum_{i in M} -log p(x^i | x_M, prefix)

where ``M`` is a uniformly random set of ``l`` masked positions (LLaDA's ``get_log_likelihood``).
The rows of one forward use stratified ``l`` (LLaDA's ``forward_process``). Used as the
log-likelihood of the lm-eval ``fastdllm`` model and as the cross-check of the MDLM NELBO in
``experiments.perplexity``.

``subs=True`` scores with the mask logit set to ``-inf`` (the SUBS parameterisation of
MDLM / BD3-LM, whose models never learn to give ``[MASK]`` zero probability themselves).
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _check_mc(mc_num, batch_size) -> tuple[int, int]:
    mc_num, batch_size = _positive("mc_num", mc_num), _positive("mc_batch_size", batch_size)
    if mc_num % batch_size:
        raise ValueError(f"mc_num={mc_num} must be a multiple of mc_batch_size={batch_size}")
    return mc_num, batch_size


@torch.no_grad()
def mc_loglikelihood(model, prefix: Tensor, target: Tensor, mc_num: int = 128, batch_size: int = 32,
                     generator: Optional[torch.Generator] = None, mask_id: Optional[int] = None,
                     subs: bool = False) -> float:
    """LLaDA's Monte-Carlo ELBO of ``target`` (L,) after ``prefix`` (P,) (P may be 0): LLaDA eq. 6.

    ``mc_num / batch_size`` forwards of ``batch_size`` rows; row ``i`` masks ``x_i`` uniformly
    chosen continuation tokens, ``x_i`` stratified over ``{1..L}`` (LLaDA's ``forward_process``),
    and contributes ``sum_masked CE * L / x_i``. Returns minus the mean over rows (nats).
    Randomness (on the CPU) comes only from ``generator``."""
    mc_num, batch_size = _check_mc(mc_num, batch_size)
    if prefix.dim() != 1 or target.dim() != 1 or target.numel() == 0:
        raise ValueError("prefix must be (P,) and target a non-empty (L,) tensor")
    mask_id = model.config.mask_token_id if mask_id is None else mask_id
    dev = next(model.parameters()).device
    P, L, b = prefix.numel(), target.numel(), batch_size
    seq = torch.cat([prefix, target]).to(dev)[None].expand(b, -1)  # (b, P + L)
    total = 0.0
    for _ in range(mc_num // b):
        k = int(torch.randint(1, L + 1, (), generator=generator))
        x = torch.round(torch.linspace(float(k), k + (b - 1) * (L / b), steps=b)).long()
        x = (x - 1) % L + 1  # (b,) masked tokens per row, in 1..L
        is_mask = torch.arange(L)[None, :] < x[:, None]  # (b, L)
        is_mask = torch.stack([row[torch.randperm(L, generator=generator)] for row in is_mask]).to(dev)
        noisy = torch.where(is_mask, torch.full_like(seq[:, P:], mask_id), seq[:, P:])
        logits = model(torch.cat([seq[:, :P], noisy], dim=1), logits_slice=slice(P, P + L))  # (b, L, V)
        lg = logits[is_mask]  # (n_masked, V)
        lg = lg.float() if lg.dtype in (torch.float16, torch.bfloat16) else lg
        if subs:
            lg = lg.index_fill(-1, torch.tensor([mask_id], device=dev), float("-inf"))
        ce = F.cross_entropy(lg, seq[:, P:][is_mask], reduction="none")  # (n_masked,)
        weight = (L / x.to(dev, lg.dtype))[:, None].expand(b, L)[is_mask]  # 1 / p_mask
        total += float((ce * weight).sum()) / b
    return -total / (mc_num // b)


@torch.no_grad()
def mc_perplexity(model, sequences: Iterable[Tensor], mc_num: int = 8, batch_size: int = 8,
                  generator: Optional[torch.Generator] = None, subs: bool = False) -> dict:
    """``exp(sum_seq -ELBO(seq) / tokens)`` over unconditional sequences (each row of each (B, L)
    tensor, or ``{"input_ids": ...}`` dict, is scored on its own with :func:`mc_loglikelihood`).
    Returns ``{"nelbo": nats/token, "ppl", "tokens", "mc_num"}``."""
    mc_num, batch_size = _check_mc(mc_num, batch_size)
    nats, tokens = 0.0, 0
    empty = torch.zeros(0, dtype=torch.long)
    for batch in sequences:
        ids = batch["input_ids"] if isinstance(batch, dict) else batch  # (B, L)
        for row in ids:
            nats -= mc_loglikelihood(model, empty.to(row.device), row, mc_num, batch_size, generator, subs=subs)
            tokens += row.numel()
    if tokens == 0:
        raise ValueError("sequences: empty dataset, nothing to score")
    nelbo = nats / tokens
    return {"nelbo": nelbo, "ppl": math.exp(min(nelbo, 700.0)), "tokens": tokens, "mc_num": mc_num}
