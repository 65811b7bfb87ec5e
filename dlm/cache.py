"""One KV cache for every caching policy.

:class:`KVCache` preallocates keys (after RoPE) and values for every layer, ``(B, H, T_max, D)``
each, indexed by *column of the running sequence*. A forward over a window of columns
``[start, start + W)`` reads cached K/V for every other column below ``max(length, start + W)``;
the window's fresh K/V are written into the storage in place and attention reads one view
``[0, key_len)`` of it (no per-step concatenation), and either

- ``commit=True``: they stay valid (``length`` extends over the window), or
- ``commit=False``: they are scratch: the window's columns hold this call's K/V until a later
  forward overwrites them. A policy recomputes a window before it reads it again (the prefix and
  dual windows at every step, refreshed at block starts; BD3-LM's block, committed clean), so no
  policy reads scratch K/V of a column outside the window that wrote them.

Policies (``dlm.sampling`` none, ``bd3lm`` exact, ``fastdllm`` prefix/dual/delayed/adaptive)
differ only in which window they recompute, when they commit and which columns they pin
(``keep``: per row, read from the cache even inside the window).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


class KVCache:
    """Preallocated per-layer keys/values: ``k``, ``v`` of shape (n_layers, B, H, T_max, D)."""

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: Optional[torch.device | str] = None,
    ) -> None:
        if min(n_layers, batch_size, n_kv_heads, head_dim, max_len) <= 0:
            raise ValueError("KVCache dimensions must all be positive")
        shape = (n_layers, batch_size, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, H, T, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, H, T, D)
        self.length = 0  # columns [0, length) hold valid K/V
        self.max_len = max_len
        self.keep: Optional[Tensor] = None  # (B, max_len) bool: cached K/V read even inside a window

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int) -> "KVCache":
        """A cache shaped for ``model`` (a :class:`dlm.model.Transformer`)."""
        cfg = model.config
        if max_len > cfg.max_seq_len:
            raise ValueError(f"max_len={max_len} exceeds the model's max_seq_len={cfg.max_seq_len}")
        p = next(model.parameters())
        return cls(cfg.n_layers, batch_size, cfg.n_kv_heads, cfg.head_dim, max_len, p.dtype, p.device)

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def key_len(self, start: int, width: int) -> int:
        """Number of key columns a window ``[start, start+width)`` attends over."""
        return max(self.length, start + width)

    def check_window(self, start: int | Tensor, width: int) -> None:
        if isinstance(start, Tensor):  # a gathered window: its columns must be cached already
            if start.dim() != 2 or start.shape[1] != width or start.shape[0] != self.batch_size:
                raise ValueError(f"gathered window columns must be (B={self.batch_size}, W={width}), "
                                 f"got {tuple(start.shape)}")
            if width > self.length:
                raise ValueError(f"a gathered window of {width} columns needs them cached (length {self.length})")
            return
        if start < 0 or start > self.length:
            raise ValueError(
                f"window start={start} must lie in [0, cache.length={self.length}] (no gaps)"
            )
        if start + width > self.max_len:
            raise ValueError(f"window end {start + width} exceeds cache max_len={self.max_len}")

    def layer_kv(self, layer: int, k_new: Tensor, v_new: Tensor, start: int | Tensor) -> tuple[Tensor, Tensor]:
        """Keys/values over columns ``[0, key_len)`` with the window's fresh ones written in place.

        ``start`` a (B, W) long tensor: a gathered window, its columns per row (each below
        ``length``, no repeats in a row): the fresh K/V are scattered there and every cached column
        is read (``keep`` does not apply).

        k_new, v_new: (B, H, W, D). Returns views (B, H, key_len, D) of the storage. Where ``keep``
        is set (per row and column, e.g. the columns a delayed policy has cached), the window reads
        the cached K/V instead of the fresh ones, which are not written. A committing forward and a
        scratch one write alike (see the module docstring); the model extends ``length`` after a
        committing forward.

        Under ``torch.compile`` this runs outside the graph (a graph break per layer): traced, the
        in-place write and the views read after it are functionalized into fresh copies of the
        cache buffer on every call, whose page faults made a compiled cached forward several times
        slower than eager at batch 8 (``experiments.bench.breakdown --compile``).
        """
        if torch.compiler.is_compiling():  # (torch._dynamo is loaded then; an eager import of dlm stays without it)
            return torch.compiler.disable(KVCache._layer_kv)(self, layer, k_new, v_new, start)
        return self._layer_kv(layer, k_new, v_new, start)

    def _layer_kv(self, layer: int, k_new: Tensor, v_new: Tensor, start: int | Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`layer_kv`'s write and read."""
        if isinstance(start, Tensor):
            idx = start[:, None, :, None].expand_as(k_new)  # (B, H, W, D)
            self.k[layer].scatter_(2, idx, k_new)
            self.v[layer].scatter_(2, idx, v_new)
            return self.k[layer, :, :, :self.length], self.v[layer, :, :, :self.length]
        width = k_new.shape[2]
        stop = start + width
        end = self.key_len(start, width)
        if self.keep is not None:
            pin = self.keep[:, None, start:stop, None]  # (B, 1, W, 1)
            k_new = torch.where(pin, self.k[layer, :, :, start:stop], k_new)
            v_new = torch.where(pin, self.v[layer, :, :, start:stop], v_new)
        self.k[layer, :, :, start:stop] = k_new
        self.v[layer, :, :, start:stop] = v_new
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, end: int) -> None:
        """Mark columns below ``end`` valid (called by the model after a committing forward)."""
        self.length = max(self.length, end)

    def truncate(self, length: int) -> None:
        """Forget columns at and after ``length`` (their storage is overwritten later)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length must lie in [0, {self.length}], got {length}")
        self.length = length

    def reset(self) -> None:
        self.length = 0
        self.keep = None
