"""Fast-dLLM sampler (Wu et al. 2025): cache policies, parallel commit rules, batching, EOS stop.

Tiny random float64 models; exactness is tested where it holds mathematically:
- ``refresh_every=1`` recomputes everything every step, so prefix/dual equal the uncached run;
- with ONE layer, cached K/V are exact (layer-0 K/V depend only on a column's own token and
  position; the prefix is final and the suffix is all [MASK] while a block is decoded), so prefix
  and dual caches equal the uncached run without any refresh (also tests the Dream shift trick).
"""

from __future__ import annotations

import itertools

import pytest
import torch

import fastdllm
from fastdllm.rules import select_factor, select_threshold
from dlm.model import ModelConfig, Transformer
from dlm.llada import generate as baseline_generate
from dlm.stats import forward_flops
from fastdllm.policies import window
from tiny import fastdllm_config
from tiny import fastdllm_model as tiny_model  # memoized; (n_layers, shift, seed, eos_bias)
from tiny import fastdllm_prompts as prompts  # (3, 6) ids and, with padded=True, the attention mask

_CFG = fastdllm_config()
MASK, EOS = _CFG.mask_token_id, _CFG.eos_token_id
RULES = ({}, {"threshold": 0.3}, {"factor": 2.0})
CACHES = (None, "prefix", "dual")


def same(a, b) -> None:
    assert torch.equal(a.sequences, b.sequences)
    assert torch.equal(a.commit_step, b.commit_step)


LAYOUTS = [  # (gen_length, block_length, steps)
    (8, 4, 8),
    (12, 4, 6),
    (8, 8, 4),
    (12, 3, 12),
]


# ------------------------------------------------------------------------------ exactness


@pytest.mark.parametrize("layout", LAYOUTS)
def test_uncached_topk_equals_baseline(layout):
    G, L, S = layout
    ids, am = prompts(padded=True)
    for kw in ({}, {"temperature": 1.0, "remasking": "random"}):
        ref = baseline_generate(tiny_model(), ids, am, gen_length=G, block_length=L, steps=S,
                                generator=torch.Generator().manual_seed(5), **kw)
        out = fastdllm.generate(tiny_model(), ids, am, gen_length=G, block_length=L, steps=S,
                                generator=torch.Generator().manual_seed(5), **kw)
        same(out, ref)
        assert out.stats.nfe == ref.stats.nfe == S
        assert out.stats.positions_computed == ref.stats.positions_computed


SHIFT_RULES = [(False, "auto"), (True, "llada"), (True, "dream")]


def uncached_block_sampler(model, ids, am, cache: str, rules: str, **kw):
    """The block sampler ``cache`` must equal, recomputing everything at every step. Under Fast-dLLM's
    Dream rules no cache is Fast-dLLM's *other* sampler (``generation_utils.py``: no blocks, no
    first-column step; tests/test_dream_nocache.py), so there the reference is the other cache
    refreshed at every step (as tests/test_contract.py); otherwise the run without a cache."""
    if rules == "dream" or (rules == "auto" and model.config.shift_logits):
        return fastdllm.generate(model, ids, am, cache="prefix" if cache == "dual" else "dual", refresh_every=1,
                                 rules=rules, **kw)
    return fastdllm.generate(model, ids, am, rules=rules, **kw)


@pytest.mark.parametrize("layout", LAYOUTS[:3])
@pytest.mark.parametrize("shift,rules", SHIFT_RULES)
def test_refresh_every_one_equals_uncached(layout, shift, rules):
    G, L, S = layout
    model = tiny_model(shift=shift)
    ids, am = prompts(padded=True)
    for rule in RULES:
        for cache in ("prefix", "dual"):
            ref = uncached_block_sampler(model, ids, am, cache, rules, gen_length=G, block_length=L, steps=S, **rule)
            out = fastdllm.generate(model, ids, am, gen_length=G, block_length=L, steps=S,
                                    cache=cache, refresh_every=1, rules=rules, **rule)
            same(out, ref)


