"""Noise schedules for BD3-LM: low-discrepancy block times, clipping, the search grid.

Linear schedule ``alpha_t = 1 - t``: each token of block b is masked independently with
probability ``t_b`` and its NELBO weight is ``-alpha'_t / (1 - alpha_t) = 1 / t`` (BD3-LM eq. 8).

Times. One ``t`` per (sequence, block), drawn *stratified* over the ``N = B * S`` (sequence,
block) pairs: ``u = (pi + U) / N`` with ``pi`` a uniformly random permutation of ``0..N-1`` and
``U ~ U[0, 1)`` (the antithetic / low-discrepancy sampler of MDLM and BD3-LM, permuted so every
single ``u`` is still marginally ``U[0, 1)`` and the estimator stays unbiased).

Clipping (BD3-LM sec. 4, "clipped schedules"): ``t ~ U[beta, omega]`` i.e.
``t = beta + (omega - beta) u``. Optionally (``resample=True``) a block whose realised masked
count falls outside ``[ceil(beta n), floor(omega n)]`` (``n`` its real tokens) is redrawn:
``candidates`` masks are drawn at once and the first admissible one kept (vectorized, no host
loop; the first candidate when none is admissible). Clipping and resampling bias the NELBO and
are for *training* only: perplexity is always reported with the unclipped ``U[0, 1]`` schedule.

Data-driven search (BD3-LM sec. 4 / Table 6): :func:`bd3lm.clipping.search_clipping` picks the
``(beta, omega)`` of a grid (:data:`DEFAULT_GRID`, :func:`check_grid`) that minimises the variance
of the NELBO estimate. It lives in its own module because it runs the loss, which imports this
one (schedules -> loss -> clipping, no cycle).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Optional

import torch
from torch import Tensor

#: smallest block time: a block with t -> 0 is almost never masked, and 1/t stays finite.
T_MIN = 1e-6
NOISE_U, NOISE_R = "bd3_u", "bd3_r"
#: default search grid: beta in {0, .1, ..., .5}, omega in {.5, ..., 1}, beta < omega.
DEFAULT_GRID = tuple((b / 10, o / 10) for b in range(0, 6) for o in range(5, 11) if b < o)


def _check_unit(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not 0.0 <= value <= 1.0 or math.isnan(value):
        raise ValueError(f"{name} must lie in [0, 1], got {value}")
    return float(value)


@dataclass(frozen=True)
class ClipSchedule:
    """``t ~ U[beta, omega]`` with ``0 <= beta < omega <= 1``; ``(0, 1)`` is the unclipped NELBO."""

    beta: float = 0.0
    omega: float = 1.0
    resample: bool = False
    candidates: int = 8  # masks drawn per block when resampling

    def __post_init__(self) -> None:
        beta, omega = _check_unit("beta", self.beta), _check_unit("omega", self.omega)
        if beta >= omega:
            raise ValueError(f"beta={beta} must be < omega={omega}")
        if not isinstance(self.resample, bool):
            raise TypeError(f"resample must be a bool, got {type(self.resample).__name__}")
        if not isinstance(self.candidates, int) or isinstance(self.candidates, bool) or self.candidates < 1:
            raise ValueError(f"candidates must be an int >= 1, got {self.candidates!r}")
        object.__setattr__(self, "beta", beta)
        object.__setattr__(self, "omega", omega)

    @property
    def is_clipped(self) -> bool:
        return (self.beta, self.omega) != (0.0, 1.0) or self.resample

    @property
    def num_candidates(self) -> int:
        return self.candidates if self.resample else 1

    def times(self, u: Tensor) -> Tensor:
        """``u`` in [0, 1) -> ``t`` in [max(beta, T_MIN), omega) (same shape)."""
        return (self.beta + (self.omega - self.beta) * u).clamp_min(T_MIN)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ClipSchedule":
        return cls(**d)


UNCLIPPED = ClipSchedule()


def stratified_uniform(n_rows: int, n_cols: int, generator: Optional[torch.Generator],
                       device=None) -> Tensor:
    """Low-discrepancy ``u`` (n_rows, n_cols): one draw in each of the ``N`` strata
    ``[k/N, (k+1)/N)``, strata assigned to cells by a random permutation."""
    n = n_rows * n_cols
    perm = torch.randperm(n, generator=generator, device=device)  # (N,)
    jitter = torch.rand(n, generator=generator, device=device, dtype=torch.float64)  # (N,)
    return ((perm.to(torch.float64) + jitter) / n).view(n_rows, n_cols)  # (B, S)


def num_slots(seq_len: int, block_size: int) -> int:
    """Block slots a row of ``seq_len`` tokens can need (its response may start anywhere)."""
    return -(-seq_len // block_size)


def draw_noise(batch_size: int, seq_len: int, block_size: int, schedule: ClipSchedule,
               generator: Optional[torch.Generator], device=None) -> dict[str, Tensor]:
    """All randomness of one NELBO estimate, batch-leading (so it shards by rows):

    ``bd3_u`` (B, S) stratified block uniforms (S = ceil(seq_len / block_size) block slots),
    ``bd3_r`` (B, K, seq_len) token uniforms for K candidate masks (K = 1 unless resampling).
    """
    u = stratified_uniform(batch_size, num_slots(seq_len, block_size), generator, device)
    r = torch.rand(batch_size, schedule.num_candidates, seq_len, generator=generator,
                   device=device, dtype=torch.float64)  # (B, K, L)
    return {NOISE_U: u, NOISE_R: r}


def block_masks(r: Tensor, t_tok: Tensor, keep: Tensor, block_size: int,
                schedule: ClipSchedule) -> Tensor:
    """Masked positions (B, R) bool from candidate uniforms ``r`` (B, K, R) and times (B, R).

    Candidate k masks ``r[:, k] < t``; with resampling the first candidate whose per-block
    masked count lies in the clipped range is taken (BD3-LM's resampling of out-of-range
    blocks, done for all candidates at once)."""
    cand = (r < t_tok[:, None, :]) & keep[:, None, :]  # (B, K, R)
    if cand.shape[1] == 1 or not schedule.resample:
        return cand[:, 0]
    B, K, R = cand.shape
    nb = R // block_size
    count = cand.view(B, K, nb, block_size).sum(-1)  # (B, K, nb)
    n = keep.view(B, 1, nb, block_size).sum(-1).to(torch.float64)  # (B, 1, nb)
    lo, hi = torch.ceil(schedule.beta * n - 1e-9), torch.floor(schedule.omega * n + 1e-9)
    empty = lo > hi  # no admissible count: relax to [floor(beta n), ceil(omega n)]
    lo = torch.where(empty, torch.floor(schedule.beta * n), lo)
    hi = torch.where(empty, torch.ceil(schedule.omega * n), hi)
    ok = (count >= lo) & (count <= hi)  # (B, K, nb)
    first = torch.where(ok.any(1), ok.to(torch.int8).argmax(1), torch.zeros_like(ok[:, 0], dtype=torch.long))
    pick = first.repeat_interleave(block_size, dim=-1)  # (B, R)
    return cand.gather(1, pick[:, None, :]).squeeze(1)  # (B, R)


def check_grid(grid: Iterable) -> tuple[tuple[float, float], ...]:
    """Validate a grid of (beta, omega) pairs (each must be a valid :class:`ClipSchedule`)."""
    pairs = tuple(grid)
    if not pairs:
        raise ValueError("grid: need at least one (beta, omega) pair")
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"grid entries must be (beta, omega) pairs, got {pair!r}")
        ClipSchedule(pair[0], pair[1])
    return tuple((float(b), float(o)) for b, o in pairs)
