"""Attention masks and backends.

Masks are boolean, ``True`` = "query may attend to key", shaped ``(B, 1, Q, K)`` (or anything
that broadcasts to it, e.g. ``(B, 1, 1, K)`` for pure key padding). The key axis always indexes
*columns of the running sequence* ``0 .. K-1`` (the same columns the :class:`~dlm.cache.KVCache`
uses), so one mask serves the uncached forward and every cached window.

Backends (``backend=`` in :meth:`dlm.model.Transformer.forward`):

- ``"sdpa"``  ``torch.nn.functional.scaled_dot_product_attention`` (default; CPU and GPU).
- ``"math"``  explicit softmax(QK^T / sqrt(d)) V in the input dtype: the reference in tests.
- ``"flex"``  FlexAttention; accepts a dense mask (converted to a ``BlockMask``) or a ``BlockMask``.
- ``"flash"`` flash-attn 2 when importable; only unmasked (fully bidirectional) attention.
- ``"blocksparse"`` SDPA over query chunks, each against only the key columns its rows may see
  (:func:`sparse_plan`): the dense kernel on the mask's nonzero blocks (BD3-LM's 2L training mask
  is ~3/4 zeros), exact up to summation order.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

BACKENDS = ("sdpa", "math", "flex", "flash", "blocksparse")

import importlib.util

# FlexAttention (torch >= 2.5) is imported on first use: importing it pulls in torch._dynamo,
# which costs every process ~1 s at start-up.
_HAS_FLEX = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def _flex():
    """(BlockMask, create_block_mask, flex_attention), or RuntimeError without FlexAttention."""
    if not _HAS_FLEX:
        raise RuntimeError("FlexAttention requires torch >= 2.5")
    from torch.nn.attention import flex_attention as fa

    return fa.BlockMask, fa.create_block_mask, fa.flex_attention


def _is_block_mask(mask) -> bool:
    return _HAS_FLEX and type(mask).__name__ == "BlockMask"

try:  # optional extra [gpu]
    from flash_attn import flash_attn_func  # type: ignore[import-not-found]
except Exception:  # pragma: no cover - not installed on CPU machines
    flash_attn_func = None

MaskLike = Union[Tensor, "BlockMask", None]


def available_backends(device: Union[str, torch.device] = "cpu") -> tuple[str, ...]:
    """Backends usable on ``device`` in this environment."""
    out = ["sdpa", "math"]
    if _HAS_FLEX:
        out.append("flex")
    if flash_attn_func is not None and torch.device(device).type == "cuda":
        out.append("flash")
    return tuple(out)


# --------------------------------------------------------------------------------------------
# mask builders (pure, vectorized)
# --------------------------------------------------------------------------------------------


def key_padding_mask(attention_mask: Optional[Tensor]) -> Optional[Tensor]:
    """Bidirectional attention over real tokens: ``(B, K)`` 0/1 -> ``(B, 1, 1, K)`` bool.

    Padding *queries* attend to every real key (their outputs are never used), so no softmax row
    is empty; real queries never see padding keys, so a row does not depend on its padding.
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be (B, T), got shape {tuple(attention_mask.shape)}")
    return attention_mask.bool()[:, None, None, :]  # (B, 1, 1, K)


def padding_positions(attention_mask: Tensor) -> Tensor:
    """RoPE positions for a left-padded batch: 0 at each row's first real token.

    ``(B, T)`` 0/1 mask -> ``(B, T)`` long; padding columns get position 0.
    """
    pos = attention_mask.long().cumsum(dim=-1) - 1  # (B, T)
    return pos.clamp_min(0)


