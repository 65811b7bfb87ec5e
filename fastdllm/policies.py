"""Fast-dLLM's cache policies (Wu et al. 2025, Sec. 3.2, "Key-Value Cache for Block-Wise
Decoding") for the one loop :func:`dlm.sample.denoise`.

Every block starts with one full forward over prompt + answer that (re)fills the
:class:`dlm.cache.KVCache` and gives the block's first commit; the later steps of the block
recompute only a window and read every other column from the cache:

* ``"prefix"`` the block and all columns after it, ``[lo, T)``, reading the prefix ``[0, lo)``
  (Fig. 3a);
* ``"dual"``   only the block ``[lo, hi)``, reading the prefix *and* the (all-[MASK]) suffix
  ``[hi, T)`` (Fig. 3b, "DualCache").

``refresh_every = k`` additionally redoes the full committing forward at every k-th step of a
block (``k = 1`` recomputes everything every step, i.e. the uncached computation). The cache is
approximate: the cached K/V of committed and suffix columns are those of the last full forward.

Dream-style models (``config.shift_logits``) predict column ``j`` from hidden state ``j - 1``, so a
cached window that must predict column ``lo`` starts one column earlier, at ``lo - 1``, and drops
its first logit (:func:`window`). Under Fast-dLLM's Dream rules (:mod:`fastdllm.dream`) column
``lo`` is committed at the block's full step and the window starts at ``lo`` (``at_block``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import Tensor

from dlm.policy import CachePolicy, at_block_field, refresh_every_field
from dlm.registry import register
from dlm.sample import Run
from dlm.stats import forward_flops


@dataclass(frozen=True)
class Window:
    """Columns ``[start, stop)`` a cached step recomputes and the window-relative slice of the
    logits that belongs to the block ``[lo, hi)``."""

    start: int
    stop: int
    logits_slice: slice

    @property
    def width(self) -> int:
        return self.stop - self.start


def window(cache: str, lo: int, hi: int, seq_len: int, shift_logits: bool) -> Window:
    """Window recomputed by a cached step of block ``[lo, hi)`` in a sequence of ``seq_len``.

    prefix: ``[lo, T)``; dual: ``[lo, hi)``. With shifted logits the window starts at ``lo - 1``
    (``lo >= 1`` since the prompt is non-empty) so the block's first logit comes from the hidden
    state of column ``lo - 1`` computed with the window, as in the uncached forward.
    """
    if cache not in ("prefix", "dual"):
        raise ValueError(f"cache must be 'prefix' or 'dual', got {cache!r}")
    start = lo - 1 if shift_logits else lo
    stop = seq_len if cache == "prefix" else hi
    first = lo - start
    return Window(start, stop, slice(first, first + hi - lo))


@register("policy", "prefix")
@dataclass(frozen=True)
class PrefixCache(CachePolicy):
    """Fast-dLLM's prefix cache (Fig. 3a): cached steps recompute the block and everything after it,
    ``[lo, T)``; a full refresh at each block start (and every ``refresh_every``-th step)."""

    refresh_every: Optional[int] = refresh_every_field()
    at_block: bool = at_block_field()
    approximate = True
    same_as = ("none", (("refresh_every", 1),))  # every step a full forward: the uncached computation

    def start(self, run: Run) -> None:
        run.new_cache()

    def full_step(self, i: int) -> bool:
        """Whether step ``i`` of a block (0-based) runs the full committing forward."""
        return i == 0 or (self.refresh_every is not None and i % self.refresh_every == 0)

    def logits(self, run: Run, lo: int, hi: int, i: int) -> Tensor:
        T = run.x.shape[1]
        run.refreshed = self.full_step(i)
        if run.refreshed:
            logits = run.forward(0, T, run.key_padding, slice(lo, hi), commit=True)  # (B, L, V)
            if self.name == "prefix":
                run.cache.truncate(lo)  # keep K/V of the columns before the block only
            return logits
        w = window(self.name, lo, hi, T, run.model.config.shift_logits and not self.at_block)
        return run.forward(w.start, w.stop, run.key_padding, w.logits_slice)  # (B, L, V)


@register("policy", "dual")
@dataclass(frozen=True)
class DualCache(PrefixCache):
    """Fast-dLLM's dual cache (Fig. 3b): cached steps recompute only the block ``[lo, hi)``; prefix
    and suffix K/V from the last full forward."""


def window_flops(config, q_len: int, k_len: int, head_positions: int) -> int:
    """FLOPs of one forward of ``q_len`` query columns over ``k_len`` keys with the LM head on
    ``head_positions`` columns (:func:`dlm.stats.forward_flops` for ``config``)."""
    return forward_flops(config.num_params(include_embeddings=False), config.n_layers, config.d_model,
                         q_len, k_len, config.vocab_size, head_positions)
