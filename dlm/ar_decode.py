"""Lean greedy autoregressive decoding: the forwards of the ``ar`` cache policy (:mod:`dlm.ar`)
without the diffusion loop around them.

One prefill over ``[0, P + shift)`` (the policy's first step, the same call), then one column per
step: column ``j - 1`` runs causally over the exact :class:`~dlm.cache.KVCache` and column ``j``
takes the argmax of its logit with [MASK] excluded (the ``llada`` proposal at temperature 0, first
maximum on ties). A step is the model's body, the LM head, one in-place ``-inf`` and an argmax: no
[MASK] bookkeeping, no rule, no per-step allocation beyond the forward's own, the RoPE tables and
the key mask computed once and sliced. Logits are the policy's bit for bit, so the tokens are.

``stop_at_eos``: every ``check_every`` steps one host read asks whether every row holds an EOS;
the loop ends when all do. A finished row keeps decoding until then (its later tokens never reach
another row) and everything after its first EOS is EOS in the output, as :func:`dlm.sample.denoise`
gives it. Without it the loop runs ``gen_length`` steps with no host read.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import Tensor

from .ar import ar_mask
from .attention import BACKENDS
from .cache import KVCache
from .commit import check_int
from .sample import GenerateOutput, _fill_eos
from .stats import SampleStats, forward_flops, tokens_until_eos
from .validate import prepare_batch


@torch.no_grad()
def ar_decode(model, input_ids: Tensor, attention_mask: Tensor | None, gen_length: int, *,
              stop_at_eos: bool = False, check_every: int = 16, backend: str = "sdpa") -> GenerateOutput:
    """Greedy AR decoding of ``gen_length`` columns after the left-padded prompts ``input_ids``
    (B, P): the tokens of ``generate(..., Sampler.of(policy="ar", block_length=1, ...))``.
    Returns :class:`~dlm.sample.GenerateOutput` (sequences (B, P + G); commit_step: column ``P + i``
    committed at step ``i``, -1 after a row's first EOS under ``stop_at_eos`` and past the last step)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    check_int("check_every", check_every)
    cfg = model.config
    eos = cfg.eos_token_id
    if stop_at_eos and eos is None:
        raise ValueError("stop_at_eos=True needs model.config.eos_token_id")
    batch = prepare_batch(model, input_ids, attention_mask, gen_length, None)  # before any compute
    t_start = time.perf_counter()
    x, P, mid, am = batch.x, batch.prompt_len, batch.mask_id, batch.attention_mask
    B, T = x.shape
    dev = x.device
    cache = KVCache.for_model(model, B, T)
    cos, sin = model.rope_tables(batch.positions, model.embed.weight.dtype)  # (B, 1, T, D) each
    stop = P + int(cfg.shift_logits)  # the prefill: logit P needs column P on a shifted model
    cols = torch.arange(stop, device=dev)
    logits = model(x[:, :stop], positions=batch.positions[:, :stop], cache=cache, attn_mask=ar_mask(cols, stop, am),
                   start=0, commit=True, backend=backend, logits_slice=slice(stop - 1, stop),
                   rope=(cos[:, :, :stop], sin[:, :, :stop]))  # (B, 1, V)
    keys = (torch.ones(1, 1, 1, T, dtype=torch.bool, device=dev) if am is None
            else am.bool()[:, None, None, :].contiguous())  # (1|B, 1, 1, T): a step's query is real
    head = model.head_weight()
    neg = float("-inf")
    j = P
    while True:
        logits[..., mid] = neg
        x[:, j:j + 1] = logits.argmax(-1)  # (B, 1)
        j += 1
        if j == T or (stop_at_eos and (j - P) % check_every == 0 and bool((x[:, P:j] == eos).any(-1).all())):
            break
        c = j - 1  # the column decoded last, over the cache: its hidden state predicts column j
        h = model.body(x[:, c:j], cos[:, :, c:j], sin[:, :, c:j], keys[..., :j], backend, cache, c)
        cache.advance(j)
        logits = F.linear(h, head)  # (B, 1, V)
    if stop_at_eos:
        x[:, P:] = _fill_eos(x[:, P:], eos)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - t_start
    steps = _commit_steps(x, P, j, eos, stop_at_eos)  # (B, G)
    return GenerateOutput(x, _stats(model, x, P, stop, j, steps, seconds), steps)


def _commit_steps(x: Tensor, P: int, end: int, eos: int | None, stop_at_eos: bool) -> Tensor:
    """(B, G): step ``i`` for answer column ``P + i`` decoded (up to the row's first EOS under
    ``stop_at_eos``), else -1."""
    G = x.shape[1] - P
    i = torch.arange(G, device=x.device).expand(x.shape[0], G)
    ran = i < end - P
    if stop_at_eos:
        ran = ran & (i < tokens_until_eos(x[:, P:], eos)[:, None])
    return torch.where(ran, i, torch.full_like(i, -1))


def _stats(model, x: Tensor, P: int, prefill: int, end: int, commit_steps: Tensor, seconds: float) -> SampleStats:
    """The call's costs, counted after the loop: one prefill of ``prefill`` columns, then one
    column per step over ``j`` keys for every column ``j`` in ``(P, end)``."""
    cfg = model.config
    dense = cfg.num_params(include_embeddings=False)
    kinds = {(prefill, prefill, 1): [1, 0.0, forward_flops(dense, cfg.n_layers, cfg.d_model, prefill, prefill,
                                                            cfg.vocab_size, 1)]}
    for j in range(P + 1, end):
        kinds[(1, j, 1)] = [1, 0.0, forward_flops(dense, cfg.n_layers, cfg.d_model, 1, j, cfg.vocab_size, 1)]
    steps = end - P
    answer = x[:, P:]
    stats = SampleStats(nfe=steps, positions_computed=prefill + steps - 1, steps=steps, tokens_committed=steps,
                        seconds=seconds, forward_kinds=kinds,
                        extra={"cache": "ar-lean", "rule": "greedy", "flops": sum(k[2] for k in kinds.values())})
    stats.tokens_until_eos = tokens_until_eos(answer, cfg.eos_token_id)
    stats.row_tokens = commit_steps.ge(0).sum(-1)
    return stats
