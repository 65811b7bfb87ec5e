"""BD3-LM NELBO: vectorized == per-block reference, AR / MDLM special cases, SFT, schedules."""

from __future__ import annotations

import statistics

import pytest
import torch

from bd3lm import BD3Objective, ClipSchedule, bd3_logits, bd3_nelbo, perplexity, search_clipping
from bd3lm.loss import subs_nll
from bd3lm.schedules import draw_noise, stratified_uniform
from dlm.attention import block_causal_mask, block_ids, causal_mask
from tiny import random_prompts, tiny_model


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_vectorized_logits_equal_per_block_reference():
    """One 2L forward == B separate forwards over [x^{<b} clean | x_t^b] (BD3-LM eq. 8 terms)."""
    model = tiny_model()
    cfg = model.config
    R, bs = 12, 4
    x0 = random_prompts(2, R, cfg, seed=1)
    xt = torch.where(torch.rand(2, R, generator=gen()) < 0.6, cfg.mask_token_id, x0)
    with torch.no_grad():
        fast = bd3_logits(model, xt, x0, bs, backend="math")  # (B, R, V)
        for b in range(R // bs):
            lo, hi = b * bs, (b + 1) * bs
            inp = torch.cat([x0[:, :lo], xt[:, lo:hi]], dim=1)
            blocks = torch.arange(hi) // bs
            ref = model(inp, attn_mask=block_causal_mask(blocks, blocks), backend="math")[:, lo:hi]
            torch.testing.assert_close(fast[:, lo:hi], ref, rtol=0, atol=1e-10)


def test_prompt_layout_matches_sampler_block_causal_mask():
    """Training/inference parity for SFT: the prompt-conditioned 2L logits of block b equal a
    forward over [prompt | x^{<b} | x_t^b] with the sampler's block-causal mask (prompt = block 0)."""
    model = tiny_model()
    cfg = model.config
    P, R, bs, b = 3, 8, 4, 1
    prompt = random_prompts(1, P, cfg, seed=11)
    x0 = random_prompts(1, R, cfg, seed=12)
    xt = x0.clone()
    xt[:, 1::2] = cfg.mask_token_id
    with torch.no_grad():
        fast = bd3_logits(model, xt, x0, bs, prompt=prompt, backend="math")[:, b * bs:(b + 1) * bs]
        inp = torch.cat([prompt, x0[:, :b * bs], xt[:, b * bs:(b + 1) * bs]], dim=1)
        ids = block_ids(inp.shape[1], bs, P)
        ref = model(inp, attn_mask=block_causal_mask(ids, ids), backend="math")[:, -bs:]
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-10)


def test_block_size_one_fully_masked_is_exact_ar_nll():
    """L' = 1 with every x_t token masked (t = 1, weight 1/t = 1) is an AR model.

    Noisy column i holds [MASK] at position i and attends to itself and to the clean columns
    < i, whose own keys/values come from clean-causal attention (clean block j sees clean
    blocks <= j, i.e. tokens <= j). That is exactly what a causal model sees when it is run
    sequentially on ``x_0[:i] + [MASK]`` with a token-causal mask and reads the last logit:
    the same keys, values and positions, hence the same ``-log p(x_i | x_{<i})``.
    """
    model = tiny_model()
    cfg = model.config
    x = random_prompts(2, 8, cfg, seed=5)
    out = bd3_nelbo(model, {"input_ids": x}, 1, fixed_t=1.0, generator=gen(), backend="math")
    assert out.masked.all()
    ref = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for i in range(x.shape[1]):
            inp = torch.cat([x[:, :i], torch.full((2, 1), cfg.mask_token_id)], dim=1)
            mask = causal_mask(torch.arange(i + 1), i + 1)
            logits = model(inp, attn_mask=mask, backend="math")[:, -1:]
            ref += subs_nll(logits, x[:, i:i + 1], cfg.mask_token_id)[:, 0]
    torch.testing.assert_close(out.terms.sum(-1).detach(), ref, rtol=0, atol=1e-10)
    ppl = perplexity(model, [x], 1, exact_ar=True, backend="math")
    assert ppl.exact and ppl.tokens == 16
    assert abs(ppl.nelbo - float(ref.sum()) / 16) < 1e-10


def test_block_size_full_is_mdlm():
    """L' = L: one block, the pruned layout has no clean half; logits == bidirectional model."""
    model = tiny_model()
    cfg = model.config
    x0 = random_prompts(2, 8, cfg, seed=6)
    xt = torch.where(torch.rand(2, 8, generator=gen(1)) < 0.5, cfg.mask_token_id, x0)
    with torch.no_grad():
        torch.testing.assert_close(bd3_logits(model, xt, x0, 8), model(xt), rtol=0, atol=1e-10)


