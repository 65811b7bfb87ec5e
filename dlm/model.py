"""The one Transformer: LLaMA-style blocks for LLaDA, Dream and the embedded models.

RMSNorm, rotary position embeddings (RoPE, Su et al. 2021, eq. 34), SwiGLU MLP
(``down(silu(gate(x)) * up(x))``), multi-head / grouped-query attention with optional q/k/v bias,
tied or untied LM head. Positions are explicit, the attention mask and backend are chosen by the
caller, and an optional :class:`~dlm.cache.KVCache` is read/written at explicit columns.

Dream-style models (``config.shift_logits``) predict token ``i`` from hidden state ``i - 1``;
:meth:`Transformer.forward` returns logits *aligned to the token they predict*, with the first
column using its own hidden state (as Dream's reference does). Callers that run a window starting
at column ``s > 0`` on such a model must start it one column earlier (see ``fastdllm``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .attention import MaskLike, attend
from .cache import KVCache

LAYOUTS = ("native", "llada", "dream")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture and special tokens. Token ids come from here, never from literals."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    mlp_hidden: int
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    qkv_bias: bool = False
    tie_embeddings: bool = False
    shift_logits: bool = False  # Dream: logit i from hidden state i-1
    mask_token_id: int = 0
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    bos_token_id: Optional[int] = None
    eot_token_id: Optional[int] = None  # LLaDA-Instruct <|eot_id|>; suppressed with EOS
    layout: str = "native"  # checkpoint layout this config was read from / is saved in

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden",
                     "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} not divisible by n_kv_heads={self.n_kv_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError("head_dim must be even for RoPE")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id={self.mask_token_id} outside vocab")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return cls(**d)

    def num_params(self, include_embeddings: bool = True) -> int:
        """Parameter count from the config alone (used for FLOP estimates)."""
        d, h = self.d_model, self.mlp_hidden
        kv = self.n_kv_heads * self.head_dim
        attn = d * d + 2 * d * kv + d * d + (d + 2 * kv if self.qkv_bias else 0)
        per_layer = attn + 3 * d * h + 2 * d
        emb = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return self.n_layers * per_layer + d + (emb if include_embeddings else 0)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w, computed in float32 (or float64) then cast back."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        cpu_full = x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
        if cpu_full and not torch.is_autocast_enabled("cpu"):  # on CPU the same ops as below, in one call
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and signed sin tables for explicit positions (B, T) -> (B, 1, T, D) each, in
    float32/float64: ``cos(f)`` and ``[-sin(f), sin(f)]`` over the two halves (the rotation's sign
    folded into the table, :func:`apply_rope`)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=work) / head_dim))
    freqs = positions.to(work)[..., None] * inv_freq  # (B, T, D/2)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # (B, 1, T, D)
    sin = emb.sin()
    sin[..., : head_dim // 2].neg_()
    return emb.cos(), sin


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE (GPT-NeoX / LLaMA / LLaDA / Qwen2 convention), x: (B, H, T, D), with the
    tables of :func:`rope_cos_sin`: ``x cos + [-x2, x1] sin`` computed as ``x cos + [x2, x1] sin'``
    with ``sin' = [-sin, sin]`` (a sign flip is exact: the same bits, one operation fewer)."""
    xf = x.to(cos.dtype)
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([x2, x1], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        kv = cfg.n_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, kv, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, kv, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: MaskLike, backend: str,
                cache: Optional[KVCache], layer: int, start: int, rows: Optional[slice] = None) -> Tensor:
        """``rows``: queries (and the output) only for these columns; K/V for all of them."""
        B, T, _ = x.shape
        xq, cq, sq = (x, cos, sin) if rows is None else (x[:, rows], cos[:, :, rows], sin[:, :, rows])
        if rows is not None and isinstance(mask, Tensor) and mask.dim() >= 2 and mask.shape[-2] == T:
            mask = mask[..., rows, :]  # (..., T', K)
        Tq = xq.shape[1]
        qp, kp, vp = self.q_proj, self.k_proj, self.v_proj  # F.linear: nn.Linear's forward without its call
        q = F.linear(xq, qp.weight, qp.bias).view(B, Tq, self.n_heads, self.head_dim).transpose(1, 2)  # (B, Hq, T', D)
        k = F.linear(x, kp.weight, kp.bias).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = F.linear(x, vp.weight, vp.bias).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        q, k = apply_rope(q, cq, sq), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.layer_kv(layer, k, v, start)  # (B, Hkv, K, D)
        out = attend(q, k, v, mask, backend)  # (B, Hq, T', D)
        return F.linear(out.transpose(1, 2).reshape(B, Tq, -1), self.o_proj.weight)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = F.linear(x, self.gate_proj.weight), F.linear(x, self.up_proj.weight)
        return F.linear(F.silu(gate) * up, self.down_proj.weight)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, backend, cache, layer, start, rows: Optional[slice] = None) -> Tensor:
        a = self.attn(self.attn_norm(x), cos, sin, mask, backend, cache, layer, start, rows)
        x = (x if rows is None else x[:, rows]) + a
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """``model(input_ids)`` -> logits (B, T, V) with bidirectional attention over positions 0..T-1."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)

    def reset_parameters(self, std: float = 0.02, generator: Optional[torch.Generator] = None) -> None:
        """Normal(0, std) init; residual output projections scaled by 1/sqrt(2 * n_layers)."""
        out_std = std / (2 * self.config.n_layers) ** 0.5
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                s = out_std if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                with torch.no_grad():
                    p.normal_(0.0, s, generator=generator)

    def rope_tables(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """RoPE cos/sin for ``positions`` (B, T): (B, 1, T, D) each (:func:`rope_cos_sin`)."""
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype)

    def head_weight(self) -> Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def body(self, input_ids: Tensor, cos: Tensor, sin: Tensor, attn_mask: MaskLike, backend: str,
             cache: Optional[KVCache], start: int, last_rows: Optional[slice] = None) -> Tensor:
        """Embedding, blocks and final norm of the window (its K/V written into ``cache``), then
        Dream's shift: (B, W) ids -> (B, W, d) hidden states, column ``i`` predicting token ``i``.
        ``last_rows``: the last block computes queries, attention output and MLP for these
        columns only (B, W', d): no later layer reads the others' final hidden states."""
        x = self.embed(input_ids)  # (B, W, d)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, attn_mask, backend, cache, i, start, last_rows if i == last else None)
        x = self.norm(x)  # (B, W, d)
        if self.config.shift_logits and x.shape[1] > 1:  # (a one-column window is its own shift)
            x = torch.cat([x[:, :1], x[:, :-1]], dim=1)  # logit i from hidden i-1
        return x

    def forward(
        self,
        input_ids: Tensor,
        positions: Optional[Tensor] = None,
        cache: Optional[KVCache] = None,
        attn_mask: MaskLike = None,
        *,
        start: int | Tensor = 0,
        commit: bool = False,
        backend: str = "sdpa",
        logits_slice: Optional[slice] = None,
        return_hidden: bool = False,
        rope: Optional[tuple[Tensor, Tensor]] = None,
        body: Optional[Callable[..., Tensor]] = None,
        prune_last_layer: bool = False,
    ) -> Tensor:
        """Logits for the window ``input_ids`` (B, W) occupying columns ``[start, start + W)``, or
        with ``start`` a (B, W) long tensor the cached columns it lists per row (a gathered window:
        ``positions`` required; its K/V are written there, every cached column is read).

        positions: (B, W) RoPE positions (default ``start + arange(W)``).
        cache: read K/V of other columns from it and write this window's into it; ``commit`` keeps them
        valid (extends the cache's length), otherwise they are scratch (:mod:`dlm.cache`).
        attn_mask: bool, broadcastable to (B, 1, W, K) with K = cache key length (or W).
        logits_slice: compute the LM head only on these window columns (saves the vocab matmul).
        rope: the window's precomputed ``rope_cos_sin(positions, ...)`` tables, (B, 1, W, D) each
        (a sampler computes them once per call; ``positions`` is then not read).
        body: a stand-in for :meth:`body` with its signature (:mod:`dlm.compiled` passes the
        compiled one; the checks, the cache's length and the LM head stay here, eager).
        prune_last_layer: with ``logits_slice``, the last block runs its queries, attention output
        and MLP on the slice's columns only (their K/V still on all): the same logits for less
        compute when the slice is a fraction of the window (BD3-LM's clean x_0 half); every
        column's K/V still goes to ``cache``. Needs a dense or no mask and an unshifted model
        (ValueError otherwise).
        Returns (B, W', V) logits (aligned to predicted tokens) or hidden states if requested.
        """
        B, W = input_ids.shape
        gathered = isinstance(start, Tensor)
        if positions is None:
            if gathered:
                raise ValueError("a gathered window (start a tensor of columns) needs positions")
            positions = torch.arange(start, start + W, device=input_ids.device).expand(B, W)
        elif positions.shape != input_ids.shape:
            raise ValueError(f"positions shape {tuple(positions.shape)} != input_ids shape {(B, W)}")
        if cache is not None:
            cache.check_window(start, W)
        elif gathered or start != 0 or commit:
            raise ValueError("start/commit need a cache")
        prune = prune_last_layer and logits_slice is not None
        if prune and (self.config.shift_logits or not (attn_mask is None or isinstance(attn_mask, Tensor))):
            raise ValueError("prune_last_layer needs a dense or no attn_mask and an unshifted model "
                             "(shift_logits=False)")
        cos, sin = self.rope_tables(positions, self.embed.weight.dtype) if rope is None else rope
        rows = logits_slice if prune else None
        x = (body or self.body)(input_ids, cos, sin, attn_mask, backend, cache, start, rows)  # (B, W or W', d)
        if cache is not None and commit and not gathered:
            cache.advance(start + W)
        if logits_slice is not None and not prune:
            x = x[:, logits_slice]
        if return_hidden:
            return x
        return F.linear(x, self.head_weight())  # (B, W', V)