@pytest.mark.parametrize("shift,rules", SHIFT_RULES)
def test_one_layer_caches_are_exact(shift, rules):
    model = tiny_model(n_layers=1, shift=shift)
    ids, am = prompts(padded=True)
    for (G, L, S), rule in itertools.product(LAYOUTS[:2], RULES):
        for cache in ("prefix", "dual"):
            ref = uncached_block_sampler(model, ids, am, cache, rules, gen_length=G, block_length=L, steps=S, **rule)
            out = fastdllm.generate(model, ids, am, gen_length=G, block_length=L, steps=S,
                                    cache=cache, rules=rules, **rule)
            same(out, ref)
            assert out.stats.positions_computed < ref.stats.positions_computed


def test_dream_window_starts_one_column_early():
    assert window("dual", 10, 14, 20, shift_logits=False) == fastdllm.Window(10, 14, slice(0, 4))
    assert window("dual", 10, 14, 20, shift_logits=True) == fastdllm.Window(9, 14, slice(1, 5))
    assert window("prefix", 10, 14, 20, shift_logits=True) == fastdllm.Window(9, 20, slice(1, 5))


def test_multi_layer_caches_are_approximate_but_complete():
    ids, am = prompts(padded=True)
    ref = fastdllm.generate(tiny_model(), ids, am, gen_length=12, block_length=4)
    for cache, rule in itertools.product(("prefix", "dual"), RULES):
        out = fastdllm.generate(tiny_model(), ids, am, gen_length=12, block_length=4, cache=cache, **rule)
        assert not (out.sequences[:, 6:] == MASK).any()
        assert (out.commit_step >= 0).all()
        # blocks are decoded in order: every commit of block b precedes those of block b + 1
        cs = out.commit_step.view(3, 3, 4)
        assert (cs[:, :-1].amax(-1) < cs[:, 1:].amin(-1)).all()
    assert ref.stats.nfe == 12


def test_threshold_one_equals_one_token_per_step_baseline():
    ids, am = prompts(padded=True)
    G, L = 12, 4
    ref = baseline_generate(tiny_model(), ids, am, gen_length=G, block_length=L, steps=G)
    assert not (ref.sequences == MASK).any()  # precondition: baseline never committed [MASK]
    out = fastdllm.generate(tiny_model(), ids, am, gen_length=G, block_length=L, threshold=1.0)
    same(out, ref)
    assert out.stats.steps == G and out.stats.tokens_per_step == 1.0


# ------------------------------------------------------------------------------ rules (dlm.commit)


def _order(conf, elig):
    idx = [j for j in range(len(conf)) if elig[j]]
    return sorted(idx, key=lambda j: (-conf[j], j))  # most confident first, ties: lower index


def brute_threshold(conf, elig, tau):
    order = _order(conf, elig)
    return set(order[:1]) | {j for j in order if conf[j] >= tau}


def brute_factor(conf, elig, f):
    order = _order(conf, elig)
    best = 1
    for n in range(1, len(order) + 1):
        if (n + 1) * (1 - conf[order[n - 1]]) < f:
            best = max(best, n)
    return set(order[:best])


def rule_cases():
    g = torch.Generator().manual_seed(3)
    levels = torch.tensor([0.125, 0.25, 0.5, 0.75, 0.875, 0.9375, 1.0], dtype=torch.float64)
    conf = levels[torch.randint(0, len(levels), (8, 10), generator=g)]  # many exact ties
    conf[5] = torch.rand(10, generator=g, dtype=torch.float64)
    elig = torch.rand(8, 10, generator=g) < 0.6
    elig[0] = True  # all masked
    elig[1] = False
    elig[1, 7] = True  # one masked
    elig[2] = False  # none masked
    conf[3] = 0.5  # all tied
    return conf, elig


@pytest.mark.parametrize("tau", [0.1, 0.5, 0.75, 0.9, 1.0])
def test_select_threshold_matches_brute_force(tau):
    conf, elig = rule_cases()
    got = select_threshold(conf, elig, tau)
    for r in range(conf.shape[0]):
        want = brute_threshold(conf[r].tolist(), elig[r].tolist(), tau)
        assert set(torch.nonzero(got[r]).flatten().tolist()) == want, r


