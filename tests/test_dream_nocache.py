"""Fast-dLLM's *no-cache* Dream sampler against the cache-free Dream rules, token for token.

Without a cache Fast-dLLM's Dream eval (``use_cache=false``) runs ``DreamGenerationMixin._sample``
of NVlabs/Fast-dLLM ``dream/model/generation_utils.py``, not the block sampler of
``generation_utils_block.py`` (``tests/test_dream.py``): no blocks, no first-column step. Its
``alg="confidence_threshold"`` mode (batch 1, masked count divisible by ``steps``):

* ``number_transfer_tokens = n_masked // steps``, ``left_tokens_last_step = 0``;
* every step proposes at every masked column of the whole sequence (``sample_tokens``: the
  confidence is the probability of the argmax / sampled token), takes the
  ``number_transfer_tokens + left_tokens_last_step`` most confident (``torch.topk`` over the
  whole-sequence confidence row, -inf at committed columns) and commits the first of them and every
  other one whose confidence is not ``< threshold``; the dropped ones are counted into
  ``left_tokens_last_step`` (reset every step);
* at the last step, a drop sets ``number_transfer_tokens = 0`` and ``steps += 1``: it goes on with
  the dropped candidates until a last step drops nothing.

Its other ``alg`` modes are Dream's own sampler: ``k = int(n_masked * (1 - t_{i+1} / t_i))`` (all
at the last step) on ``linspace(1, eps, steps + 1)``, negative entropy for ``alg="entropy"``, the
top ``k`` or ``k`` drawn from ``softmax(confidence / alg_temp)`` over the whole-sequence row.

:func:`ref_nocache` below transcribes that loop in plain PyTorch. It has no factor rule:
:func:`ref_nocache` with ``factor`` is the same loop with eq. 6 deciding among the candidates (the
top ``m`` for the largest ``m`` with ``(m + 1)(1 - c(m)) < f``, at least one), the library's
extension, tested so it stays what it says. The library runs it as ``fastdllm.generate(cache=None,
rules="dream", block_length=gen_length)`` and as the experiments' spec with cache / policy
``"none"`` (:func:`spec_run`); with blocks it runs the loop in each block (:func:`ref_blocks`).
Deviations, as in ``tests/test_dream.py``: [MASK] is
never proposed (its logit is -inf); the network is the library's model (``shift_logits`` is the
reference's ``cat([logits[:, :1], logits[:, :-1]])``; of the reference's pairwise padding mask
the part real columns read, key padding); randomness is the global RNG there, a ``torch.Generator``
seeded the same here (the same stream).
"""

import copy
import itertools

import pytest
import torch
import torch.distributions as dists
import torch.nn.functional as F

import fastdllm
from dlm.attention import key_padding_mask
from tiny import fastdllm_model, fastdllm_prompts, left_pad, unpad

from dlm.spec import Sampler
from dlm.spec import generate as run_sampler
from dream.sampler import generate as dream_generate

BASE = fastdllm_model(n_layers=2, shift=True)
MASK = BASE.config.mask_token_id


