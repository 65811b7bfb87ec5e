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

from dlm.commit import check_int
from dlm.sample import Run
from dlm.sampling import FullSequence
from dlm.stats import forward_flops

from .adaptive import AdaptiveCache
from .delayed import DelayedCache

CACHE_MODES = (None, "prefix", "dual", "delayed", "adaptive")


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


@dataclass(frozen=True)
class PrefixCache:
    """Fig. 3a: cached steps recompute ``[lo, T)``; full refresh at each block start (and every
    ``refresh_every``-th step)."""

    refresh_every: Optional[int] = None
    at_block: bool = False  # windows start at the block even with shifted logits (Dream rules)
    name = "prefix"

    def __post_init__(self) -> None:
        if self.refresh_every is not None:
            check_int("refresh_every", self.refresh_every)
        if not isinstance(self.at_block, bool):
            raise TypeError(f"at_block must be a bool, got {type(self.at_block).__name__}")

    def start(self, run: Run) -> None:
        run.new_cache()

    def full_step(self, i: int) -> bool:
        """Whether step ``i`` of a block (0-based) runs the full committing forward."""
        return i == 0 or (self.refresh_every is not None and i % self.refresh_every == 0)

    def block_done(self, run: Run, lo: int, hi: int, last: bool) -> None:
        pass

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


@dataclass(frozen=True)
class DualCache(PrefixCache):
    """Fig. 3b: cached steps recompute only the block ``[lo, hi)``; prefix and suffix K/V from the
    last full forward."""

    name = "dual"


def cache_policy(cache: Optional[str], refresh_every: Optional[int] = None, at_block: bool = False, *,
                 delay: Optional[int] = None, tolerance: Optional[float] = None, every_block: bool = True):
    """The policy of ``cache`` (``CACHE_MODES``; None is :class:`dlm.sampling.FullSequence`);
    ``at_block``: cached windows start at the block (Fast-dLLM's Dream rules); ``delay``: of
    ``"delayed"`` (default 1); ``tolerance``, ``every_block``: of ``"adaptive"`` (default 0.1)."""
    if cache not in CACHE_MODES:
        raise ValueError(f"cache must be one of {CACHE_MODES}, got {cache!r}")
    for knob, owner, given in (("delay", "delayed", delay is not None), ("tolerance", "adaptive", tolerance is not None),
                               ("every_block", "adaptive", every_block is not True)):
        if given and cache != owner:
            raise ValueError(f"{knob} is an option of cache={owner!r}, not of {cache!r}")
    if cache is None:
        if refresh_every is not None:
            check_int("refresh_every", refresh_every)
            raise ValueError("refresh_every needs cache='prefix' or 'dual' (without a cache "
                             "every forward is already a full one)")
        return FullSequence()
    if cache == "delayed":
        return DelayedCache(1 if delay is None else delay, refresh_every, at_block)
    if cache == "adaptive":
        if refresh_every is not None:
            raise ValueError("cache='adaptive' refreshes on drift (tolerance), not refresh_every")
        return AdaptiveCache(0.1 if tolerance is None else tolerance, every_block=every_block, at_block=at_block)
    return (PrefixCache if cache == "prefix" else DualCache)(refresh_every, at_block)


def window_flops(config, q_len: int, k_len: int, head_positions: int) -> int:
    """FLOPs of one forward of ``q_len`` query columns over ``k_len`` keys with the LM head on
    ``head_positions`` columns (:func:`dlm.stats.forward_flops` for ``config``)."""
    return forward_flops(config.num_params(include_embeddings=False), config.n_layers, config.d_model,
                         q_len, k_len, config.vocab_size, head_positions)