def block_ids(seq_len: int, block_size: int, prompt_len: int = 0, device=None) -> Tensor:
    """Block index of every column: the prompt ``[0, prompt_len)`` is block 0, then blocks of
    ``block_size`` columns follow (BD3-LM / semi-AR convention). ``(T,)`` long."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    col = torch.arange(seq_len, device=device)
    rel = (col - prompt_len).clamp_min(0)
    ids = rel // block_size + (1 if prompt_len > 0 else 0)
    return torch.where(col < prompt_len, torch.zeros_like(col), ids)


def block_causal_mask(
    q_block: Tensor, k_block: Tensor, attention_mask: Optional[Tensor] = None
) -> Tensor:
    """Block-causal attention: query in block b sees keys in blocks <= b (BD3-LM sampling).

    ``q_block`` (Q,) and ``k_block`` (K,) block ids -> ``(1 or B, 1, Q, K)`` bool, combined with
    key padding when ``attention_mask`` (B, K) is given.
    """
    mask = (k_block[None, :] <= q_block[:, None])[None, None]  # (1, 1, Q, K)
    pad = key_padding_mask(attention_mask)
    return mask if pad is None else mask & pad


def causal_mask(q_cols: Tensor, k_len: int, attention_mask: Optional[Tensor] = None) -> Tensor:
    """Token-causal mask for query columns ``q_cols`` (Q,) over keys ``0..k_len-1``."""
    k_cols = torch.arange(k_len, device=q_cols.device)
    return block_causal_mask(q_cols, k_cols, attention_mask)


# --------------------------------------------------------------------------------------------
# backends
# --------------------------------------------------------------------------------------------


def _math_attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tensor:
    # q: (B, H, Q, D); k, v: (B, H, K, D) (already expanded for GQA)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, Q, K)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (B, H, Q, D)


def dense_to_block_mask(mask: Tensor, n_q: int, n_k: int) -> "BlockMask":
    """Wrap a dense bool mask (B|1, 1, Q|1, K) as a FlexAttention ``BlockMask``."""
    _, create_block_mask, _ = _flex()
    dense = mask[:, 0].expand(mask.shape[0], n_q, n_k)  # (B, Q, K)
    batch = dense.shape[0]

    def mask_mod(b, h, q_idx, kv_idx):
        return dense[b, q_idx, kv_idx]

    return create_block_mask(mask_mod, batch, None, n_q, n_k, device=mask.device)


def block_mask_from_mod(
    mask_mod: Callable, batch: Optional[int], n_q: int, n_k: int, device
) -> "BlockMask":
    """``BlockMask`` from a FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool``."""
    _, create_block_mask, _ = _flex()
    return create_block_mask(mask_mod, batch, None, n_q, n_k, device=device)


@dataclass(frozen=True)
class SparsePlan:
    """How the ``blocksparse`` backend splits one mask: ``spans`` ``[(a, b, cols), ...]``, query
    rows ``[a, b)`` and the key columns any of them may see (``None``: all); ``unmasked``: the
    mask allows every pair (the kernel then runs without one)."""

    spans: tuple
    unmasked: bool
    chunk: int


_PLANS: dict[int, tuple["weakref.ref[Tensor]", SparsePlan]] = {}  # id(mask) -> (its weak ref, its plan)


def sparse_plan(mask: Tensor, chunk: int = 64) -> SparsePlan:
    """The :class:`SparsePlan` of ``mask`` (B|1, 1, Q, K) in query chunks of ``chunk`` rows, made
    once per mask object (the BD3-LM masks are cached: one plan serves every layer and step)."""
    ref, plan = _PLANS.get(id(mask), (None, None))
    if ref is not None and ref() is mask and plan.chunk == chunk:
        return plan
    rows = mask.reshape(-1, *mask.shape[-2:]).any(dim=0)  # (Q, K): a key any batch row may see
    spans = []
    for a in range(0, rows.shape[0], chunk):
        b = min(a + chunk, rows.shape[0])
        cols = rows[a:b].any(dim=0).nonzero().squeeze(-1)  # (K',)
        spans.append((a, b, None if len(cols) == rows.shape[1] else cols))
    plan = SparsePlan(tuple(spans), bool(mask.all()), chunk)
    key = id(mask)
    _PLANS[key] = (weakref.ref(mask, lambda _: _PLANS.pop(key, None)), plan)
    return plan


def _blocksparse(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, n_rep: int) -> Tensor:
    """SDPA per query chunk over its visible key columns only (:func:`sparse_plan`); no mask: SDPA."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=n_rep > 1)
    if not isinstance(mask, Tensor) or mask.dim() != 4 or mask.shape[-2] != q.shape[2]:
        raise ValueError("backend='blocksparse' needs a dense bool mask of shape (B|1, 1, Q, K)")
    plan = sparse_plan(mask)
    if plan.unmasked:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=n_rep > 1)
    outs = []
    for a, b, cols in plan.spans:
        m = mask[..., a:b, :]
        ks, vs = (k, v) if cols is None else (k.index_select(2, cols), v.index_select(2, cols))
        m = m if cols is None else m.index_select(3, cols)
        outs.append(F.scaled_dot_product_attention(q[:, :, a:b], ks, vs, attn_mask=m, enable_gqa=n_rep > 1))
    return torch.cat(outs, dim=2)  # (B, Hq, Q, D)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: MaskLike = None, backend: str = "sdpa") -> Tensor:
    """Scaled dot-product attention with grouped KV heads.

    q: (B, Hq, Q, D); k, v: (B, Hkv, K, D) with Hq % Hkv == 0; mask per module docstring.
    Returns (B, Hq, Q, D).
    """
    n_rep = q.shape[1] // k.shape[1]
    if backend == "sdpa":
        if _is_block_mask(mask):
            raise TypeError("backend='sdpa' needs a dense bool mask, got a BlockMask")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=n_rep > 1)
    if backend == "math":
        if n_rep > 1:
            k = k.repeat_interleave(n_rep, dim=1)
            v = v.repeat_interleave(n_rep, dim=1)
        return _math_attention(q, k, v, mask)
    if backend == "flex":
        _, _, flex_attention = _flex()
        block_mask = mask
        if isinstance(mask, Tensor):
            block_mask = dense_to_block_mask(mask, q.shape[2], k.shape[2])
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=n_rep > 1)
    if backend == "blocksparse":
        return _blocksparse(q, k, v, mask, n_rep)
    if backend == "flash":
        if flash_attn_func is None:
            raise RuntimeError("backend='flash' requires the flash-attn package (extra [gpu])")
        if mask is not None:
            raise ValueError("backend='flash' supports only unmasked attention (mask=None)")
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2)  # (B, Hq, Q, D)
    raise ValueError(f"unknown attention backend {backend!r}; expected one of {BACKENDS}")