def sharpened(model, scale):
    """A copy of ``model`` with its LM head scaled, so that confidences spread over (0, 1)."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


MODELS = {"x3": sharpened(BASE, 3.0), "x1": BASE}


# ------------------------------------------------------------------------------ the transcription
def ref_sample_tokens(logits, temperature, top_p, top_k, neg_entropy=False):
    """``sample_tokens`` of the reference: (N, V) -> confidence (N,), x0 (N,)."""
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        sorted_logits, sorted_idx = torch.sort(logits, descending=True)
        drop = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1) > top_p
        drop[..., 1:] = drop[..., :-1].clone()
        drop[..., 0] = False
        mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, sorted_idx, drop)
        logits = logits.masked_fill(mask, torch.finfo(logits.dtype).min)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]))[0][..., -1, None]
        logits = logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)
    probs = torch.softmax(logits, dim=-1)
    if temperature > 0:
        x0 = dists.Categorical(probs=probs).sample()
        confidence = torch.gather(probs, -1, x0[:, None])[:, 0]
    else:
        confidence, x0 = probs.max(dim=-1)
    if neg_entropy:
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return confidence, x0


def ref_forward(model, x, attention_mask):
    """The reference's ``self(x, attention_mask, tok_idx).logits`` after its shift, on the library's
    model: ``tok_idx`` = cumsum of the padded mask - 1 (padding at 1) when the prompt has padding,
    else 0..T-1."""
    if attention_mask is not None and bool((attention_mask == 0).any()):
        am = F.pad(attention_mask, (0, x.shape[1] - attention_mask.shape[1]), value=1)
        tok_idx = am.long().cumsum(-1) - 1
        tok_idx.masked_fill_(am == 0, 1)
        attn = key_padding_mask(am)
    else:
        tok_idx, attn = torch.arange(x.shape[1]).expand_as(x), None
    logits = model(x, positions=tok_idx, attn_mask=attn)  # the model shifts Dream's logits itself
    logits[..., MASK] = -torch.inf  # deviation: [MASK] is never proposed
    return logits


def ref_nocache(model, input_ids, attention_mask, max_new_tokens, steps, threshold=None, factor=None,
                temperature=0.0, top_p=None, top_k=None, eps=1e-3, alg_temp=None, span=None):
    """Fast-dLLM's ``generation_utils.py`` ``_sample``: ``alg="confidence_threshold"`` when
    ``threshold`` (or, the library's extension, ``factor``) is given, else ``alg="entropy"``.
    ``span`` (lo, hi): only those columns are masked and decoded (a block of the library's loop;
    the reference itself is ``span=None``, every masked column). Returns (x, steps used)."""
    x = F.pad(input_ids, (0, max_new_tokens), value=MASK)
    lo, hi = (0, x.shape[1]) if span is None else span
    outside = torch.ones_like(x, dtype=torch.bool)
    outside[:, lo:hi] = False
    timesteps = torch.linspace(1, eps, steps + 1)
    parallel = threshold is not None or factor is not None
    if parallel:
        mask_index = (x == MASK) & ~outside
        assert mask_index.sum() % steps == 0, "mask_index.sum() must be divisible by steps"
        assert x.shape[0] == 1, "batch size must be 1"
        number_transfer_tokens = int(mask_index.sum()) // steps
        left_tokens_last_step = 0
    i = 0
    while i < steps:
        mask_index = (x == MASK) & ~outside
        logits = ref_forward(model, x, attention_mask)
        mask_logits = logits[mask_index]
        if parallel:
            confidence, x0 = ref_sample_tokens(mask_logits, temperature, top_p, top_k)
            x_ = torch.zeros_like(x) + MASK
            x_[mask_index] = x0.clone()
            full_confidence = torch.full_like(x, -torch.inf, dtype=logits.dtype)
            full_confidence[mask_index] = confidence
            current_transfer_tokens = number_transfer_tokens + left_tokens_last_step
            left_tokens_last_step = 0
            selected_confidence, select_index = torch.topk(full_confidence, current_transfer_tokens)
            transfer_index = torch.zeros_like(x, dtype=torch.bool)
            transfer_index[0, select_index[0]] = True
            if threshold is not None:
                dropped = [k for k in range(1, current_transfer_tokens) if selected_confidence[0, k] < threshold]
            else:  # the library's factor rule among the candidates
                m = max([n for n in range(1, current_transfer_tokens + 1)
                         if (n + 1) * (1 - selected_confidence[0, n - 1]) < factor], default=1)
                dropped = list(range(m, current_transfer_tokens))
            for k in dropped:
                if i < steps - 1:
                    left_tokens_last_step += 1
                    transfer_index[0, select_index[0, k]] = False
                else:
                    number_transfer_tokens = 0
                    steps += 1
                    left_tokens_last_step += 1
                    transfer_index[0, select_index[0, k]] = False
            x[transfer_index] = x_[transfer_index].clone()
        else:
            t, s = timesteps[i], timesteps[i + 1]
            confidence, x0 = ref_sample_tokens(mask_logits, temperature, top_p, top_k, neg_entropy=True)
            num_mask_token = mask_index.sum() / mask_index.shape[0]
            n = int(num_mask_token * (1 - s / t)) if i < steps - 1 else int(num_mask_token)
            full_confidence = torch.full_like(x, -torch.inf, dtype=logits.dtype)
            full_confidence[mask_index] = confidence
            if n > 0:
                if alg_temp is None or alg_temp == 0:
                    _, transfer_index = torch.topk(full_confidence, n)
                else:
                    transfer_index = torch.multinomial(F.softmax(full_confidence / alg_temp, dim=-1), num_samples=n)
                x_ = torch.zeros_like(x) + MASK
                x_[mask_index] = x0.clone()
                rows = torch.arange(x.shape[0]).unsqueeze(1).expand_as(transfer_index)
                x[rows, transfer_index] = x_[rows, transfer_index]
        i += 1
    return x, steps


def ref_blocks(model, input_ids, G, L, S, **kw):
    """The transcription run block by block, left to right (the library's loop with blocks)."""
    P, x = input_ids.shape[1], input_ids
    for b in range(G // L):
        lo = P + b * L
        x, _ = ref_nocache(model, x, None, 0 if b else G, S * L // G, span=(lo, lo + L), **kw)
    return x


def gen(seed):
    return torch.Generator().manual_seed(seed)


def spec_run(model, ids, am, G, L, S, generator=None, **kw):
    """The experiments' spelling of the cache-free Dream path: cache / policy ``"none"`` (a string),
    Dream's rules, ``L`` None for one block."""
    rule = "threshold" if "threshold" in kw else "factor" if "factor" in kw else "topk"
    spec = Sampler.of("nocache", policy="none", rule=rule, family="dream", gen_length=G, block_length=L, steps=S, **kw)
    return run_sampler(model, ids, am, spec, generator=generator)


def library(model, ids, am, G, S, via, seed=None, **kw):
    """The cache-free Dream path, one block: ``fastdllm.generate(cache=None)`` or the spec with
    cache ``"none"``."""
    g = None if seed is None else gen(seed)
    if via == "generate":
        return fastdllm.generate(model, ids, am, gen_length=G, block_length=G, steps=S, cache=None, rules="dream",
                                 generator=g, **kw)
    return spec_run(model, ids, am, G, None, S, g, **kw)


VIAS = ("generate", "spec")
# (gen_length, steps): quotas 1, 2, 4, 6, 12 per step
LAYOUTS = [(12, 12), (12, 6), (12, 3), (12, 2), (12, 1), (16, 4)]
THRESHOLDS = (0.05, 0.3, 0.5, 0.9, 1.0)


# ------------------------------------------------------------------------------ threshold, batch 1
@pytest.mark.parametrize("via", VIAS)
@pytest.mark.parametrize("model", list(MODELS))
def test_threshold_batch_one_matches_reference(via, model):
    m = MODELS[model]
    ids, _ = fastdllm_prompts()
    for row, (G, S), tau in itertools.product(range(3), LAYOUTS, THRESHOLDS):
        prompt = ids[row:row + 1]
        ref, used = ref_nocache(m, prompt.clone(), None, G, S, threshold=tau)
        out = library(m, prompt, None, G, S, via, threshold=tau)
        assert torch.equal(out.sequences, ref), (row, G, S, tau)
        assert out.stats.steps == out.stats.nfe == used, (row, G, S, tau)


def test_first_step_commits_several_columns_and_not_only_the_first():
    """The cases above reach the behaviour the block sampler lacks: a first step committing several
    columns, and first steps committing other columns than the first one."""
    ids, _ = fastdllm_prompts()
    firsts = []
    for row, tau in itertools.product(range(3), (0.05, 0.3)):
        fastdllm.generate(MODELS["x3"], ids[row:row + 1], gen_length=12, block_length=12, steps=3, threshold=tau,
                          rules="dream", callback=lambda v: firsts.append(v.commit.clone()) if v.step == 0 else None)
    assert len(firsts) == 6
    assert sum(int(c.sum()) > 1 for c in firsts) >= 3
    assert all(bool(c[0, 1:].any()) for c in firsts if int(c.sum()) > 1)  # not only the first column
    assert all(int(c.sum()) <= 4 for c in firsts)  # never more than the quota 12 // 3


def test_quota_caps_and_carries():
    """steps = gen_length: one candidate per step, so the threshold never adds a column (the
    reference's q = 1); and a threshold of ~0 commits exactly the quota every step."""
    ids, _ = fastdllm_prompts()
    m = MODELS["x3"]
    for tau in (1e-9, 0.5):
        out = fastdllm.generate(m, ids, gen_length=12, block_length=12, steps=12, threshold=tau, rules="dream")
        assert out.stats.steps == 12 and int(out.commit_step.amax()) == 11
    out = fastdllm.generate(m, ids, gen_length=12, block_length=12, steps=3, threshold=1e-9, rules="dream")
    assert out.stats.steps == 3
    for r in range(3):
        assert torch.bincount(out.commit_step[r], minlength=3).tolist() == [4, 4, 4]
    out = fastdllm.generate(m, ids[:1], gen_length=12, block_length=12, steps=2, threshold=1.0, rules="dream")
    assert out.stats.steps == 12  # nothing reaches 1.0: one column per step, the reference's added steps


# ------------------------------------------------------------------------------ threshold, batches
@pytest.mark.parametrize("via", VIAS)
def test_threshold_padded_batch_rows_match_reference(via):
    """Left-padded batches: each row equals the (batch-1) reference on that row with its padding
    and attention mask, and on the unpadded prompt alone."""
    m = MODELS["x3"]
    ids, am = fastdllm_prompts(padded=True)
    g = torch.Generator().manual_seed(5)
    rows = [torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(2, 9, (5,), generator=g)]
    ids5, am5 = left_pad(rows, m.config.pad_token_id)
    for (i, a), (G, S), tau in itertools.product(((ids, am), (ids5, am5)), LAYOUTS[:4], (0.05, 0.5, 0.9)):
        out = library(m, i, a, G, S, via, threshold=tau)
        for r in range(i.shape[0]):
            padded, _ = ref_nocache(m, i[r:r + 1].clone(), a[r:r + 1], G, S, threshold=tau)
            assert torch.equal(out.sequences[r], padded[0]), (r, G, S, tau)
            p = unpad(i, a, r)
            alone, _ = ref_nocache(m, p.clone(), None, G, S, threshold=tau)
            assert torch.equal(out.sequences[r, -alone.shape[1]:], alone[0]), (r, G, S, tau)


def test_none_and_the_string_none_are_the_same_path():
    m = MODELS["x3"]
    ids, am = fastdllm_prompts(padded=True)
    for kw in (dict(threshold=0.3), dict(factor=1.0), {}):
        a = library(m, ids, am, 12, 3, "generate", **kw)
        b = library(m, ids, am, 12, 3, "spec", **kw)
        assert torch.equal(a.sequences, b.sequences) and torch.equal(a.commit_step, b.commit_step)
        assert a.stats.extra["rule"] == b.stats.extra["rule"] and "first_column" not in a.stats.extra["rule"]


# ------------------------------------------------------------------------------ sampling options
@pytest.mark.parametrize("via", VIAS)
def test_threshold_sampled_matches_reference(via):
    m = MODELS["x3"]
    ids, _ = fastdllm_prompts()
    cases = [dict(temperature=1.0), dict(temperature=0.7, top_k=5), dict(temperature=0.8, top_p=0.9, top_k=20),
             dict(temperature=0.0, top_p=0.5)]
    for kw, tau, (G, S), seed in itertools.product(cases, (0.05, 0.5, 0.9), ((12, 3), (12, 2), (16, 4)), (11, 12)):
        torch.manual_seed(seed)
        ref, used = ref_nocache(m, ids[:1].clone(), None, G, S, threshold=tau, **kw)
        out = library(m, ids[:1], None, G, S, via, seed=seed, threshold=tau, **kw)
        assert torch.equal(out.sequences, ref), (kw, tau, G, S, seed)
        assert out.stats.steps == used


# ------------------------------------------------------------------------------ factor
@pytest.mark.parametrize("via", VIAS)
def test_factor_is_the_reference_loop_with_eq6_among_the_candidates(via):
    m = MODELS["x3"]
    ids, am = fastdllm_prompts(padded=True)
    for row, (G, S), f in itertools.product(range(3), LAYOUTS, (0.5, 1.0, 2.0, 4.0)):
        p = unpad(ids, am, row)
        ref, used = ref_nocache(m, p.clone(), None, G, S, factor=f)
        out = library(m, p, None, G, S, via, factor=f)
        assert torch.equal(out.sequences, ref), (row, G, S, f)
        assert out.stats.steps == used
    out = library(m, ids, am, 12, 2, via, factor=4.0)
    for r in range(3):
        ref, _ = ref_nocache(m, ids[r:r + 1].clone(), am[r:r + 1], 12, 2, factor=4.0)
        assert torch.equal(out.sequences[r], ref[0]), r
    assert out.stats.steps < 12


# ------------------------------------------------------------------------------ scheduled mode
@pytest.mark.parametrize("via", VIAS)
def test_scheduled_mode_is_dreams_entropy_sampler(via):
    """rule ``topk`` without a cache: the reference's ``alg="entropy"`` (Dream's own sampler, no
    first-column step), batched as the reference batches it."""
    m = MODELS["x3"]
    ids, am = fastdllm_prompts(padded=True)
    for (G, S), kw, a in itertools.product(((12, 12), (12, 5), (16, 4)), (
            {}, dict(temperature=1.0), dict(temperature=0.8, top_p=0.9, top_k=20), dict(temperature=1.0, alg_temp=0.5),
            dict(eps=0.05)), (None, am)):
        torch.manual_seed(3)
        ref, _ = ref_nocache(m, ids.clone(), a, G, S, **kw)
        out = library(m, ids, a, G, S, via, seed=3, **kw)
        assert torch.equal(out.sequences, ref), (G, S, kw, a is None)
        assert out.stats.nfe == S
        own = dream_generate(m, ids, a, max_new_tokens=G, steps=S, alg="entropy", generator=gen(3), **kw)
        assert torch.equal(own.sequences, ref)


# ------------------------------------------------------------------------------ blocks
@pytest.mark.parametrize("kw", [dict(threshold=0.05), dict(threshold=0.9), dict(factor=2.0), {}])
def test_blocks_run_the_reference_loop_per_block(kw):
    """The reference has no blocks; with ``block_length < gen_length`` the library runs its loop in
    each block, left to right (quota = block masked columns // steps per block)."""
    m = MODELS["x3"]
    ids, _ = fastdllm_prompts()
    for row, (G, L, S) in itertools.product(range(3), ((12, 4, 6), (12, 6, 4), (16, 8, 16))):
        p = ids[row:row + 1]
        ref = ref_blocks(m, p.clone(), G, L, S, **kw)
        out = fastdllm.generate(m, p, gen_length=G, block_length=L, steps=S, rules="dream", **kw)
        assert torch.equal(out.sequences, ref), (row, G, L, S)
        assert torch.equal(spec_run(m, p, None, G, L, S, **kw).sequences, ref)


def test_cached_paths_keep_the_block_samplers_first_column():
    """Only the cache-free path changed: prefix / dual still open each block with its first column."""
    ids, _ = fastdllm_prompts()
    for cache in ("prefix", "dual"):
        out = fastdllm.generate(MODELS["x3"], ids, gen_length=8, block_length=4, cache=cache, threshold=0.3,
                                rules="dream")
        assert out.stats.extra["rule"] == "threshold=0.3,first_column"
