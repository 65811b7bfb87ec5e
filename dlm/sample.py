"""THE denoising loop: every sampler of the library is this function with a cache policy and a
commit rule plugged in.

The answer is ``gen_length`` [MASK] columns after a left-padded prompt, decoded block by block
(semi-autoregressively; one block of ``gen_length`` is LLaDA's full-sequence sampler). Inside a
block every step

1. asks the *cache policy* for the logits of the block's columns: it decides which window of
   columns is recomputed, under which attention mask, and when K/V are (re)written
   (:class:`dlm.sampling.FullSequence`; ``fastdllm.policies`` prefix / dual;
   ``bd3lm.policy`` exact block-causal);
2. turns them into a proposed token and a confidence per column (the *proposal*:
   :class:`dlm.commit.Proposal`, LLaDA Alg. 2 / BD3-LM's SUBS parameterisation with ``top_p``;
   :class:`dlm.dream.DreamProposal`, Dream's ``sample_tokens``);
3. asks the *commit rule* which still-masked columns take their proposal
   (:mod:`dlm.commit`: top-k schedule, threshold, factor, first-hitting, ancestral).

Committed tokens are never remasked. With ``stop_at_eos`` a row is finished once a finished block
holds an EOS: its later blocks are filled with EOS (it commits nothing more), generation stops
when every row is finished, and everything after a row's first EOS is EOS.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from .attention import BACKENDS, key_padding_mask
from .cache import KVCache
from .commit import CommitRule, Proposal
from .stats import ForwardTimer, SampleStats, forward_flops, tokens_until_eos
from .validate import PreparedBatch


@dataclass
class GenerateOutput:
    """sequences: (B, P + gen_length) prompt included; stats: the call's cost; commit_step:
    (B, gen_length) the denoising step that committed each answer column (-1 if never)."""

    sequences: Tensor
    stats: SampleStats
    commit_step: Tensor


@dataclass(frozen=True)
class StepView:
    """What ``callback`` sees after every denoising step (observation only: the tensors are the
    sampler's live buffers, clone what you keep).

    block, step: block index and step within it; global_step: the value in ``commit_step``;
    lo, hi: the block's columns; refreshed: the policy's ``run.refreshed`` for the step (a bool,
    or (B,) bool per row); x: (B, T) sequence after the commit; logits: (B, hi - lo, V) the step's
    raw block logits; commit: (B, hi - lo) bool, columns committed by the step; cache: the KVCache
    the step's forward read (None without a cache).
    """

    block: int
    step: int
    global_step: int
    lo: int
    hi: int
    refreshed: bool | Tensor
    x: Tensor
    logits: Tensor
    commit: Tensor
    cache: Optional[KVCache]

    @property
    def full(self) -> bool:
        """The step's forward covered every column of every row (cache refreshed); a host read
        when the policy refreshes per row, so only a callback that asks pays it."""
        r = self.refreshed
        return r if isinstance(r, bool) else bool(r.all())


Callback = Callable[[StepView], None]


@dataclass
class Run:
    """The state of one sampler call that a cache policy reads and writes: the sequence ``x``
    (B, T), per-row positions, the key-padding mask (or None), the KV cache (a policy creates it
    in ``start``), the blocks ``[(lo, hi), ...]`` and the stats its forwards are counted into."""

    model: torch.nn.Module
    x: Tensor  # (B, T)
    positions: Tensor  # (B, T)
    attention_mask: Optional[Tensor]  # (B, T) 0/1 or None (no padding)
    prompt_len: int
    mask_id: int
    blocks: tuple[tuple[int, int], ...]
    backend: str
    stats: SampleStats
    timer: ForwardTimer
    cache: Optional[KVCache] = None
    key_padding: Optional[Tensor] = field(init=False)  # (B, 1, 1, T) bool or None
    active: Optional[Tensor] = None  # (B,) bool: rows that need the next forward (None: all)
    refreshed: bool | Tensor = False  # the last step recomputed every column: for all rows, or (B,) per row
    state: dict = field(default_factory=dict)  # a policy's per-call tensors

    def __post_init__(self) -> None:
        self.key_padding = key_padding_mask(self.attention_mask)
        B = self.x.shape[0]
        zeros = lambda: torch.zeros(B, dtype=torch.long, device=self.x.device)  # noqa: E731
        st = self.stats
        st.row_nfe, st.row_steps, st.row_positions, st.row_flops = zeros(), zeros(), zeros(), zeros()
        st.row_refreshes = zeros()
        am = self.attention_mask  # real columns before each column, once: (B, T + 1)
        self._real_before = None if am is None else torch.nn.functional.pad(am.long().cumsum(-1), (1, 0))
        cfg = self.model.config
        self._dense = cfg.num_params(include_embeddings=False)
        self._rope: Optional[tuple[Tensor, Tensor]] = None  # (B, 1, T, D) each, on the first forward
        self._rope_tables = getattr(self.model, "rope_tables", None)  # None: a model without RoPE tables

    def _real(self, start: int, stop: int) -> Tensor | int:
        """(B,) non-padding columns in ``[start, stop)`` (an int when there is no padding)."""
        if self._real_before is None:
            return stop - start
        return self._real_before[:, stop] - self._real_before[:, start]

    def _flops(self, q, k, n_head: int, copies: int):
        cfg = self.model.config
        return copies * forward_flops(self._dense, cfg.n_layers, cfg.d_model, q, k, cfg.vocab_size, n_head)

    def _count(self, start: int, width: int, keys: int, n_head: int, copies: int,
               row_span: Optional[tuple[Tensor, Tensor]] = None) -> int:
        """One forward's cost: the batch's (padded width) and each active row's (real columns of
        its window: ``row_span`` (starts (B,), stops (B,)) when given, else the batch's). Returns the
        forward's FLOPs per row of the batch."""
        st = self.stats
        flops = self._flops(width, keys, n_head, copies)
        st.extra["flops"] += flops
        q, k = self._real(start, start + width), self._real(0, keys)  # keys are columns [0, keys)
        if row_span is not None:
            lo, hi = row_span  # (B,) each
            real = self._real_before
            q = (hi - lo) if real is None else real.gather(1, hi[:, None])[:, 0] - real.gather(1, lo[:, None])[:, 0]
        on = torch.ones_like(st.row_nfe, dtype=torch.bool) if self.active is None else self.active
        st.row_nfe += on
        st.row_positions += on * q
        st.row_flops += on * self._flops(q, k, n_head, copies)
        return flops

    def forward_columns(self, columns: Tensor, attn, head: Optional[slice]) -> Tensor:
        """Logits (B, |head|, V) of one forward over the cached answer ``columns`` (B, W) of each row
        (a gathered window: each reads every other column from the cache; its K/V are written back);
        counts 1 NFE, W positions per row and the window's FLOPs over all cached keys."""
        B, W = columns.shape
        keys = self.cache.length
        n_head = 0 if head is None else len(range(W)[head])
        flops = self._count(self.prompt_len, W, keys, n_head, 1)  # answer columns: all real, W per row
        with self.timer(W, (keys, n_head), flops):
            return self.model(self.x.gather(1, columns), positions=self.positions.gather(1, columns), attn_mask=attn,
                              backend=self.backend, cache=self.cache, start=columns,
                              logits_slice=slice(0, 0) if head is None else head)

    def new_cache(self) -> KVCache:
        self.cache = KVCache.for_model(self.model, self.x.shape[0], self.x.shape[1])
        return self.cache

    def forward(self, start: int, stop: int, attn, head: Optional[slice], *, commit: bool = False,
                inputs: Optional[Tensor] = None, positions: Optional[Tensor] = None,
                copies: int = 1, row_span: Optional[tuple[Tensor, Tensor]] = None) -> Tensor:
        """Logits (B, |head|, V) of one forward over columns ``[start, stop)`` (reading the cache
        for the others); counts 1 NFE, ``stop - start`` positions and the window's FLOPs
        (:func:`dlm.stats.forward_flops`; ``copies`` = 2 for CFG's doubled batch).
        ``head`` is window-relative; None computes no LM head. With a cache the window starts at
        ``start``, without one it must start at 0. row_span: (starts, stops), (B,) each: the window
        each row needs (the rest of the batch window is pinned by the cache's ``keep``), for the
        per-row costs."""
        width = stop - start
        keys = width if self.cache is None else self.cache.key_len(start, width)
        n_head = 0 if head is None else len(range(width)[head])
        flops = self._count(start, width, keys, n_head, copies, row_span)
        inp = self.x[:, start:stop] if inputs is None else inputs
        kwargs = {} if self.cache is None else {"cache": self.cache, "start": start, "commit": commit}
        if positions is None and self._rope_tables is not None:  # the run's RoPE tables, computed once
            if self._rope is None:
                self._rope = self._rope_tables(self.positions, self.model.embed.weight.dtype)
            kwargs["rope"] = tuple(t[:, :, start:stop] for t in self._rope)
        with self.timer(width, (keys, n_head), flops):
            return self.model(inp, positions=self.positions[:, start:stop] if positions is None else positions,
                              attn_mask=attn, backend=self.backend,
                              logits_slice=slice(0, 0) if head is None else head, **kwargs)


def _fill_eos(answer: Tensor, eos: int) -> Tensor:
    """(B, G) answer with every column after each row's first EOS set to EOS."""
    seen = (answer == eos).long().cumsum(dim=-1) > 0  # (B, G) True from the first EOS on
    return torch.where(seen, torch.full_like(answer, eos), answer)


def stop_ids(model) -> tuple[int, ...]:
    """EOS and end-of-turn ids of ``model``'s config (whichever are set)."""
    cfg = model.config
    return tuple(i for i in (cfg.eos_token_id, cfg.eot_token_id) if i is not None)


@torch.no_grad()
def denoise(model, batch: PreparedBatch, blocks: Sequence[tuple[int, int]], policy, rule: CommitRule,
            proposal: Proposal = Proposal(), *, stop_at_eos: bool = False,
            generator: Optional[torch.Generator] = None, backend: str = "sdpa",
            callback: Optional[Callback] = None, timed: bool = False) -> GenerateOutput:
    """Decode ``blocks`` (absolute ``(lo, hi)`` columns, left to right) of ``batch.x`` in place.

    policy: a cache policy (``start(run)``, ``logits(run, lo, hi, i) -> (B, hi - lo, V)`` setting
    ``run.refreshed``, ``block_done(run, lo, hi, last)``); rule: a :class:`dlm.commit.CommitRule`.
    Returns :class:`GenerateOutput`; ``stats.extra`` holds ``flops``, ``blocks_run``, ``cache``,
    ``rule``, ``refreshes`` (steps whose forward recomputed every column) and ``hitting_time``
    for rules that record one.

    timed: measure ``stats.forward_seconds`` and the per-kind seconds, synchronising CUDA before
    and after every forward (benchmarks). Untimed (the default) the steps neither synchronise nor
    read the device: the counters stay on it and are read once after the loop; the only host reads
    are a dynamic rule's stop check (one per step) and ``stop_at_eos``'s (one per block). Either
    way ``stats.seconds`` ends with one ``torch.cuda.synchronize`` on CUDA, or it would time the
    launches only. Tokens and counts do not depend on ``timed``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    eos = model.config.eos_token_id
    if stop_at_eos and eos is None:
        raise ValueError("stop_at_eos=True needs model.config.eos_token_id")
    t_start = time.perf_counter()
    x, P, mid = batch.x, batch.prompt_len, batch.mask_id
    B, T = x.shape
    dev = x.device
    stats = SampleStats(extra={"cache": policy.name, "rule": rule.label, "flops": 0, "refreshes": 0})
    run = Run(model, x, batch.positions, batch.attention_mask, P, mid, tuple(blocks), backend, stats,
              ForwardTimer(stats, dev, timed))
    policy.start(run)
    stop_tuple = stop_ids(model)
    stops = torch.tensor(stop_tuple, dtype=torch.long, device=dev)
    exclude = torch.tensor((mid,) + (stop_tuple if proposal.suppress_eos else ()), dtype=torch.long, device=dev)
    commit_step = torch.full((B, T), -1, dtype=torch.long, device=dev)
    hit_time = torch.full((B, T), -1.0, dtype=torch.float64, device=dev)
    first_eos = torch.full((B,), -1, dtype=torch.long, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    refreshes = torch.zeros((), dtype=torch.long, device=dev)  # steps that refreshed every row, read at the end
    step = blocks_run = decoded = 0
    for b, (lo, hi) in enumerate(run.blocks):
        if stop_at_eos:  # finished rows ride along with an all-EOS block
            x[:, lo:hi] = torch.where(done[:, None], torch.full_like(x[:, lo:hi], eos), x[:, lo:hi])
        n_steps = rule.block_steps(hi - max(lo, P))  # None: until the block is clean
        state = rule.begin(x[:, lo:hi] == mid, n_steps, (lo, hi, T))
        i = 0
        while True:
            eligible = x[:, lo:hi] == mid  # (B, L)
            if n_steps is not None:
                if i == n_steps:
                    break
            elif i > 0 and not bool(eligible.any()):  # dynamic step count: one host sync per step
                break
            elif i == hi - lo:  # unreachable: every step commits >= 1 in each unclean row
                raise RuntimeError(f"commit rule {rule.label} made no progress in a block")
            run.active = eligible.any(-1)  # (B,) rows whose block still has [MASK] columns
            stats.row_steps += run.active
            logits = policy.logits(run, lo, hi, i)  # (B, L, V); sets run.refreshed
            refreshed = run.refreshed  # bool, or (B,) bool per row
            stats.row_refreshes += run.active & refreshed
            refreshes += refreshed if isinstance(refreshed, bool) else refreshed.all()
            if rule.selects_first(i):  # the rule picks the columns, the proposal samples only those
                commit, state = rule.select(None, eligible, i, state, generator)  # (B, L) bool
                x0, conf = proposal(logits, commit, generator, exclude, rule.confidence)
            else:
                x0, conf = proposal(logits, eligible, generator, exclude, rule.confidence)  # (B, L) each
                if proposal.eos_last and stops.numel():
                    conf = torch.where(torch.isin(x0, stops), torch.full_like(conf, float("-inf")), conf)
                commit, state = rule.select(conf, eligible, i, state, generator)  # (B, L) bool
            x[:, lo:hi] = torch.where(commit, x0, x[:, lo:hi])
            commit_step[:, lo:hi] = torch.where(commit, step, commit_step[:, lo:hi])
            t = rule.commit_time(state)  # (B,) or None
            if t is not None:
                hit_time[:, lo:hi] = torch.where(commit, t[:, None], hit_time[:, lo:hi])
            if stops.numel():
                hit = (commit & torch.isin(x0, stops)).any(-1)  # (B,)
                first_eos = torch.where(hit & (first_eos < 0), step, first_eos)
            if callback is not None:
                callback(StepView(b, i, step, lo, hi, refreshed, x, logits, commit, run.cache))
            i += 1
            step += 1
        blocks_run, decoded = b + 1, hi - P
        if stop_at_eos:
            done = done | (x[:, max(lo, P):hi] == eos).any(-1)
            if bool(done.all()):  # one host sync per block
                break
        run.active = ~done  # finished rows do not need the clean block's K/V
        policy.block_done(run, lo, hi, last=b == len(run.blocks) - 1)
    if stop_at_eos:
        x[:, P:] = _fill_eos(x[:, P:], eos)
    stats.steps = step
    stats.tokens_committed = decoded  # answer columns decoded, per row
    stats.row_tokens = (commit_step[:, P:] >= 0).sum(-1)  # (B,)
    stats.tokens_until_eos = tokens_until_eos(x[:, P:], eos)
    stats.first_eos_step = first_eos
    stats.extra["blocks_run"] = blocks_run
    stats.extra["refreshes"] = int(refreshes)  # the loop's one read of its counters
    if rule.records_time:
        stats.extra["hitting_time"] = hit_time[:, P:].tolist()
    run.timer.sync()  # the call's queued work, once
    stats.seconds = time.perf_counter() - t_start
    return GenerateOutput(x, stats, commit_step[:, P:])
