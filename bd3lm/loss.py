"""BD3-LM NELBO (Arriola et al., ICLR 2025, eq. 8) with vectorized ``x_t ⊕ x_0`` training.

For blocks ``x^1..x^B`` of ``L'`` tokens, linear schedule ``alpha_t = 1 - t`` (one ``t`` per
(sequence, block)) and the SUBS parameterisation (mask-token logit set to -inf; an unmasked
position carries its own token and contributes 0),

    L_BD(x; theta) = sum_b E_t  E_q  (1 / t) * sum_{l : x_t^{b,l} = [MASK]} -log p_theta(x^{b,l} | x_t^b, x^{<b})

(BD3-LM eq. 8, with ``-alpha'_t / (1 - alpha_t) = 1 / t``). All blocks are evaluated in ONE
forward over ``[prompt | x_t | x_0]`` with the mask of :mod:`bd3lm.masks`; only the ``x_t``
logits are computed (``logits_slice``).

Special cases of the same code: ``L' = 1`` is autoregressive (with ``t = 1`` every token is
masked, weight 1, and the NELBO is the exact AR NLL); ``L' = R`` is MDLM (one block, the
pruned layout has no clean half).

Batches (dicts, as :mod:`dlm.objectives`):

- pre-training: ``input_ids`` (B, L), optional ``attention_mask`` (B, L) 0/1 (padding is
  neither attended nor counted); ``L`` must be a multiple of ``L'``;
- SFT (LLaDA-style): ``input_ids`` (B, L) = prompt + EOS-padded response and
  ``prompt_lengths`` (B,). Rows are re-laid out as ``[left-padded prompt (P = max prompt) |
  response (R = L - min prompt, rounded up to L')]``; prompts stay clean, every response token
  (EOS padding included, as LLaDA SFT) is in the loss; columns past a row's end are
  padding. RoPE positions stay the original column indices.

The loss is the mean over rows of (row NELBO sum / row token count), so averaging equal DDP
shards reproduces the full-batch loss (the :mod:`dlm.objectives` convention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from dlm.attention import padding_positions

from .masks import check_layout, dense_bd3_mask, flex_bd3_mask
from .schedules import NOISE_R, NOISE_U, UNCLIPPED, ClipSchedule, block_masks, draw_noise

BACKENDS = ("sdpa", "math", "flex", "blocksparse")


def model_config(model):
    """``config`` of a Transformer, or of one wrapped by DDP / ``torch.compile`` / BD3LM."""
    for obj in (model, getattr(model, "module", None), getattr(model, "_orig_mod", None),
                getattr(model, "model", None)):
        cfg = getattr(obj, "config", None)
        if cfg is not None and hasattr(cfg, "mask_token_id"):
            if getattr(cfg, "shift_logits", False):
                raise ValueError("BD3-LM needs a model with shift_logits=False")
            return cfg
    raise TypeError(f"model must be a dlm Transformer (with .config), got {type(model).__name__}")


@dataclass(frozen=True)
class BD3Batch:
    """A batch laid out for the NELBO: response ``x0`` after an optional left-padded prompt."""

    x0: Tensor  # (B, R) response tokens
    keep: Optional[Tensor]  # (B, R) bool real tokens (loss + attendable); None = all
    slot: Tensor  # (B, R) long: block slot of each response column (index into bd3_u)
    src: Tensor  # (B, R) long: source column (index into bd3_r)
    positions: Tensor  # (B, P + R) RoPE positions
    prompt: Optional[Tensor] = None  # (B, P)
    prompt_keep: Optional[Tensor] = None  # (B, P) bool

    @property
    def prompt_len(self) -> int:
        return 0 if self.prompt is None else self.prompt.shape[1]


def _check_ids(batch) -> Tensor:
    if not isinstance(batch, dict):
        raise TypeError(f"batch must be a dict of tensors, got {type(batch).__name__}")
    ids = batch.get("input_ids")
    if not isinstance(ids, Tensor):
        raise TypeError("batch['input_ids'] must be a Tensor")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"batch['input_ids'] must be int32/int64, got {ids.dtype}")
    if ids.dim() != 2 or ids.numel() == 0:
        raise ValueError(f"batch['input_ids'] must be a non-empty (B, L) tensor, got {tuple(ids.shape)}")
    return ids.long()


def layout_batch(batch: dict, block_size: int, cfg) -> BD3Batch:
    """Validate a pre-training or SFT batch and lay it out (see module docstring)."""
    ids = _check_ids(batch)
    B, L = ids.shape
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if bool((ids == cfg.mask_token_id).any()):
        raise ValueError(f"batch['input_ids'] contains the mask id {cfg.mask_token_id}")
    dev = ids.device
    cols = torch.arange(L, device=dev)
    pl = batch.get("prompt_lengths")
    if pl is None:
        check_layout(L, block_size)
        am = batch.get("attention_mask")
        keep, positions = None, cols.expand(B, L)
        if am is not None:
            if not isinstance(am, Tensor) or am.shape != ids.shape:
                raise ValueError(f"batch['attention_mask'] must have shape {(B, L)}")
            keep, positions = am.bool(), padding_positions(am)
        slot = (cols // block_size).expand(B, L)
        return BD3Batch(ids, keep, slot, cols.expand(B, L), positions)
    if not isinstance(pl, Tensor) or pl.shape != (B,) or pl.dtype.is_floating_point or pl.dtype == torch.bool:
        raise ValueError(f"batch['prompt_lengths'] must be an integer ({B},) tensor")
    pl = pl.to(dev).long()
    if bool(((pl < 0) | (pl >= L)).any()):
        raise ValueError(f"batch['prompt_lengths'] must lie in [0, {L}) (non-empty response)")
    P, p_min = int(pl.max()), int(pl.min())
    R = -(-(L - p_min) // block_size) * block_size
    j = torch.arange(R, device=dev)[None, :]  # (1, R)
    src = pl[:, None] + j  # (B, R) original column of response column j
    keep = src < L
    eos = cfg.eos_token_id if cfg.eos_token_id is not None else cfg.pad_token_id or 0
    src_c = src.clamp_max(L - 1)
    x0 = torch.where(keep, ids.gather(1, src_c), torch.full_like(src, eos))  # (B, R)
    slot = (j // block_size).expand(B, R)
    prompt = prompt_keep = None
    pos = src
    if P > 0:
        k = torch.arange(P, device=dev)[None, :]
        psrc = k - (P - pl[:, None])  # (B, P): left padding
        prompt_keep = psrc >= 0
        pad = cfg.pad_token_id if cfg.pad_token_id is not None else eos
        prompt = torch.where(prompt_keep, ids.gather(1, psrc.clamp_min(0)), torch.full_like(psrc, pad))
        pos = torch.cat([padding_positions(prompt_keep.long()), src], dim=1)  # (B, P + R)
    return BD3Batch(x0, keep, slot, src_c, pos, prompt, prompt_keep)


def forward_process(bb: BD3Batch, u: Tensor, r: Tensor, schedule: ClipSchedule, block_size: int,
                    mask_id: int, fixed_t: Optional[float] = None) -> tuple[Tensor, Tensor, Tensor]:
    """Noisy response ``x_t`` (B, R), masked (B, R) bool and per-token times ``t`` (B, R).

    u: (B, S) block uniforms, r: (B, K, L) token uniforms (see :func:`draw_noise`).
    fixed_t: use this ``t`` for every block instead (``1.0``: all masked, exact AR NLL at L'=1).
    """
    B, R = bb.x0.shape
    if u.shape[0] != B or r.shape[0] != B or u.dim() != 2 or r.dim() != 3:
        raise ValueError(f"noise shapes {tuple(u.shape)}, {tuple(r.shape)} do not match batch {B}")
    if fixed_t is not None:
        t_tok = torch.full((B, R), float(fixed_t), dtype=torch.float64, device=bb.x0.device)
    else:
        t_tok = schedule.times(u).gather(1, bb.slot)  # (B, R)
    r_tok = r.gather(2, bb.src[:, None, :].expand(B, r.shape[1], R))  # (B, K, R)
    keep = bb.keep if bb.keep is not None else torch.ones_like(bb.x0, dtype=torch.bool)
    masked = block_masks(r_tok, t_tok, keep, block_size, schedule)  # (B, R)
    x_t = torch.where(masked, torch.full_like(bb.x0, mask_id), bb.x0)
    return x_t, masked, t_tok


def bd3_logits(model, x_t: Tensor, x0: Tensor, block_size: int, *, prompt: Optional[Tensor] = None,
               prompt_keep: Optional[Tensor] = None, keep: Optional[Tensor] = None,
               positions: Optional[Tensor] = None, backend: str = "sdpa") -> Tensor:
    """Logits of the noisy half: ``p_theta(. | x_t^b, x^{<b})`` for every block at once.

    x_t, x0: (B, R); prompt: (B, P) clean left-padded context with ``prompt_keep`` (B, P) bool;
    keep: (B, R) bool real response tokens; positions: (B, P + R) (default ``arange``).
    Returns (B, R, V).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if x_t.shape != x0.shape or x_t.dim() != 2:
        raise ValueError(f"x_t {tuple(x_t.shape)} and x0 {tuple(x0.shape)} must be equal (B, R) shapes")
    B, R = x_t.shape
    P = 0 if prompt is None else prompt.shape[1]
    check_layout(R, block_size, P)
    dev = x_t.device
    if positions is None:
        positions = torch.arange(P + R, device=dev).expand(B, P + R)
    clean = x0[:, :R - block_size]  # (B, R - L'): the last clean block is never attended
    parts = [x_t, clean] if prompt is None else [prompt, x_t, clean]
    inp = torch.cat(parts, dim=1)  # (B, N)
    pos = torch.cat([positions, positions[:, P:P + R - block_size]], dim=1)  # (B, N)
    key_keep = None
    if keep is not None or prompt_keep is not None:
        ones = torch.ones(B, R, dtype=torch.bool, device=dev)
        k = keep.bool() if keep is not None else ones
        kp = [] if prompt is None else [prompt_keep.bool() if prompt_keep is not None else
                                        torch.ones(B, P, dtype=torch.bool, device=dev)]
        key_keep = torch.cat(kp + [k, k[:, :R - block_size]], dim=1)  # (B, N)
    build = flex_bd3_mask if backend == "flex" else dense_bd3_mask
    mask = build(R, block_size, P, key_keep=key_keep, device=dev)
    # the clean half's last-layer outputs feed nothing: its queries and MLP are skipped there
    return model(inp, positions=pos, attn_mask=mask, backend=backend, logits_slice=slice(P, P + R),
                 prune_last_layer=backend != "flex")


def subs_nll(logits: Tensor, targets: Tensor, mask_id: int) -> Tensor:
    """SUBS ``-log p(target)`` with the mask logit at -inf. logits (B, R, V) -> (B, R) float."""
    work = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    idx = torch.tensor([mask_id], device=logits.device)
    work = work.index_fill(-1, idx, float("-inf"))
    return torch.logsumexp(work, dim=-1) - work.gather(-1, targets[..., None]).squeeze(-1)


@dataclass(frozen=True)
class NELBOTerms:
    """Per-token NELBO terms of one estimate. ``terms`` (B, R): ``nll / t`` at masked tokens, 0
    elsewhere; ``counts`` (B,) real tokens per row; ``block_size``."""

    terms: Tensor
    masked: Tensor
    t: Tensor
    counts: Tensor
    block_size: int

    @property
    def loss(self) -> Tensor:
        """Mean over rows of the per-token NELBO of the row (scalar, differentiable)."""
        return (self.terms.sum(-1) / self.counts.clamp_min(1)).mean()

    @property
    def total(self) -> Tensor:
        """Summed NELBO over the batch (nats)."""
        return self.terms.sum()

    @property
    def n_tokens(self) -> Tensor:
        return self.counts.sum()

    @property
    def block_terms(self) -> Tensor:
        """(B, nb) per-(sequence, block) NELBO means, the quantity whose variance is minimised."""
        B, R = self.terms.shape
        return self.terms.view(B, R // self.block_size, self.block_size).mean(-1)


def bd3_nelbo(model, batch: dict, block_size: int, *, schedule: ClipSchedule = UNCLIPPED,
              generator: Optional[torch.Generator] = None, noise: Optional[dict] = None,
              fixed_t: Optional[float] = None, backend: str = "sdpa") -> NELBOTerms:
    """One NELBO estimate (BD3-LM eq. 8) for a pre-training or SFT ``batch``.

    Noise comes from ``noise``, else from ``batch`` keys ``bd3_u``/``bd3_r`` (pre-drawn by
    :meth:`BD3Objective.sample_noise`), else is drawn from ``generator``.
    """
    if not isinstance(schedule, ClipSchedule):
        raise TypeError(f"schedule must be a ClipSchedule, got {type(schedule).__name__}")
    if fixed_t is not None and not (isinstance(fixed_t, (int, float)) and 0 < fixed_t <= 1):
        raise ValueError(f"fixed_t must lie in (0, 1], got {fixed_t!r}")
    cfg = model_config(model)
    bb = layout_batch(batch, block_size, cfg)
    ids = batch["input_ids"]
    if noise is None and all(k in batch for k in (NOISE_U, NOISE_R)):
        noise = batch
    if noise is None:
        noise = draw_noise(ids.shape[0], ids.shape[1], block_size, schedule, generator, ids.device)
    u, r = noise[NOISE_U], noise[NOISE_R]
    if r.shape[-1] != ids.shape[1]:
        raise ValueError(f"noise {NOISE_R} has {r.shape[-1]} columns, input_ids {ids.shape[1]}")
    if schedule.resample and r.shape[1] < 2:
        raise ValueError("schedule.resample needs noise drawn with several candidates")
    x_t, masked, t_tok = forward_process(bb, u, r, schedule, block_size, cfg.mask_token_id, fixed_t)
    logits = bd3_logits(model, x_t, bb.x0, block_size, prompt=bb.prompt, prompt_keep=bb.prompt_keep,
                        keep=bb.keep, positions=bb.positions, backend=backend)  # (B, R, V)
    nll = subs_nll(logits, bb.x0, cfg.mask_token_id)  # (B, R)
    terms = torch.where(masked, nll / t_tok.to(nll.dtype), torch.zeros_like(nll))
    B, R = bb.x0.shape
    counts = bb.keep.sum(-1) if bb.keep is not None else torch.full((B,), R, device=ids.device)
    return NELBOTerms(terms, masked, t_tok, counts, block_size)


class BD3Objective:
    """``objective(model, batch, generator) -> (loss, metrics)`` for :func:`dlm.train.train`.

    ``schedule`` is the (mutable) training schedule; :func:`bd3lm.clipping.search_clipping`
    run during validation may replace it (see :meth:`bd3lm.BD3LM.eval_fn`).
    """

    def __init__(self, block_size: int, schedule: ClipSchedule = UNCLIPPED, backend: str = "sdpa") -> None:
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if not isinstance(schedule, ClipSchedule):
            raise TypeError(f"schedule must be a ClipSchedule, got {type(schedule).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.block_size, self.schedule, self.backend = block_size, schedule, backend

    def sample_noise(self, batch: dict, generator: torch.Generator) -> dict[str, Tensor]:
        ids = _check_ids(batch)
        return draw_noise(ids.shape[0], ids.shape[1], self.block_size, self.schedule, generator, ids.device)

    def __call__(self, model, batch: dict, generator: Optional[torch.Generator]) -> tuple[Tensor, dict]:
        out = bd3_nelbo(model, batch, self.block_size, schedule=self.schedule, generator=generator,
                        backend=self.backend)
        loss = out.loss
        real = out.counts.sum().clamp_min(1)
        metrics = {"nelbo": loss.detach(), "masked_frac": out.masked.sum() / real,
                   "t_mean": out.t.mean().detach().float()}
        return loss, metrics