@pytest.mark.parametrize("f", [0.1, 0.5, 1.0, 2.0, 5.0])
def test_select_factor_matches_brute_force(f):
    conf, elig = rule_cases()
    got = select_factor(conf, elig, f)
    for r in range(conf.shape[0]):
        want = brute_factor(conf[r].tolist(), elig[r].tolist(), f)
        assert set(torch.nonzero(got[r]).flatten().tolist()) == want, r


# ------------------------------------------------------------------------------ batching


@pytest.mark.parametrize("cache", CACHES)
def test_batch_invariance_with_left_padding(cache):
    ids, am = prompts(padded=True)
    for model, rule in itertools.product((tiny_model(), tiny_model(shift=True)), RULES):
        kw = dict(gen_length=8, block_length=4, cache=cache, **rule)
        out = fastdllm.generate(model, ids, am, **kw)
        for r in range(3):
            real = ids[r][am[r].bool()][None]  # (1, P_r) unpadded
            alone = fastdllm.generate(model, real, **kw)
            assert torch.equal(out.sequences[r, 6:], alone.sequences[0, real.shape[1]:]), (r, rule)
            if not rule:  # fixed schedule: same step numbers too
                assert torch.equal(out.commit_step[r], alone.commit_step[0])


# ------------------------------------------------------------------------------ EOS stop


def test_stop_at_eos_equals_truncated_full_run():
    model = tiny_model(eos_bias=7.0)
    ids, am = prompts(padded=True)
    skipped = 0
    for cache, rule in itertools.product(CACHES, RULES):
        kw = dict(gen_length=24, block_length=4, cache=cache, **rule)
        full = fastdllm.generate(model, ids, am, **kw)
        stop = fastdllm.generate(model, ids, am, stop_at_eos=True, **kw)
        ans = full.sequences[:, 6:]
        after = (ans == EOS).long().cumsum(-1) > 0
        want = torch.where(after, torch.full_like(ans, EOS), ans)
        assert torch.equal(stop.sequences[:, 6:], want), (cache, rule)
        assert torch.equal(stop.sequences[:, :6], ids)
        assert stop.stats.nfe <= full.stats.nfe
        assert torch.equal(stop.stats.tokens_until_eos, full.stats.tokens_until_eos)
        skipped += stop.stats.extra["blocks_run"] < 6
    assert skipped >= 6  # the early stop really happened in several configurations


# ------------------------------------------------------------------------------ cost accounting


def _flops(model, q, k, head):
    c = model.config
    return forward_flops(c.num_params(include_embeddings=False), c.n_layers, c.d_model, q, k,
                         c.vocab_size, head)


@pytest.mark.parametrize("shift,rules", [(False, "auto"), (True, "llada"), (True, "dream")])
def test_nfe_and_positions_for_known_layout(shift, rules):
    # P = 6, G = 8, L = 4 -> T = 14, two blocks at columns [6, 10) and [10, 14)
    model = tiny_model(shift=shift)
    ids, _ = prompts()
    e = 1 if rules == "llada" and shift else 0  # Dream model, LLaDA rules: windows start one column early
    cases = {  # (cache, steps, refresh_every) -> list of (window width) per forward
        (None, 8, None): [14] * 8,
        ("prefix", 4, None): [14, 8 + e, 14, 4 + e],
        ("dual", 4, None): [14, 4 + e, 14, 4 + e],
        ("prefix", 8, 2): [14, 8 + e, 14, 8 + e, 14, 4 + e, 14, 4 + e],
        ("dual", 8, 3): [14, 4 + e, 4 + e, 14] * 2,
    }
    for (cache, steps, refresh), widths in cases.items():
        out = fastdllm.generate(model, ids, gen_length=8, block_length=4, steps=steps, cache=cache,
                                refresh_every=refresh, rules=rules)
        s = out.stats
        assert (s.nfe, s.positions_computed, s.steps) == (len(widths), sum(widths), steps), cache
        assert s.extra["flops"] == sum(_flops(model, w, 14, 4) for w in widths)
        assert s.tokens_committed == 8 and s.tokens_per_step == 8 / steps
        assert s.forward_seconds <= s.seconds and s.first_eos_step.shape == (3,)


