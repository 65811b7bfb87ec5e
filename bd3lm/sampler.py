"""BD3-LM block-diffusion sampling with an exact KV cache (Arriola et al., ICLR 2025, Alg. 2).

Blocks are generated left to right, ``p(x) = prod_b p(x^b | x^{<b})`` (BD3-LM eq. 2). Within a
block, ``steps_per_block`` denoising steps run on the *current noisy block only*: the window of
``L'`` columns reads the K/V of everything before it from a :class:`dlm.cache.KVCache`. The
prompt's K/V are committed once; when a block is clean ONE forward with ``commit=True`` writes its
K/V (the K/V a clean block has under the training mask ``M_BC``, BD3-LM eq. 4). A noisy block's
K/V are never committed, so the cache is *exact*: ``use_cache=False`` (rerun the whole prefix
with a block-causal mask at every step) gives the same logits up to float rounding.

Commit rules per step (pure, vectorized; shared helpers of :mod:`dlm.commit`):

- ``topk``: low-confidence remasking; the linear schedule commits ``num_transfer_tokens`` of the
  block's masked tokens per step, the most confident first (LLaDA Alg. 2 inside a block);
- ``first_hitting``: Zheng et al. (2025) first-hitting sampler: exactly one uniformly chosen
  masked token is unmasked per step, at the hitting time ``t <- t * u^(1/n_masked)``
  (recorded in ``stats.extra["hitting_time"]``; the model has no time input). Takes one step per
  masked token of the block, ignoring ``steps_per_block``;
- ``ancestral``: the MDLM / BD3-LM reverse step ``q(x_s | x_t, x_theta)`` on the grid
  ``t_i = 1 - i / steps``: each masked token is unmasked with probability ``(t - s) / t``.

Tokens are drawn from the SUBS distribution (mask logit -inf), nucleus-filtered (``top_p``),
with float64 Gumbel noise at ``temperature`` (argmax at 0).

Layout. ``align="prompt"`` (default; matches SFT training): the prompt is one clean block and
blocks start right after it. ``align="absolute"`` (matches pre-training on chunks that start
with BOS): blocks sit at real positions that are multiples of ``L'``; the prompt's trailing
partial block is the first noisy block with its prompt tokens fixed. Batches are left padded
(``dlm.sampling.prepare_batch``); with ``absolute`` every row's padding must be a multiple of L'.

Variable length: with ``stop_at_eos`` a row is finished once a finished block contains EOS;
finished rows ride along with all-EOS blocks and everything after a row's first generated EOS
is set to EOS. Generation stops when all rows are finished (one host sync per block) or at the
maximum length.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import torch
from torch import Tensor

from dlm.attention import block_causal_mask, block_ids
from dlm.cache import KVCache
from dlm.commit import num_transfer_tokens, propose, select_topk
from dlm.sampling import GenerateOutput, check_int, prepare_batch
from dlm.stats import ForwardTimer, SampleStats, forward_flops, tokens_until_eos

from .loss import model_config

MODES = ("topk", "first_hitting", "ancestral")
ALIGNS = ("prompt", "absolute")


def top_p_filter(logp: Tensor, top_p: float) -> Tensor:
    """Nucleus filter: keep the smallest most-probable set with mass >= ``top_p``, others -inf.

    logp: (..., V) log-probabilities. The most probable token is always kept."""
    if top_p >= 1.0:
        return logp
    sorted_lp, order = logp.sort(dim=-1, descending=True)  # (..., V)
    probs = sorted_lp.exp()
    drop = (probs.cumsum(-1) - probs) >= top_p  # mass strictly before this token already >= p
    sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
    return torch.empty_like(logp).scatter_(-1, order, sorted_lp)


def token_log_probs(logits: Tensor, mask_id: int, top_p: float) -> Tensor:
    """SUBS log-probabilities in float64 (mask token impossible), nucleus-filtered. (B, W, V)."""
    lp = logits.to(torch.float64).index_fill(-1, torch.tensor([mask_id], device=logits.device), float("-inf"))
    return top_p_filter(torch.log_softmax(lp, dim=-1), top_p)


def _check_args(block_size, steps_per_block, temperature, top_p, mode, align, stop_at_eos, use_cache) -> int:
    check_int("block_size", block_size)
    steps = block_size if steps_per_block is None else steps_per_block
    check_int("steps_per_block", steps)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if align not in ALIGNS:
        raise ValueError(f"align must be one of {ALIGNS}, got {align!r}")
    for name, flag in (("stop_at_eos", stop_at_eos), ("use_cache", use_cache)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    return steps


def _gen_length(prompt_len: int, max_length: Optional[int], gen_length: Optional[int], max_seq_len: int) -> int:
    if (max_length is None) == (gen_length is None):
        raise ValueError("give exactly one of max_length (prompt + generation) or gen_length")
    if max_length is not None:
        check_int("max_length", max_length)
        gen = max_length - prompt_len
        if gen < 1:
            raise ValueError(f"max_length={max_length} leaves no room after the prompt of {prompt_len}")
    else:
        check_int("gen_length", gen_length)
        gen = gen_length
    if prompt_len + gen > max_seq_len:
        raise ValueError(f"max length {prompt_len + gen} (prompt {prompt_len} + generation {gen}) exceeds "
                         f"the model's max_seq_len={max_seq_len}")
    return gen


def _context_end(align: str, P: int, G: int, L: int, attention_mask: Optional[Tensor]) -> int:
    """Columns ``[0, ctx_end)`` committed as context before the first noisy block."""
    if align == "prompt":
        if G % L:
            raise ValueError(f"block_size={L} must divide the generation length {G}")
        return P
    r = P % L
    if (r + G) % L:
        raise ValueError(f"align='absolute': block_size={L} must divide the total length {P + G}")
    if attention_mask is not None:
        pad = attention_mask.shape[1] - attention_mask.long().sum(-1)
        if bool((pad % L != 0).any()):
            raise ValueError("align='absolute' needs every row's left padding to be a multiple of block_size")
    return P - r


@torch.no_grad()
def sample(
    model,
    input_ids: Tensor,
    attention_mask: Optional[Tensor] = None,
    *,
    block_size: int,
    max_length: Optional[int] = None,
    gen_length: Optional[int] = None,
    steps_per_block: Optional[int] = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    mode: str = "topk",
    stop_at_eos: bool = True,
    generator: Optional[torch.Generator] = None,
    use_cache: bool = True,
    align: str = "prompt",
    backend: str = "sdpa",
    mask_id: Optional[int] = None,
    callback: Optional[Callable[[int, int, Tensor], None]] = None,
) -> GenerateOutput:
    """Generate after the (left-padded) prompts ``input_ids`` (B, P); see the module docstring.

    max_length: prompt + generation columns, or gen_length: generated columns (one of them).
    steps_per_block: denoising steps per block (default ``block_size``).
    callback(block, step, logits): sees every denoising forward's raw block logits (B, L', V).
    Returns :class:`dlm.sampling.GenerateOutput` (sequences (B, P + G), commit_step (B, G)).
    """
    steps = _check_args(block_size, steps_per_block, temperature, top_p, mode, align, stop_at_eos, use_cache)
    cfg = model_config(model)
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise TypeError("input_ids must be an integer torch.Tensor of shape (B, P)")
    G = _gen_length(input_ids.shape[1], max_length, gen_length, cfg.max_seq_len)
    batch = prepare_batch(model, input_ids, attention_mask, G, mask_id)
    L, P, mid = block_size, batch.prompt_len, batch.mask_id
    ctx_end = _context_end(align, P, G, L, attention_mask)
    t_start = time.perf_counter()
    x, positions, am = batch.x, batch.positions, batch.attention_mask
    B, T = x.shape
    dev = x.device
    ids = block_ids(T, L, P if align == "prompt" else 0, device=dev)  # (T,)
    cols = torch.arange(T, device=dev)

    def attn(lo: int, hi: int, keys: int) -> Tensor:  # (1|B, 1, hi - lo, keys) bool
        m = block_causal_mask(ids[lo:hi], ids[:keys], None if am is None else am[:, :keys])
        return m if am is None else m | (cols[lo:hi, None] == cols[None, :keys])

    stats = SampleStats()
    timer = ForwardTimer(stats, dev)
    n_params = cfg.num_params(include_embeddings=False)
    flops = 0

    def run(lo: int, hi: int, commit: bool, head: bool) -> Optional[Tensor]:
        nonlocal flops
        if use_cache:
            width, inp_lo = hi - lo, lo
        else:
            width, inp_lo = hi, 0
        head_slice = slice(lo - inp_lo, hi - inp_lo) if head else slice(0, 0)
        flops += forward_flops(n_params, cfg.n_layers, cfg.d_model, width, hi, cfg.vocab_size,
                               hi - lo if head else 0)
        with timer(width):
            return model(x[:, inp_lo:hi], positions=positions[:, inp_lo:hi], cache=cache,
                         attn_mask=attn(inp_lo, hi, hi), start=inp_lo if use_cache else 0,
                         commit=commit, backend=backend, logits_slice=head_slice)

    cache = KVCache.for_model(model, B, T) if use_cache else None
    if use_cache and ctx_end > 0:
        run(0, ctx_end, commit=True, head=False)  # the prompt's K/V, once
    eos = cfg.eos_token_id
    stop = stop_at_eos and eos is not None
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    commit_step = torch.full((B, T), -1, dtype=torch.long, device=dev)
    hit_time = torch.full((B, T), -1.0, dtype=torch.float64, device=dev)
    first_eos = torch.full((B,), -1, dtype=torch.long, device=dev)
    num_blocks = (T - ctx_end) // L
    step = 0
    for blk in range(num_blocks):
        lo, hi = ctx_end + blk * L, ctx_end + (blk + 1) * L
        if stop:
            x[:, lo:hi] = torch.where(done[:, None], torch.full_like(x[:, lo:hi], eos), x[:, lo:hi])
        n_steps = steps if mode != "first_hitting" else hi - max(lo, P)  # masked columns of the block
        k_sched = num_transfer_tokens((x[:, lo:hi] == mid).sum(-1), n_steps) if mode == "topk" else None
        t_hit = torch.ones(B, dtype=torch.float64, device=dev)
        for i in range(n_steps):
            masked = x[:, lo:hi] == mid  # (B, L)
            logits = run(lo, hi, commit=False, head=True)  # (B, L, V)
            if callback is not None:
                callback(blk, i, logits)
            lp = token_log_probs(logits, mid, top_p)  # (B, L, V)
            if mode == "topk":
                x0, conf = propose(lp, temperature, "low_confidence", generator)
                commit = select_topk(conf, masked, k_sched[:, i])
            elif mode == "first_hitting":
                x0, conf = propose(lp, temperature, "random", generator)  # conf ~ U(0,1): uniform position
                commit = select_topk(conf, masked, torch.ones(B, dtype=torch.long, device=dev))
                n_masked = masked.sum(-1)
                u = torch.rand(B, generator=generator, device=dev, dtype=torch.float64)
                t_hit = torch.where(n_masked > 0, t_hit * u ** (1.0 / n_masked.clamp_min(1)), t_hit)
                hit_time[:, lo:hi] = torch.where(commit, t_hit[:, None], hit_time[:, lo:hi])
            else:  # ancestral: unmask w.p. (t - s) / t = 1 / (n_steps - i)
                x0, _ = propose(lp, temperature, "low_confidence", generator)
                u = torch.rand(masked.shape, generator=generator, device=dev, dtype=torch.float64)
                commit = masked & (u < 1.0 / (n_steps - i))
            x[:, lo:hi] = torch.where(commit, x0, x[:, lo:hi])
            commit_step[:, lo:hi] = torch.where(commit, step, commit_step[:, lo:hi])
            if eos is not None:
                hit = (commit & (x0 == eos)).any(-1)
                first_eos = torch.where(hit & (first_eos < 0), step, first_eos)
            step += 1
        if stop:
            done = done | (x[:, max(lo, P):hi] == eos).any(-1)
            if bool(done.all()):  # one host sync per block
                break
        if use_cache and blk < num_blocks - 1:
            run(lo, hi, commit=True, head=False)  # the clean block's K/V, once
    if stop:
        gen = x[:, P:]
        x[:, P:] = torch.where((gen == eos).cumsum(-1) > 0, torch.full_like(gen, eos), gen)
    stats.steps = step
    stats.tokens_committed = G
    stats.tokens_until_eos = tokens_until_eos(x[:, P:], eos)
    stats.first_eos_step = first_eos
    stats.seconds = time.perf_counter() - t_start
    stats.extra.update({"flops": flops, "blocks": blk + 1 if num_blocks else 0, "mode": mode,
                        "use_cache": use_cache, "block_size": L})
    if mode == "first_hitting":
        stats.extra["hitting_time"] = hit_time[:, P:].tolist()
    return GenerateOutput(x, stats, commit_step[:, P:])
