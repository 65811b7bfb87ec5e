"""experiments.bench.compute_cost: the analytic forwards equal what real samplers count.

Real runs on tiny float64 models (top-k schedules, so step counts are deterministic; BD3-LM
with ``stop_at_eos=False``). FLOPs are compared with a relative tolerance of 1e-12 (the
analytic sum is float64; for these sizes it is exact).
"""

from __future__ import annotations

import json

import pytest
import torch

import bd3lm
import fastdllm
from dlm.attention import causal_mask
from dlm.cache import KVCache
from dlm.llada import generate as baseline_generate
from dlm.stats import forward_flops
from experiments.bench import compute_cost as cc
from tiny import random_prompts, tiny_model

P = 5
LAYOUTS = [(8, 4, 4), (12, 4, 6), (8, 8, 2)]  # (gen, block, steps)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def check(fw: cc.Forwards, stats, cost: cc.CostModel, flops: bool = True) -> None:
    assert (fw.passes, fw.positions) == (stats.nfe, stats.positions_computed)
    if flops:
        assert float(cost.flops(fw.q, fw.k, fw.head).sum()) == pytest.approx(stats.extra["flops"], rel=1e-12)


@pytest.mark.parametrize("G,L,K", LAYOUTS)
def test_matches_real_samplers(model, G, L, K):
    ids = random_prompts(1, P, model.config)
    cost = cc.CostModel.from_config(model.config)
    s = K // (G // L)
    out = baseline_generate(model, ids, gen_length=G, steps=K, block_length=L)
    check(cc.baseline_forwards(P, G, L, s), out.stats, cost, flops=False)
    out = baseline_generate(model, ids, gen_length=G, steps=K, block_length=G)
    check(cc.sampler_forwards("full_diffusion", P, G, L, K), out.stats, cost, flops=False)
    for cache in (None, "prefix", "dual"):
        out = fastdllm.generate(model, ids, gen_length=G, block_length=L, steps=K, cache=cache)
        check(cc.fastdllm_forwards(P, G, L, s, cache), out.stats, cost)
    out = bd3lm.sample(model, ids, block_size=L, gen_length=G, steps_per_block=s, stop_at_eos=False)
    check(cc.bd3lm_forwards(P, G, L, s), out.stats, cost)


def test_refresh_shift_and_parallel(model):
    ids = random_prompts(2, P, model.config)
    cost = cc.CostModel.from_config(model.config)
    out = fastdllm.generate(model, ids, gen_length=12, block_length=4, steps=12, cache="dual", refresh_every=2)
    check(cc.fastdllm_forwards(P, 12, 4, 4, "dual", refresh_every=2), out.stats, cost)
    dream = tiny_model(shift_logits=True, qkv_bias=True)
    for rules, wide in (("llada", True), ("dream", False), ("auto", False)):  # LLaDA rules: one column early
        dcost = cc.CostModel.from_config(dream.config, rules)
        assert dcost.shift_logits == wide
        for cache in ("prefix", "dual"):
            out = fastdllm.generate(dream, ids, gen_length=8, block_length=4, steps=8, cache=cache, rules=rules)
            check(cc.fastdllm_forwards(P, 8, 4, 4, cache, shift_logits=wide), out.stats, dcost)
    # a threshold that every proposal passes commits the whole block per step: R = L
    out = fastdllm.generate(model, ids, gen_length=8, block_length=4, cache="dual", threshold=1e-12)
    row = next(r for r in cc.cost_table(cost, P, 8, 4, 8, tokens_per_step=4)
               if r.strategy == "fastdllm_dual" and r.decoding.startswith("parallel"))
    assert (row.passes, row.positions, row.steps) == (out.stats.nfe, out.stats.positions_computed, out.stats.steps)
    assert row.flops == pytest.approx(out.stats.extra["flops"], rel=1e-12)


def test_ar_matches_kv_cache_loop(model):
    """A real KV-cache AR decode computes P + G - 1 positions with the analytic key lengths."""
    ids, G = random_prompts(1, P, model.config), 6
    cfg = model.config
    cache = KVCache.for_model(model, 1, P + G)
    n_params = cfg.num_params(include_embeddings=False)
    passes = positions = flops = 0
    with torch.no_grad():
        mask = causal_mask(torch.arange(P), P)
        tok = model(ids, cache=cache, commit=True, attn_mask=mask)[:, -1:].argmax(-1)
        passes, positions = 1, P
        flops += forward_flops(n_params, cfg.n_layers, cfg.d_model, P, P, cfg.vocab_size, 1)
        for j in range(1, G):
            tok = model(tok, cache=cache, start=P + j - 1, commit=True).argmax(-1)
            passes, positions = passes + 1, positions + 1
            flops += forward_flops(n_params, cfg.n_layers, cfg.d_model, 1, cache.length, cfg.vocab_size, 1)
    fw = cc.ar_forwards(P, G)
    assert (fw.passes, fw.positions) == (passes, positions) == (G, P + G - 1)
    assert float(cc.CostModel.from_config(cfg).flops(fw.q, fw.k, fw.head).sum()) == flops


def test_seed_example_and_cli(tmp_path, capsys):
    js, png = tmp_path / "c.json", tmp_path / "c.png"
    rows = cc.main(["--prompt", "1000", "--gen", "256", "--block", "32", "--steps", "256",
                    "--tokens-per-step", "4", "--json", str(js), "--plot", str(png)])
    by = {(r.strategy, r.decoding.split(",")[0]): r for r in rows}
    assert by["ar", "sequential"].positions == 1255
    full = by["full_diffusion", "parallel"]
    assert (full.passes, full.positions) == (64, 64 * 1256)
    assert by["full_diffusion", "top-k"].positions == 256 * 1256
    assert by["bd3lm", "top-k"].passes == 256 + 8  # + prompt + 7 committing forwards
    assert "| AR + KV cache |" in capsys.readouterr().out
    assert len(json.loads(js.read_text())["rows"]) == len(rows) and png.stat().st_size > 0


@pytest.mark.parametrize("argv", [
    ["--gen", "30", "--block", "8", "--steps", "30"],  # block does not divide gen
    ["--gen", "32", "--block", "8", "--steps", "6"],  # steps not a multiple of blocks
    ["--gen", "32", "--block", "8", "--steps", "8", "--tokens-per-step", "0.5"],
    ["--gen", "32", "--block", "8", "--steps", "8", "--params", "100"],  # incomplete manual model
    ["--gen", "0", "--block", "8", "--steps", "8"],
])
def test_bad_inputs(argv):
    with pytest.raises(ValueError):
        cc.main(["--prompt", "10", *argv])


def test_manual_model_and_config_json(tmp_path):
    from dlm.layouts import config_to_json

    cfg = tiny_model().config
    (tmp_path / "config.json").write_text(json.dumps(config_to_json(cfg, "native")))
    base = ["--prompt", "4", "--gen", "8", "--block", "4", "--steps", "8"]
    a = cc.main(base + ["--model", str(tmp_path)])
    b = cc.main(base + ["--params", str(cfg.num_params(include_embeddings=False)), "--layers",
                        str(cfg.n_layers), "--d-model", str(cfg.d_model), "--vocab", str(cfg.vocab_size)])
    assert a == b
    with pytest.raises(ValueError, match="model"):
        cc.cost_model_from_args(type("A", (), dict(model=str(tmp_path / "nope"), params=None, layers=None,
                                                    d_model=None, vocab=None))())
