"""Fast-dLLM sampling: block-wise KV caching + confidence-aware parallel decoding.

Wu et al. 2025, "Fast-dLLM: Training-free Acceleration of Diffusion LLM by Enabling KV Cache and
Parallel Decoding" (the reference ``generate_with_prefix_cache`` / ``generate_with_dual_cache``
before its torch.compile rewrite). The answer is ``gen_length`` [MASK] columns after the
(left-padded) prompt, decoded in semi-autoregressive blocks of ``block_length``. In every block:

1. one full forward over prompt + answer; with a cache it writes K/V of every column; its logits
   give the block's first commit (1 NFE);
2. further steps recompute only the window of the cache policy (:mod:`fastdllm.policies`),
   optionally with a full refresh every ``refresh_every`` steps, until the block is clean.

Each step proposes ``x0`` and a confidence for every block column (:func:`dlm.commit.propose`)
and commits masked block columns by the top-k schedule (``steps`` split evenly over blocks; LLaDA
Alg. 2), the threshold rule (Fast-dLLM eq. 5) or the factor rule (eq. 6). Committed tokens are
never remasked. With ``cache=None`` and no rule this is exactly :func:`dlm.sampling.generate`.
Like the baseline, no sampler ever proposes [MASK] (its logit is set to -inf), so every step
commits at least one real token in each row whose block is unfinished and a parallel-decoded
block takes at most ``block_length`` steps (the reference loops forever if a model proposes
[MASK]; trained models never do).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from dlm.attention import BACKENDS, key_padding_mask
from dlm.cache import KVCache
from dlm.commit import num_transfer_tokens, propose
from dlm.sampling import GenerateOutput, check_blocks, check_sampling, eos_ids, prepare_batch
from dlm.stats import ForwardTimer, SampleStats, tokens_until_eos

from .policies import Policy, window, window_flops


@dataclass(frozen=True)
class _BlockForward:
    """Runs the forward of step ``i`` of block ``[lo, hi)`` under a policy; counts NFE,
    positions and FLOPs into the timer's stats."""

    model: torch.nn.Module
    policy: Policy
    positions: Tensor  # (B, T)
    attn: Optional[Tensor]  # (B, 1, 1, T) key padding or None
    cache: Optional[KVCache]
    timer: ForwardTimer
    backend: str

    def __call__(self, x: Tensor, lo: int, hi: int, i: int) -> Tensor:
        """Logits of the block columns, (B, hi - lo, V)."""
        T = x.shape[1]
        stats = self.timer.stats
        if self.policy.full_step(i):
            commit = self.cache is not None
            with self.timer(T):
                logits = self.model(x, positions=self.positions, cache=self.cache, attn_mask=self.attn,
                                    start=0, commit=commit, backend=self.backend,
                                    logits_slice=slice(lo, hi))  # (B, L, V)
            stats.extra["flops"] += window_flops(self.model.config, T, T, hi - lo)
            if self.policy.cache == "prefix":
                self.cache.truncate(lo)  # keep K/V of the columns before the block only
            return logits
        w = window(self.policy.cache, lo, hi, T, self.model.config.shift_logits)
        with self.timer(w.width):
            logits = self.model(x[:, w.start:w.stop], positions=self.positions[:, w.start:w.stop],
                                cache=self.cache, attn_mask=self.attn, start=w.start, commit=False,
                                backend=self.backend, logits_slice=w.logits_slice)  # (B, L, V)
        stats.extra["flops"] += window_flops(self.model.config, w.width, T, hi - lo)
        return logits


@dataclass(frozen=True)
class StepView:
    """What ``generate(callback=...)`` sees after every denoising step (read-only use; the tensors
    are the sampler's live buffers, clone what you keep).

    block, step: block index and step within it; global_step: the value in ``commit_step``;
    lo, hi: the block's columns; full: the step ran the full forward (cache refreshed);
    x: (B, T) sequence after this step's commit; logits: (B, hi - lo, V) the step's raw block
    logits; commit: (B, hi - lo) bool, columns committed by the step; cache: the KVCache the
    step's forward read (None without a cache).
    """

    block: int
    step: int
    global_step: int
    lo: int
    hi: int
    full: bool
    x: Tensor
    logits: Tensor
    commit: Tensor
    cache: Optional[KVCache]


def _truncate_after_eos(answer: Tensor, eos: int) -> Tensor:
    """(B, G) answer with every column after each row's first EOS set to EOS."""
    seen = (answer == eos).long().cumsum(dim=-1) > 0  # (B, G) True from the first EOS on
    return torch.where(seen, torch.full_like(answer, eos), answer)