def test_parallel_rules_count_dynamic_steps():
    ids, _ = prompts()
    out = fastdllm.generate(tiny_model(), ids, gen_length=12, block_length=4, cache="dual", threshold=0.3)
    s = out.stats
    assert s.nfe == s.steps == int(out.commit_step.amax()) + 1
    assert s.steps < 12 and s.tokens_per_step > 1  # some steps commit several tokens
    # T = 6 + 12: each forward is a block-opening full one (18 columns) or a dual window (4)
    n_full = 3
    assert s.positions_computed == n_full * 18 + (s.nfe - n_full) * 4


# ------------------------------------------------------------------------------ bad input


BAD = [
    ({"threshold": 0.0}, ValueError, "threshold"),
    ({"threshold": 1.5}, ValueError, "threshold"),
    ({"threshold": "0.9"}, TypeError, "threshold"),
    ({"factor": 0.0}, ValueError, "factor"),
    ({"factor": -1.0}, ValueError, "factor"),
    ({"threshold": 0.9, "factor": 1.0}, ValueError, "threshold"),
    ({"cache": "full"}, ValueError, "cache"),
    ({"cache": "dual", "refresh_every": 0}, ValueError, "refresh_every"),
    ({"cache": "dual", "refresh_every": 1.5}, TypeError, "refresh_every"),
    ({"refresh_every": 2}, ValueError, "refresh_every"),
    ({"gen_length": 10, "block_length": 4}, ValueError, "gen_length"),
    ({"gen_length": 8, "block_length": 4, "steps": 3}, ValueError, "steps"),
    ({"block_length": 0}, ValueError, "block_length"),
    ({"temperature": -1.0}, ValueError, "temperature"),
    ({"remasking": "lowest"}, ValueError, "remasking"),
    ({"backend": "cudnn"}, ValueError, "backend"),
    ({"gen_length": 64}, ValueError, "max_seq_len"),
]


@pytest.mark.parametrize("kwargs,exc,word", BAD)
def test_bad_input_raises_before_any_forward(kwargs, exc, word):
    model = tiny_model()
    ids, _ = prompts()
    kw = {"gen_length": 8, "block_length": 4, **kwargs}
    handle = model.register_forward_pre_hook(lambda *a: pytest.fail("forward ran on bad input"))
    try:
        with pytest.raises(exc, match=word):
            fastdllm.generate(model, ids, **kw)
    finally:
        handle.remove()


def test_bad_prompts_raise_before_any_forward():
    model = tiny_model()
    ids, am = prompts(padded=True)
    handle = model.register_forward_pre_hook(lambda *a: pytest.fail("forward ran on bad input"))
    kw = {"gen_length": 8, "block_length": 4, "cache": "dual"}
    try:
        with pytest.raises(ValueError, match="mask"):
            fastdllm.generate(model, torch.full((1, 3), MASK), **kw)
        with pytest.raises(TypeError, match="input_ids"):
            fastdllm.generate(model, ids.double(), **kw)
        with pytest.raises(ValueError, match="attention_mask"):
            fastdllm.generate(model, ids, am[:, 1:], **kw)
        with pytest.raises(ValueError, match="attention_mask"):
            fastdllm.generate(model, ids, torch.zeros_like(am), **kw)
    finally:
        handle.remove()


def test_stop_at_eos_needs_an_eos_id():
    cfg = ModelConfig(vocab_size=16, d_model=32, n_layers=1, n_heads=4, n_kv_heads=4, mlp_hidden=32,
                      mask_token_id=15)
    with pytest.raises(ValueError, match="eos_token_id"):
        fastdllm.generate(Transformer(cfg), torch.ones(1, 2, dtype=torch.long), gen_length=4,
                          block_length=4, stop_at_eos=True)
