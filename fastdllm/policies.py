"""What a Fast-dLLM run recomputes and commits (Wu et al. 2025, "Fast-dLLM").

Two independent choices:

- the *cache policy* (Sec. 3.2, "Key-Value Cache for Block-Wise Decoding"): which columns each
  denoising step recomputes. Every block starts with one full forward over prompt + answer that
  (re)fills a :class:`dlm.cache.KVCache`; the later steps of the block recompute

  * ``None``     everything (no cache; LLaDA's baseline cost),
  * ``"prefix"`` the block and all columns after it, ``[lo, T)``, reading the prefix ``[0, lo)``
                 from the cache (Fig. 3a),
  * ``"dual"``   only the block ``[lo, hi)``, reading the prefix *and* the (all-[MASK]) suffix
                 ``[hi, T)`` from the cache (Fig. 3b, "DualCache").

  ``refresh_every = k`` additionally redoes the full committing forward at every k-th step of a
  block (``k = 1`` recomputes everything every step, i.e. the uncached computation).

- the *commit rule* (Sec. 3.3, "Confidence-Aware Parallel Decoding"): the baseline's linear top-k
  schedule, the threshold rule (Thm. 1 / eq. 5: commit every masked position with confidence
  >= tau, at least the most confident one) or the factor rule (eq. 6: the largest n with
  ``(n + 1)(1 - c(n)) < f``). The rules themselves live in :mod:`dlm.commit`.

Dream-style models (``config.shift_logits``) predict column ``j`` from hidden state ``j - 1``, so a
cached window that must predict column ``lo`` starts one column earlier, at ``lo - 1``, and drops
its first logit (:func:`window`).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Optional

from torch import Tensor

from dlm.commit import select_factor, select_threshold, select_topk
from dlm.stats import forward_flops

CACHE_MODES = (None, "prefix", "dual")


def _check_number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


@dataclass(frozen=True)
class Policy:
    """Validated cache policy + commit rule of one ``fastdllm.generate`` call."""

    cache: Optional[str] = None
    threshold: Optional[float] = None
    factor: Optional[float] = None
    refresh_every: Optional[int] = None

    def __post_init__(self) -> None:
        if self.cache not in CACHE_MODES:
            raise ValueError(f"cache must be one of {CACHE_MODES}, got {self.cache!r}")
        if self.threshold is not None and self.factor is not None:
            raise ValueError("give at most one of threshold and factor, not both")
        if self.threshold is not None:
            tau = _check_number("threshold", self.threshold)
            if not 0.0 < tau <= 1.0:
                raise ValueError(f"threshold must lie in (0, 1], got {self.threshold!r}")
        if self.factor is not None:
            f = _check_number("factor", self.factor)
            if not f > 0.0:
                raise ValueError(f"factor must be > 0, got {self.factor!r}")
        if self.refresh_every is not None:
            if isinstance(self.refresh_every, bool) or not isinstance(self.refresh_every, int):
                raise TypeError(f"refresh_every must be an int, got {type(self.refresh_every).__name__}")
            if self.refresh_every < 1:
                raise ValueError(f"refresh_every must be >= 1, got {self.refresh_every}")
            if self.cache is None:
                raise ValueError("refresh_every needs cache='prefix' or 'dual' (without a cache "
                                 "every forward is already a full one)")

    @property
    def parallel(self) -> bool:
        """True for the confidence-aware rules (dynamic number of steps per block)."""
        return self.threshold is not None or self.factor is not None

    @property
    def rule(self) -> str:
        if self.threshold is not None:
            return f"threshold={self.threshold:g}"
        if self.factor is not None:
            return f"factor={self.factor:g}"
        return "topk"

    def select(self, confidence: Tensor, eligible: Tensor, k: Optional[Tensor]) -> Tensor:
        """Positions to commit, bool (B, L). ``k`` (B,) is the top-k schedule's count (unused by
        the parallel rules). A row with nothing eligible commits nothing."""
        if self.threshold is not None:
            return select_threshold(confidence, eligible, self.threshold)
        if self.factor is not None:
            return select_factor(confidence, eligible, self.factor)
        return select_topk(confidence, eligible, k)

    def full_step(self, i: int) -> bool:
        """Whether step ``i`` of a block (0-based) runs the full forward over all columns."""
        if self.cache is None or i == 0:
            return True
        return self.refresh_every is not None and i % self.refresh_every == 0


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


def window_flops(config, q_len: int, k_len: int, head_positions: int) -> int:
    """FLOPs of one forward of ``q_len`` query columns over ``k_len`` keys with the LM head on
    ``head_positions`` columns (:func:`dlm.stats.forward_flops` for ``config``)."""
    return forward_flops(config.num_params(include_embeddings=False), config.n_layers, config.d_model,
                         q_len, k_len, config.vocab_size, head_positions)
