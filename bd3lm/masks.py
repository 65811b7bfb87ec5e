"""The vectorized BD3-LM training mask over ``[prompt | x_t | x_0]`` (Arriola et al., ICLR 2025).

BD3-LM trains all blocks of a sequence in one forward pass over the concatenation
``x_t ⊕ x_0`` of the noisy and the clean sequence (BD3-LM sec. 3.2, "vectorized training",
Fig. 2 / eq. 9). With ``R`` response columns split into blocks of ``L'`` columns:

- noisy block b attends to noisy block b (block-diagonal, ``M_BD``) and to clean blocks < b
  (offset block-causal, ``M_OBC``): it sees exactly ``x_t^b`` and ``x^{<b}``, the conditioning
  of ``p_theta(x^b | x_t^b, x^{<b})`` in the NELBO (BD3-LM eq. 8);
- clean block b attends to clean blocks <= b (block-causal, ``M_BC``): its keys/values are then
  exactly the K/V the sampler caches after block b is decoded (BD3-LM eq. 4);
- clean never attends to noisy.

RoPE positions of ``x_t[i]`` and ``x_0[i]`` are both ``i`` (the same token slot).

Prompt-conditioned variant (our design). A clean prompt of ``P`` columns is placed *once*, in
front: ``[prompt (P) | x_t (R) | x_0 (R)]``. Every query attends to every prompt key; prompt
queries attend only to the prompt (bidirectionally: the prompt is one clean "block -1"). The
prompt is not duplicated, so prompt-conditioned training costs ``P + 2R`` columns, not
``2(P + R)``. Response positions continue after the prompt (``P + i`` for both halves).

The last clean block is never attended by any noisy block (noisy block b sees clean blocks
< b <= nb - 1), and clean blocks never attend *later* clean blocks, so it can be dropped
exactly: callers evaluate the mask on ``N = P + 2R - L'`` columns. With one block (MDLM,
``L' = R``) the clean half disappears and the objective is the plain MDLM forward.

:func:`bd3_mask` is one pure function of index tensors. Evaluated on broadcast index grids it
is the dense bool mask for SDPA; called with FlexAttention's scalar indices it is the
``mask_mod`` (``dlm.attention.block_mask_from_mod``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch
from torch import Tensor

from dlm.attention import block_mask_from_mod


def check_layout(resp_len: int, block_size: int, prompt_len: int = 0) -> int:
    """Validate ints; returns the number of blocks ``resp_len // block_size``."""
    for name, value, minimum in (("resp_len", resp_len, 1), ("block_size", block_size, 1),
                                 ("prompt_len", prompt_len, 0)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if resp_len % block_size:
        raise ValueError(f"block_size={block_size} must divide the sequence length {resp_len}")
    return resp_len // block_size


def num_columns(resp_len: int, block_size: int, prompt_len: int = 0) -> int:
    """Columns of the pruned layout ``[prompt | x_t | x_0 without its last block]``."""
    check_layout(resp_len, block_size, prompt_len)
    return prompt_len + 2 * resp_len - block_size


def bd3_mask(q_idx: Tensor, kv_idx: Tensor, resp_len: int, block_size: int,
             prompt_len: int = 0) -> Tensor:
    """True where query column ``q_idx`` may attend key column ``kv_idx``.

    Columns: ``[0, P)`` prompt, ``[P, P + R)`` noisy ``x_t``, ``[P + R, P + 2R)`` clean ``x_0``.
    Pure and elementwise (broadcasts ``q_idx``/``kv_idx``), so it is both a FlexAttention
    ``mask_mod`` body and, on grids ``q[:, None]``, ``kv[None, :]``, a dense (Q, K) mask.
    """
    P, R, bs = prompt_len, resp_len, block_size
    q_prompt, kv_prompt = q_idx < P, kv_idx < P
    q_clean, kv_clean = q_idx >= P + R, kv_idx >= P + R
    q_noisy, kv_noisy = ~q_prompt & ~q_clean, ~kv_prompt & ~kv_clean
    # block index inside the response; meaningless (masked below) for prompt columns
    q_blk = torch.where(q_clean, q_idx - P - R, q_idx - P) // bs
    kv_blk = torch.where(kv_clean, kv_idx - P - R, kv_idx - P) // bs
    diagonal = q_noisy & kv_noisy & (q_blk == kv_blk)  # M_BD: x_t^b <-> x_t^b
    offset_causal = q_noisy & kv_clean & (kv_blk < q_blk)  # M_OBC: x_t^b -> x^{<b}
    block_causal = q_clean & kv_clean & (kv_blk <= q_blk)  # M_BC: x^b -> x^{<=b}
    return kv_prompt | diagonal | offset_causal | block_causal


@lru_cache(maxsize=32)
def _grid_mask(resp_len: int, block_size: int, prompt_len: int, device: torch.device) -> Tensor:
    n = num_columns(resp_len, block_size, prompt_len)
    cols = torch.arange(n, device=device)
    return bd3_mask(cols[:, None], cols[None, :], resp_len, block_size, prompt_len)[None, None]


def dense_bd3_mask(resp_len: int, block_size: int, prompt_len: int = 0,
                   key_keep: Optional[Tensor] = None, device=None) -> Tensor:
    """Dense bool mask ``(1 or B, 1, N, N)`` on the pruned layout (``N`` = :func:`num_columns`).

    key_keep: (B, N) bool, False = padding key (never attended, except by itself: every query
    attends to its own column so no softmax row is empty; real queries always see themselves).
    The padding-free mask is cached per layout (treat it as read-only).
    """
    device = torch.device(device if device is not None else "cpu")
    mask = _grid_mask(resp_len, block_size, prompt_len, device)  # (1, 1, N, N)
    if key_keep is not None:
        n = mask.shape[-1]
        if key_keep.shape[-1] != n or key_keep.dim() != 2:
            raise ValueError(f"key_keep must be (B, {n}), got {tuple(key_keep.shape)}")
        eye = torch.eye(n, dtype=torch.bool, device=device)[None, None]
        mask = (mask & key_keep.bool()[:, None, None, :]) | eye  # (B, 1, N, N)
    return mask


@lru_cache(maxsize=32)
def _flex_mask(resp_len: int, block_size: int, prompt_len: int, device: torch.device):
    n = num_columns(resp_len, block_size, prompt_len)

    def mask_mod(b, h, q_idx, kv_idx):
        return bd3_mask(q_idx, kv_idx, resp_len, block_size, prompt_len)

    return block_mask_from_mod(mask_mod, None, n, n, device)


def flex_bd3_mask(resp_len: int, block_size: int, prompt_len: int = 0,
                  key_keep: Optional[Tensor] = None, device=None):
    """The same mask as a FlexAttention ``BlockMask`` built from :func:`bd3_mask` (the
    padding-free one is cached per layout: building a BlockMask is not free)."""
    device = torch.device(device if device is not None else "cpu")
    n = num_columns(resp_len, block_size, prompt_len)
    if key_keep is None:
        return _flex_mask(resp_len, block_size, prompt_len, device)
    keep = key_keep.bool()

    def padded_mod(b, h, q_idx, kv_idx):
        base = bd3_mask(q_idx, kv_idx, resp_len, block_size, prompt_len)
        return (base & keep[b, kv_idx]) | (q_idx == kv_idx)

    return block_mask_from_mod(padded_mod, keep.shape[0], n, n, device)
