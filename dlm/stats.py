"""Per-call sampling statistics: NFE, positions computed, FLOPs, tokens until EOS, wall time."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor


@dataclass
class SampleStats:
    """What one ``generate`` call cost.

    nfe: forward passes (network function evaluations) for the batch.
    positions_computed: sum over forwards of the query columns recomputed, per row (a padded
        batch computes the same columns for every row).
    tokens_until_eos: (B,) generated tokens up to and including the first EOS (gen length if none).
    seconds: wall time of the call (on CUDA up to one ``torch.cuda.synchronize`` at its end, so
        the queued work is in it). forward_seconds: time inside model forwards, measured only by
        a *timed* call (``denoise(..., timed=True)``: a synchronisation before and after every
        forward on CUDA, which serialises launch and compute); an untimed call (the default)
        leaves it 0.0 and the per-kind seconds of ``forward_kinds`` 0.0, and then
        ``overhead_seconds`` (the rest, the sampler's own overhead) is the whole call.
    steps: denoising steps taken (commit rounds); tokens_per_step = committed tokens / steps.
    row_*: (B,) the same costs per row, counted only while the row needs the forward (its block
        still has [MASK] columns, or it is not finished) and over its real (non-padding) columns,
        so a row's costs do not depend on the batch it ran in: row_nfe, row_steps,
        row_positions, row_flops, row_tokens (answer columns the row committed), row_refreshes
        (steps whose forward recomputed all of the row's columns: the cache policy's refreshes).
    forward_kinds: ``(query columns, key columns, LM-head columns) -> [forwards, seconds, FLOPs per
        row]``: the forwards by shape (a block-start refresh, a cached window), for per-kind rooflines
        (seconds 0.0 unless the call is timed; the counts and FLOPs always).
    """

    nfe: int = 0
    positions_computed: int = 0
    steps: int = 0
    tokens_committed: int = 0
    seconds: float = 0.0
    forward_seconds: float = 0.0
    tokens_until_eos: Optional[Tensor] = None
    first_eos_step: Optional[Tensor] = None  # (B,) step at which the first EOS was committed, -1 if never
    row_nfe: Optional[Tensor] = None  # (B,) long
    row_steps: Optional[Tensor] = None  # (B,) long
    row_positions: Optional[Tensor] = None  # (B,) long
    row_flops: Optional[Tensor] = None  # (B,) long
    row_tokens: Optional[Tensor] = None  # (B,) long
    row_refreshes: Optional[Tensor] = None  # (B,) long
    forward_kinds: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def overhead_seconds(self) -> float:
        return max(self.seconds - self.forward_seconds, 0.0)

    @property
    def tokens_per_step(self) -> float:
        return self.tokens_committed / max(self.steps, 1)

    def as_dict(self) -> dict:
        out = {k: v.tolist() if isinstance(v, Tensor) else v for k, v in self.__dict__.items()
               if k not in ("extra", "forward_kinds") and v is not None}
        out["forward_kinds"] = [[*kind, *v] for kind, v in self.forward_kinds.items()]
        out["tokens_per_step"] = self.tokens_per_step
        out.update(self.extra)
        return out


class ForwardTimer:
    """Counts forwards into a :class:`SampleStats`; ``timed``: also their time.

    Untimed (the default) a forward is only counted: nothing waits for the device, so on CUDA the
    host runs ahead of the kernels. Timed, each forward is bracketed by ``torch.cuda.synchronize``
    (on CUDA) and its wall time added to ``forward_seconds`` and its kind's seconds."""

    def __init__(self, stats: SampleStats, device: torch.device, timed: bool = False) -> None:
        self.stats, self.device, self.timed = stats, device, timed
        self.cuda = device.type == "cuda"
        self._t0 = 0.0
        self._kind: Optional[list] = None

    def __call__(self, n_positions: int, kind: Optional[tuple[int, int]] = None, flops: int = 0) -> "ForwardTimer":
        """One forward of ``n_positions`` query columns; ``kind``: its (key columns, LM-head
        columns), recorded with ``flops`` per row in ``stats.forward_kinds`` when given."""
        self.stats.nfe += 1
        self.stats.positions_computed += n_positions
        self._kind = None
        if kind is not None:
            self._kind = self.stats.forward_kinds.setdefault((n_positions, *kind), [0, 0.0, flops])
            self._kind[0] += 1
        return self

    def sync(self) -> None:
        """Wait for the device's queued work (CUDA only)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def __enter__(self) -> "ForwardTimer":
        if self.timed:
            self.sync()
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if not self.timed:
            return
        self.sync()
        dt = time.perf_counter() - self._t0
        self.stats.forward_seconds += dt
        if self._kind is not None:
            self._kind[1] += dt


def tokens_until_eos(generated: Tensor, eos_id: Optional[int]) -> Tensor:
    """(B, G) generated ids -> (B,) count up to and including the first EOS (G if none)."""
    B, G = generated.shape
    if eos_id is None:
        return torch.full((B,), G, dtype=torch.long, device=generated.device)
    is_eos = generated == eos_id
    first = torch.where(is_eos.any(-1), is_eos.float().argmax(-1), torch.full((B,), G - 1, device=generated.device))
    return (first + 1).long()


def tail_before_answer(generated: Tensor, commit_step: Tensor, eos_id: Optional[int]) -> Tensor:
    """Share of the EOS tail committed before the answer was complete. LLaDA (Nie et al. 2025)
    samples its SFT model semi-autoregressively for this reason: trained on EOS-padded answers,
    it is so confident of EOS that pure diffusion commits the padding first and the answer is
    written into what is left.

    generated, commit_step: (B, G) ids and the step that committed each (-1: never). The answer
    is the tokens before the first EOS, the tail the first EOS and everything after it. Returns
    (B,) float: the share of tail positions committed at a step before the answer's last
    commit; NaN for rows with no EOS or no answer token.
    """
    B, G = generated.shape
    nan = torch.full((B,), float("nan"), device=generated.device)
    if eos_id is None:
        return nan
    n = tokens_until_eos(generated, eos_id)  # (B,) includes the first EOS
    has_eos = (generated == eos_id).any(-1)  # (B,)
    tail = torch.arange(G, device=generated.device)[None] >= (n - 1)[:, None]  # (B, G)
    done = torch.where(~tail, commit_step, -1).amax(-1)  # (B,) step that completed the answer
    early = tail & (commit_step >= 0) & (commit_step < done[:, None])  # (B, G)
    share = early.sum(-1) / tail.sum(-1).clamp(min=1)
    return torch.where(has_eos & (n > 1), share.float(), nan)


def forward_flops(n_params_no_emb: int, n_layers: int, d_model: int, q_len: int, k_len: int,
                  vocab_size: int, head_positions: Optional[int] = None) -> int:
    """Forward FLOPs of one window: 2 * params per query token for the dense layers, plus
    attention 4 * n_layers * d_model * Q * K (QK^T and AV), plus 2 * d * V per head position."""
    head_positions = q_len if head_positions is None else head_positions
    return (2 * n_params_no_emb * q_len + 4 * n_layers * d_model * q_len * k_len
            + 2 * d_model * vocab_size * head_positions)