@torch.no_grad()
def generate(
    model,
    input_ids: Tensor,
    attention_mask: Optional[Tensor] = None,
    gen_length: int = 128,
    block_length: int = 32,
    steps: Optional[int] = None,
    cache: Optional[str] = None,
    threshold: Optional[float] = None,
    factor: Optional[float] = None,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    stop_at_eos: bool = False,
    refresh_every: Optional[int] = None,
    mask_id: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    backend: str = "sdpa",
    callback: Optional[Callable[[StepView], None]] = None,
) -> GenerateOutput:
    """Fast-dLLM generation for a (left-padded) prompt batch ``input_ids`` (B, P).

    cache: ``None`` | ``"prefix"`` | ``"dual"`` (Fast-dLLM Sec. 3.2); refresh_every: also redo
    the full committing forward every k-th step of a block. threshold (in (0, 1]) / factor (> 0):
    confidence-aware parallel decoding (eq. 5 / eq. 6), which runs until the block has no
    [MASK] left; otherwise ``steps`` (default ``gen_length``) are split evenly over the blocks
    as LLaDA's linear top-k schedule. stop_at_eos: once every row has ``config.eos_token_id``
    in its answer after a block, skip the remaining blocks; in the output everything after a
    row's first EOS is EOS (the run-to-the-end output truncated the same way).

    callback(view): called after every step with a :class:`StepView` (observation only).
    Returns :class:`dlm.sampling.GenerateOutput`; ``stats.extra`` holds ``flops`` (FLOP count of
    all forwards, :func:`dlm.stats.forward_flops`), ``blocks_run``, ``cache`` and ``rule``.
    """
    policy = Policy(cache, threshold, factor, refresh_every)
    steps = gen_length if steps is None else steps
    steps_per_block = check_blocks(gen_length, block_length, steps)
    check_sampling(temperature, remasking)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    eos = model.config.eos_token_id
    if stop_at_eos and eos is None:
        raise ValueError("stop_at_eos=True needs model.config.eos_token_id")
    batch = prepare_batch(model, input_ids, attention_mask, gen_length, mask_id)

    t_start = time.perf_counter()
    stats = SampleStats(extra={"cache": str(policy.cache), "rule": policy.rule, "flops": 0})
    timer = ForwardTimer(stats, batch.x.device)
    x, P, mid = batch.x, batch.prompt_len, batch.mask_id
    B, T = x.shape
    kv = None if policy.cache is None else KVCache.for_model(model, B, T)
    forward = _BlockForward(model, policy, batch.positions, key_padding_mask(batch.attention_mask),
                            kv, timer, backend)
    stop_t = torch.tensor(eos_ids(model), dtype=torch.long, device=x.device)
    commit_step = torch.full((B, gen_length), -1, dtype=torch.long, device=x.device)
    first_eos = torch.full((B,), -1, dtype=torch.long, device=x.device)
    step = blocks_run = 0
    for b in range(gen_length // block_length):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        k_sched = num_transfer_tokens((x[:, lo:hi] == mid).sum(-1), steps_per_block)  # (B, spb)
        i = 0
        while True:
            eligible = x[:, lo:hi] == mid  # (B, L)
            if policy.parallel:  # dynamic step count: the one host sync per step
                if i > 0 and not bool(eligible.any()):
                    break
                if i == block_length:  # unreachable: every step commits >= 1 per unclean row
                    raise RuntimeError("parallel decoding made no progress in a block")
            elif i == steps_per_block:
                break
            raw = forward(x, lo, hi, i)  # (B, L, V)
            x0, conf = propose(raw, temperature, remasking, generator, (mid,))  # (B, L)
            k = None if policy.parallel else k_sched[:, i]
            commit = policy.select(conf, eligible, k)  # (B, L); clean rows commit nothing
            x[:, lo:hi] = torch.where(commit, x0, x[:, lo:hi])
            cs = commit_step[:, lo - P:hi - P]
            commit_step[:, lo - P:hi - P] = torch.where(commit, step, cs)
            if stop_t.numel():
                hit = (commit & torch.isin(x0, stop_t)).any(-1)  # (B,)
                first_eos = torch.where(hit & (first_eos < 0), step, first_eos)
            if callback is not None:
                callback(StepView(b, i, step, lo, hi, policy.full_step(i), x, raw, commit, kv))
            i += 1
            step += 1
        blocks_run += 1
        if stop_at_eos and bool((x[:, P:hi] == eos).any(-1).all()):
            break
    if stop_at_eos:
        x[:, P:] = _truncate_after_eos(x[:, P:], eos)
    stats.steps = step
    stats.tokens_committed = blocks_run * block_length  # per row
    stats.tokens_until_eos = tokens_until_eos(x[:, P:], eos)
    stats.first_eos_step = first_eos
    stats.extra["blocks_run"] = blocks_run
    stats.seconds = time.perf_counter() - t_start
    return GenerateOutput(x, stats, commit_step)