def test_sft_rows_match_single_rows_and_prompt_stays_clean():
    model = tiny_model()
    cfg = model.config
    ids = random_prompts(3, 14, cfg, seed=7)
    ids[:, -3:] = cfg.eos_token_id  # EOS-padded responses
    pl = torch.tensor([2, 6, 4])
    batch = {"input_ids": ids, "prompt_lengths": pl}
    noise = draw_noise(3, 14, 4, ClipSchedule(), gen(2))
    full = bd3_nelbo(model, batch, 4, noise=noise, backend="math")
    assert torch.equal(full.counts, 14 - pl)
    for i in range(3):
        one = {"input_ids": ids[i:i + 1], "prompt_lengths": pl[i:i + 1]}
        row = bd3_nelbo(model, one, 4, noise={k: v[i:i + 1] for k, v in noise.items()}, backend="math")
        torch.testing.assert_close(row.terms.sum(), full.terms[i].sum(), rtol=0, atol=1e-10)
        assert int(row.masked.sum()) == int(full.masked[i].sum())


def test_objective_shards_average_to_full_batch_and_backward():
    model = tiny_model()
    x = random_prompts(4, 12, model.config, seed=8)
    obj = BD3Objective(4)
    noise = obj.sample_noise({"input_ids": x}, gen(3))
    loss, metrics = obj(model, {"input_ids": x, **noise}, gen(4))
    halves = [obj(model, {"input_ids": x[s], **{k: v[s] for k, v in noise.items()}}, None)[0]
              for s in (slice(0, 2), slice(2, 4))]
    torch.testing.assert_close(loss, (halves[0] + halves[1]) / 2, rtol=0, atol=1e-12)
    assert set(metrics) >= {"nelbo", "masked_frac"}
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_stratified_times_and_resampling():
    u = stratified_uniform(4, 5, gen(5))
    assert torch.equal(torch.sort((u.flatten() * 20).floor().long()).values, torch.arange(20))
    model = tiny_model()
    x = random_prompts(8, 16, model.config, seed=9)
    sched = ClipSchedule(0.3, 0.8, resample=True, candidates=64)
    out = bd3_nelbo(model, {"input_ids": x}, 4, schedule=sched, generator=gen(6))
    counts = out.masked.view(8, 4, 4).sum(-1)
    assert ((counts >= 2) & (counts <= 3)).all(), "resampled blocks mask ceil(.3*4)..floor(.8*4) tokens"
    assert ((out.t >= 0.3) & (out.t < 0.8)).all()


def test_search_clipping_picks_min_variance():
    model = tiny_model()
    x = random_prompts(4, 16, model.config, seed=10)
    grid = [(0.0, 1.0), (0.3, 0.8), (0.5, 1.0)]
    res = search_clipping(model, [{"input_ids": x}], 4, grid=grid, generator=gen(7))
    best = min(res.variances, key=res.variances.get)
    assert (res.schedule.beta, res.schedule.omega) == best and res.n_batches == 1
    with pytest.raises(ValueError, match="empty"):
        search_clipping(model, [], 4, grid=grid)


@pytest.mark.parametrize("beta,omega", [(0.5, 0.5), (0.7, 0.3), (-0.1, 0.5), (0.2, 1.5)])
def test_bad_schedule(beta, omega):
    with pytest.raises(ValueError, match="beta|omega"):
        ClipSchedule(beta, omega)


def test_bad_batches():
    model = tiny_model()
    cfg = model.config
    x = random_prompts(2, 10, cfg)
    with pytest.raises(ValueError, match="block_size"):
        bd3_nelbo(model, {"input_ids": x}, 4, generator=gen())
    bad = x.clone()
    bad[0, 0] = cfg.mask_token_id
    with pytest.raises(ValueError, match="mask id"):
        bd3_nelbo(model, {"input_ids": bad}, 5, generator=gen())
    with pytest.raises(ValueError, match="prompt_lengths"):
        bd3_nelbo(model, {"input_ids": x, "prompt_lengths": torch.tensor([0, 10])}, 5, generator=gen())
    with pytest.raises(TypeError, match="input_ids"):
        bd3_nelbo(model, {"input_ids": x.float()}, 5, generator=gen())
    with pytest.raises(ValueError, match="backend"):
        BD3Objective(5, backend="cuda")
    with pytest.raises(ValueError, match="exact_ar"):
        perplexity(model, [x], 5, exact_ar=True)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="passes"):
            perplexity(model, [x], 5, generator=gen(), passes=bad)


def test_perplexity_passes_average_fresh_noise():
    """``passes=K`` is the mean of K one-pass estimates drawn in turn from the same generator,
    with their standard error; the exact AR NLL is deterministic and runs once."""
    model = tiny_model()
    x = random_prompts(4, 10, model.config, seed=3)
    g = gen()
    singles = [perplexity(model, [x[:2], x[2:]], 5, generator=g).nelbo for _ in range(4)]
    assert len(set(singles)) == 4  # fresh noise each pass
    out = perplexity(model, [x[:2], x[2:]], 5, generator=gen(), passes=4)
    assert out.passes == 4 and out.tokens == 40 and list(out.pass_nelbo) == pytest.approx(singles, rel=1e-12)
    assert out.nelbo == pytest.approx(sum(singles) / 4, rel=1e-12)
    assert out.sem == pytest.approx(statistics.stdev(singles) / 2, rel=1e-9)
    assert out.to_dict()["passes"] == 4 and "passes" not in perplexity(model, [x], 5, generator=gen()).to_dict()
    ar = perplexity(model, [x], 1, exact_ar=True, passes=8)
    assert ar.passes == 1 and ar.sem is None and ar.nelbo == perplexity(model, [x], 1, exact_ar=True).nelbo
