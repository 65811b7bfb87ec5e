"""The delayed (dKV-Cache) and adaptive (drift-refreshed dual) cache policies: their limits equal
the baseline / dual cache token for token, one-layer models make them exact, batches equal runs
of one (tokens and per-row costs), bad knobs are rejected before any forward."""

import itertools
import math

import pytest
import torch

from dlm.spec import Sampler, generate
from methods.drift_cache import AdaptiveCache
from methods.dkv_cache import DelayedCache
from tiny import fastdllm_model, fastdllm_prompts, left_pad

RULES = [dict(rule="topk"), dict(rule="threshold", threshold=0.3), dict(rule="factor", factor=2.0)]
FAMILIES = [(False, "auto"), (True, "auto"), (True, "llada")]  # (Dream-style model, family)


def run(policy, model, ids, am, family="auto", **kw):
    s = Sampler.of("s", policy=policy, gen_length=12, block_length=4, family=family, **kw)
    return generate(model, ids, am, s)


def same(a, b):
    assert torch.equal(a.sequences, b.sequences)


def uncached(model, ids, am, family="auto", **r):
    """The block rules recomputing everything every step: policy none, except under Fast-dLLM's Dream
    rules, where no cache is Fast-dLLM's other sampler (tests/test_dream_nocache.py) and the dual
    cache refreshed at every step is the block sampler without reuse."""
    if model.config.shift_logits and family != "llada":
        return run("dual", model, ids, am, family, refresh_every=1, **r)
    return run("none", model, ids, am, family, **r)


@pytest.mark.parametrize("shift,family", FAMILIES)
def test_limits_equal_baseline_and_dual(shift, family):
    model = fastdllm_model(n_layers=2, shift=shift)
    ids, am = fastdllm_prompts(padded=True)
    for r in RULES:
        none = uncached(model, ids, am, family, **r)
        same(run("delayed", model, ids, am, family, refresh_every=1, **r), none)
        same(run("delayed", model, ids, am, family, delay=10**9, **r), none)  # nothing ever settles
        same(run("adaptive", model, ids, am, family, tolerance=0.0, **r), none)  # refresh every step
        dual = run("dual", model, ids, am, family, **r)
        same(run("adaptive", model, ids, am, family, tolerance=math.inf, **r), dual)  # only at block starts


@pytest.mark.parametrize("shift", [False, True])
def test_one_layer_models_make_both_exact(shift):
    """With one layer a column's K/V depend only on its own token, so any cache holding the K/V of
    a column computed with its current token is exact."""
    model = fastdllm_model(n_layers=1, shift=shift)
    ids, am = fastdllm_prompts(padded=True)
    for r in RULES:
        none = uncached(model, ids, am, **r)
        for cache, kw in (("delayed", {}), ("delayed", {"delay": 2}), ("adaptive", {"tolerance": 0.5}),
                          ("adaptive", {"tolerance": 0.5, "every_block": False})):
            out = run(cache, model, ids, am, **kw, **r)
            same(out, none)
            assert out.stats.positions_computed < none.stats.positions_computed, (cache, kw)


def test_caching_pays_and_refreshes_are_counted():
    model = fastdllm_model(n_layers=2)
    ids, am = fastdllm_prompts(padded=True)
    none, dual = run("none", model, ids, am), run("dual", model, ids, am)
    delayed = run("delayed", model, ids, am)
    assert delayed.stats.positions_computed < none.stats.positions_computed
    assert delayed.stats.extra["refreshes"] == 1 and delayed.stats.row_refreshes.tolist() == [1, 1, 1]
    assert dual.stats.extra["refreshes"] == 3  # one per block
    never = run("adaptive", model, ids, am, tolerance=math.inf, every_block=False)
    assert never.stats.row_refreshes.tolist() == [1, 1, 1]  # the first forward only
    always = run("adaptive", model, ids, am, tolerance=0.0)
    assert always.stats.row_refreshes.tolist() == always.stats.row_nfe.tolist()
    some = run("adaptive", model, ids, am, tolerance=0.05, every_block=False)
    assert 1 <= int(some.stats.row_refreshes.min()) and int(some.stats.row_refreshes.max()) < 12


@pytest.mark.parametrize("shift", [False, True])
def test_batch_equals_runs_of_one(shift):
    model = fastdllm_model(n_layers=2, shift=shift)
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(2, 9, (8,), generator=g)]
    ids, am = left_pad(rows, model.config.pad_token_id)
    cases = [("delayed", {}), ("delayed", {"delay": 2}), ("adaptive", {"tolerance": 0.03}),
             ("adaptive", {"tolerance": 0.03, "every_block": False})]
    for (cache, kw), r in itertools.product(cases, RULES[:2]):
        batch = run(cache, model, ids, am, **kw, **r)
        for j, row in enumerate(rows):
            one = run(cache, model, torch.tensor([row]), None, **kw, **r)
            assert torch.equal(batch.sequences[j, -one.sequences.shape[1]:], one.sequences[0]), (cache, kw, r, j)
            for k in ("row_nfe", "row_positions", "row_flops", "row_refreshes"):
                assert getattr(batch.stats, k)[j] == getattr(one.stats, k)[0], (cache, kw, r, j, k)


@pytest.mark.parametrize("make,exc,word", [
    (lambda: DelayedCache(0), ValueError, "delay"),
    (lambda: DelayedCache(1.5), TypeError, "delay"),
    (lambda: DelayedCache(1, refresh_every=0), ValueError, "refresh_every"),
    (lambda: AdaptiveCache(-0.1), ValueError, "tolerance"),
    (lambda: AdaptiveCache(float("nan")), ValueError, "tolerance"),
    (lambda: AdaptiveCache(float("-inf")), ValueError, "tolerance"),
    (lambda: AdaptiveCache("0.1"), TypeError, "tolerance"),
    (lambda: AdaptiveCache(0.1, probe_layer=1.0), TypeError, "probe_layer"),
    (lambda: AdaptiveCache(0.1, every_block=1), TypeError, "every_block"),
    (lambda: Sampler.of("x", policy="dual", delay=2), ValueError, "delay"),
    # 0.2, not adaptive's default 0.1: an option set to its default is dropped (dlm.spec.Sampler.with_)
    (lambda: Sampler.of("x", policy="prefix", tolerance=0.2), ValueError, "tolerance"),
    (lambda: Sampler.of("x", policy="adaptive", refresh_every=2), ValueError, "refresh_every"),
])
def test_bad_knobs_are_rejected(make, exc, word):
    with pytest.raises(exc, match=word):
        make()


def test_probe_layer_out_of_range_raises_before_any_forward():
    from dlm.sample import denoise  # noqa: F401  (the loop runs policy.start before any forward)

    model = fastdllm_model(n_layers=2)
    ids, am = fastdllm_prompts(padded=True)
    calls = []
    handle = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match="probe_layer"):
            import methods.drift_cache as ad
            from dlm.llada import TopK
            from dlm.sample import denoise
            from dlm.policy import blocks_after
            from dlm.validate import prepare_batch
            b = prepare_batch(model, ids, am, 8, None)
            denoise(model, b, blocks_after(b.prompt_len, 8, 4), ad.AdaptiveCache(0.1, probe_layer=2), TopK(4))
    finally:
        handle.remove()
    assert not calls
