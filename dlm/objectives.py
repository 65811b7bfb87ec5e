"""Training objectives for masked diffusion language models (LLaDA / MDLM).

An *objective* is any callable

    objective(model, batch: dict[str, Tensor], generator: torch.Generator) -> (loss, metrics)

returning a scalar loss (a mean over the batch rows, so that averaging equal shards reproduces the
full-batch loss) and a dict of detached scalar metrics. Randomness comes only from ``generator``.

Objectives may also define ``sample_noise(batch, generator) -> dict[str, Tensor]`` whose tensors
all have the batch as leading dimension. :func:`dlm.train.train` then draws the noise once for the
*global* batch and hands each data-parallel rank / micro-batch its rows inside the batch dict, so
1-process and N-process runs see identical masks. ``__call__`` uses pre-drawn noise keys when the
batch carries them, otherwise it draws them itself.

Both LLaDA losses follow LLaDA (Nie et al. 2025) GUIDELINES.md: ``t ~ U(0, 1)`` per sequence,
``p_mask = (1 - eps) * t + eps`` and every eligible token is replaced by ``[MASK]`` independently
with probability ``p_mask``.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import causal_mask, key_padding_mask, padding_positions

NOISE_KEYS = ("noise_t", "noise_u")


def _check_eps(eps: float) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 < eps < 1.0:
        raise ValueError(f"eps must be a float in (0, 1), got {eps!r}")
    return float(eps)


def _check_input_ids(batch: dict) -> Tensor:
    if not isinstance(batch, dict):
        raise TypeError(f"batch must be a dict of tensors, got {type(batch).__name__}")
    ids = batch.get("input_ids")
    if not isinstance(ids, Tensor):
        raise ValueError("batch['input_ids'] must be a Tensor")
    if ids.dim() != 2 or ids.numel() == 0:
        raise ValueError(f"batch['input_ids'] must be a non-empty (B, L) tensor, got {tuple(ids.shape)}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"batch['input_ids'] must be int32/int64, got {ids.dtype}")
    return ids


def _check_generator(generator: torch.Generator, ids: Tensor) -> None:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if generator.device.type != ids.device.type:
        raise ValueError(f"generator is on {generator.device} but input_ids on {ids.device}")


def _mask_token_id(model) -> int:
    config = getattr(model, "config", None)
    mask_id = getattr(config, "mask_token_id", None)
    if not isinstance(mask_id, int):
        raise TypeError("model.config.mask_token_id must be an int")
    return mask_id


def sample_masking_noise(batch: dict, generator: torch.Generator) -> dict[str, Tensor]:
    """Uniform draws for the forward process: ``noise_t`` (B,) and ``noise_u`` (B, L) in [0, 1)."""
    ids = _check_input_ids(batch)
    _check_generator(generator, ids)
    B, L = ids.shape
    t = torch.rand(B, generator=generator, device=ids.device)  # (B,)
    u = torch.rand(B, L, generator=generator, device=ids.device)  # (B, L)
    return {"noise_t": t, "noise_u": u}


def _noise(batch: dict, generator: torch.Generator, ids: Tensor) -> tuple[Tensor, Tensor]:
    if all(k in batch for k in NOISE_KEYS):
        t, u = batch["noise_t"], batch["noise_u"]
        if t.shape != ids.shape[:1] or u.shape != ids.shape:
            raise ValueError(f"noise_t/noise_u shapes {tuple(t.shape)}/{tuple(u.shape)} do not match "
                             f"input_ids {tuple(ids.shape)}")
        return t, u
    noise = sample_masking_noise(batch, generator)
    return noise["noise_t"], noise["noise_u"]


def forward_process(ids: Tensor, t: Tensor, u: Tensor, eps: float, mask_token_id: int,
                    eligible: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """Mask each eligible token with probability ``p_mask = (1 - eps) * t + eps`` (LLaDA eq. 3).

    ids, u: (B, L); t: (B,); eligible: (B, L) bool or None (all tokens).
    Returns noisy ids (B, L), masked (B, L) bool, p_mask (B, 1).
    """
    p_mask = ((1.0 - eps) * t + eps)[:, None].to(torch.float32)  # (B, 1)
    masked = u < p_mask  # (B, L)
    if eligible is not None:
        masked = masked & eligible
    noisy = torch.where(masked, torch.full_like(ids, mask_token_id), ids)  # (B, L)
    return noisy, masked, p_mask


def _masked_ce(logits: Tensor, targets: Tensor, masked: Tensor) -> Tensor:
    """Cross-entropy at masked positions only: logits (B, L, V) -> (N,) in float32."""
    if logits.shape[:2] != targets.shape:
        raise ValueError(f"model returned logits {tuple(logits.shape)} for input_ids {tuple(targets.shape)}")
    return F.cross_entropy(logits[masked].float(), targets[masked], reduction="none")  # (N,)


class _MaskedDiffusionLoss:
    """Shared by the LLaDA losses: ``eps`` floor on p_mask, noise drawn once per global batch."""

    def __init__(self, eps: float = 1e-3) -> None:
        self.eps = _check_eps(eps)

    def sample_noise(self, batch: dict, generator: torch.Generator) -> dict[str, Tensor]:
        return sample_masking_noise(batch, generator)


class LLaDAPretrainLoss(_MaskedDiffusionLoss):
    """MDLM / LLaDA pre-training loss, LLaDA (Nie et al. 2025) eq. 3 as in GUIDELINES.md:

        L = 1 / (B * L) * sum_{b, i} 1[x_t^{b,i} = M] * CE(x_0^{b,i}) / p_mask_b

    batch: ``input_ids`` (B, L) and optional ``attention_mask`` (B, L) 0/1. Padding is never
    masked, gets key-padding attention and padding-aware RoPE positions, and the denominator stays
    ``B * L`` (so the loss is a per-row mean and equal DDP shards average exactly).
    """

    def __call__(self, model, batch: dict, generator: torch.Generator) -> tuple[Tensor, dict]:
        ids = _check_input_ids(batch)
        attention_mask = batch.get("attention_mask")
        if attention_mask is not None and attention_mask.shape != ids.shape:
            raise ValueError(f"batch['attention_mask'] shape {tuple(attention_mask.shape)} != "
                             f"input_ids shape {tuple(ids.shape)}")
        t, u = _noise(batch, generator, ids)
        eligible = None if attention_mask is None else attention_mask.bool()
        noisy, masked, p_mask = forward_process(ids, t, u, self.eps, _mask_token_id(model), eligible)
        if attention_mask is None:
            logits = model(noisy)  # (B, L, V)
        else:
            logits = model(noisy, positions=padding_positions(attention_mask),
                           attn_mask=key_padding_mask(attention_mask))  # (B, L, V)
        B, L = ids.shape
        weight = (1.0 / p_mask).expand(B, L)[masked]  # (N,)
        loss = (_masked_ce(logits, ids, masked) * weight).sum() / (B * L)
        return loss, {"loss": loss.detach(), "masked_frac": masked.float().mean()}


class LLaDASFTLoss(_MaskedDiffusionLoss):
    """LLaDA SFT loss, LLaDA eq. 5 as in GUIDELINES.md: prompt tokens are never masked,

        L = 1 / B * sum_b 1 / A_b * sum_{i >= P_b} 1[x_t^{b,i} = M] * CE(r_0^{b,i}) / p_mask_b

    with ``P_b`` the prompt length and ``A_b = L - P_b`` the answer length (EOS padding included).
    batch: ``input_ids`` (B, L) prompt + EOS-padded response, ``prompt_lengths`` (B,) in [0, L).

    ``weighting="uniform"`` replaces the ELBO weight ``1 / (p_mask_b * A_b)`` by
    ``1 / n_b`` (``n_b`` masked tokens of row b): the mean cross-entropy over a row's masked
    tokens. It is not an ELBO, but its gradient has far lower variance (no 1/t blow-up for
    lightly masked rows), which is what a tiny model trained on a CPU budget needs (MaskGIT-style
    training; the embedded testbed model learns several times faster with it).

    ``suffix_prob`` (default 0: LLaDA's recipe exactly): the share of rows that instead mask a
    whole suffix of the answer, from a cut drawn uniformly over the answer's content tokens (those
    before its first EOS) and the first EOS. Such a row is what a left-to-right (semi-AR) decode
    shows the model when a block starts: a clean prefix, everything after it masked, so each step
    of a chain of thought must be computed from what precedes it, not copied from the next line.
    Suffix rows are weighted ``1 / n_b`` (there is no ``t`` for an ELBO weight), so they need
    ``weighting="uniform"``.
    """

    def __init__(self, eps: float = 1e-3, weighting: str = "elbo", suffix_prob: float = 0.0) -> None:
        super().__init__(eps)
        if weighting not in ("elbo", "uniform"):
            raise ValueError(f"weighting must be 'elbo' or 'uniform', got {weighting!r}")
        if isinstance(suffix_prob, bool) or not isinstance(suffix_prob, (int, float)) or not 0 <= suffix_prob <= 1:
            raise ValueError(f"suffix_prob must be a number in [0, 1], got {suffix_prob!r}")
        if suffix_prob > 0 and weighting != "uniform":
            raise ValueError("suffix_prob > 0 needs weighting='uniform' (suffix rows have no t for the ELBO weight)")
        self.weighting, self.suffix_prob = weighting, float(suffix_prob)

    def sample_noise(self, batch: dict, generator: torch.Generator) -> dict[str, Tensor]:
        """LLaDA's ``noise_t``/``noise_u``, and with ``suffix_prob > 0`` ``noise_suffix`` (B, 2):
        whether the row is a suffix row, and where its cut falls."""
        noise = sample_masking_noise(batch, generator)
        if self.suffix_prob > 0:  # drawn only then, so suffix_prob=0 keeps LLaDA's noise stream
            B = noise["noise_t"].shape[0]
            noise["noise_suffix"] = torch.rand(B, 2, generator=generator, device=noise["noise_t"].device)  # (B, 2)
        return noise

    def __call__(self, model, batch: dict, generator: torch.Generator) -> tuple[Tensor, dict]:
        ids = _check_input_ids(batch)
        B, L = ids.shape
        prompt_lengths = _check_prompt_lengths(batch, B, L)
        if self.suffix_prob > 0 and "noise_suffix" not in batch:
            if any(k in batch for k in NOISE_KEYS):
                raise ValueError("batch carries noise_t/noise_u but not noise_suffix: draw it with this loss's "
                                 "sample_noise")
            batch = {**batch, **self.sample_noise(batch, generator)}
        t, u = _noise(batch, generator, ids)
        cols = torch.arange(L, device=ids.device)[None, :]  # (1, L)
        starts = prompt_lengths.to(ids.device)[:, None]  # (B, 1)
        response = cols >= starts  # (B, L)
        mask_id = _mask_token_id(model)
        noisy, masked, p_mask = forward_process(ids, t, u, self.eps, mask_id, response)
        if self.suffix_prob > 0:
            noise_suffix = batch["noise_suffix"]  # (B, 2): row is a suffix row, where its cut falls
            if noise_suffix.shape != (B, 2):
                raise ValueError(f"noise_suffix must be ({B}, 2), got {tuple(noise_suffix.shape)}")
            suffix_rows = noise_suffix[:, :1] < self.suffix_prob  # (B, 1)
            masked = torch.where(suffix_rows, cols >= _suffix_cuts(ids, starts, noise_suffix[:, 1:], model),
                                 masked)  # (B, L)
            noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)  # (B, L)
        logits = model(noisy)  # (B, L, V)
        if self.weighting == "elbo":
            answer_len = response.sum(dim=1, keepdim=True).to(torch.float32)  # (B, 1)
            row_weight = 1.0 / (p_mask * answer_len)  # (B, 1)
        else:
            row_weight = 1.0 / masked.sum(dim=1, keepdim=True).clamp(min=1).to(torch.float32)  # (B, 1)
        weight = row_weight.expand(B, L)[masked]  # (N,)
        ce = _masked_ce(logits, ids, masked)  # (N,)
        loss = (ce * weight).sum() / B
        return loss, {"loss": loss.detach(), "masked_frac": masked.float().sum() / response.sum(),
                      **_answer_loss(ce, ids, starts, masked, model)}


def _check_prompt_lengths(batch: dict, B: int, L: int) -> Tensor:
    """``batch['prompt_lengths']``: a (B,) integer tensor in ``[0, L)`` (a non-empty response)."""
    prompt_lengths = batch.get("prompt_lengths")
    if not isinstance(prompt_lengths, Tensor) or prompt_lengths.shape != (B,):
        raise ValueError(f"batch['prompt_lengths'] must be a ({B},) tensor")
    if prompt_lengths.dtype.is_floating_point or prompt_lengths.dtype == torch.bool:
        raise TypeError(f"batch['prompt_lengths'] must be integer, got {prompt_lengths.dtype}")
    if bool(((prompt_lengths < 0) | (prompt_lengths >= L)).any()):
        raise ValueError(f"batch['prompt_lengths'] must lie in [0, {L}) (non-empty response)")
    return prompt_lengths


class ARSFTLoss:
    """Autoregressive SFT, the model Dream starts from (Ye et al. 2025, "Dream 7B": an AR model
    adapted to masked diffusion): next-token cross-entropy on the response under a causal mask,

        L = 1 / B * sum_b 1 / A_b * sum_{i >= max(P_b, 1)} CE(p(x^{b,i} | x^{b,<i}))

    batch as :class:`LLaDASFTLoss`. A ``shift_logits`` model's logit ``i`` already predicts token
    ``i`` from hidden state ``i - 1`` (Dream's shift), so the same weights then train as a masked
    diffusion model with :class:`LLaDASFTLoss` unchanged; an unshifted model's logit ``i - 1`` does.
    """

    def __call__(self, model, batch: dict, generator: Optional[torch.Generator] = None) -> tuple[Tensor, dict]:
        ids = _check_input_ids(batch)
        B, L = ids.shape
        starts = _check_prompt_lengths(batch, B, L).to(ids.device)[:, None].clamp_min(1)  # (B, 1)
        cols = torch.arange(L, device=ids.device)
        logits = model(ids, attn_mask=causal_mask(cols, L))  # (B, L, V)
        if not model.config.shift_logits:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # logit i from hidden i-1
        target = cols[None, :] >= starts  # (B, L) response tokens with a predecessor
        ce = _masked_ce(logits, ids, target)  # (N,)
        row_weight = 1.0 / target.sum(dim=1, keepdim=True).to(torch.float32)  # (B, 1)
        loss = (ce * row_weight.expand(B, L)[target]).sum() / B
        return loss, {"loss": loss.detach(), "masked_frac": torch.zeros(()),
                      **_answer_loss(ce, ids, starts, target, model)}


def _answer_loss(ce: Tensor, ids: Tensor, starts: Tensor, scored: Tensor, model) -> dict:
    """``{"answer_loss": mean CE}`` over the ``scored`` (B, L) positions that hold the answer's
    own tokens, those before the first EOS at or after ``starts`` (B, 1): the EOS padding, the
    first EOS too, is left out, so a model that learned only the padding does not look converged.
    ``ce`` (N,) is the CE at the ``scored`` positions. {} for a model without ``eos_token_id``."""
    eos = getattr(getattr(model, "config", None), "eos_token_id", None)
    if not isinstance(eos, int):
        return {}
    L = ids.shape[1]
    cols = torch.arange(L, device=ids.device)[None, :]  # (1, L)
    first_eos = torch.where((ids == eos) & (cols >= starts), cols, L).amin(dim=1, keepdim=True)  # (B, 1)
    answer = ((cols >= starts) & (cols < first_eos))[scored]  # (N,) over the scored positions
    return {"answer_loss": ce.detach()[answer].sum() / answer.sum().clamp(min=1)}


def _suffix_cuts(ids: Tensor, starts: Tensor, u: Tensor, model) -> Tensor:
    """Cut per row, uniform (``u`` (B, 1) in [0, 1)) over the answer's tokens before its first EOS
    and that EOS (the answer's last token if it has none): (B, 1) positions in ``[start, L)``."""
    eos = getattr(getattr(model, "config", None), "eos_token_id", None)
    if not isinstance(eos, int):
        raise TypeError("model.config.eos_token_id must be an int for suffix_prob > 0")
    L = ids.shape[1]
    cols = torch.arange(L, device=ids.device)[None, :]  # (1, L)
    last = torch.where((ids == eos) & (cols >= starts), cols, L - 1).amin(dim=1, keepdim=True)  # (B, 1)
    n_choices = last - starts + 1  # (B, 1)
    return starts + torch.minimum((u * n_choices).long(), n_choices - 1)  # (B, 1)
