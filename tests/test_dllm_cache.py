"""dLLM-Cache (``methods/dllm_cache.py``) against a plain-loop reference, and its registration
reaching the CLI, the sampler spec, lm-eval model_args and the grids by itself.

The reference decodes one prompt with the threshold rule written out in loops: at each step it
picks the recomputed columns by the policy's clocks and, between refreshes, the answer columns
whose first-layer values moved most (cosine similarity computed column by column); it then runs
the *whole* sequence with every other column pinned to its cached K/V (``KVCache.keep``), not
the policy's gathered window, so the two paths share only the model."""

from __future__ import annotations

import pytest
import torch

from dlm import registry
from dlm.cache import KVCache
from dlm.spec import Sampler, generate
from experiments.cli.generate import parser
from harness.grids import caches
from harness.sampler_flags import sampler_from_args, sampler_from_model_args
from methods.dllm_cache import DLLMCache
from tiny import random_prompts, tiny_model

G, L = 12, 4


@torch.no_grad()
def ref_dllm(model, ids, k_p: int, k_r: int, rho: float, threshold: float) -> list[int]:
    P, mask_id = ids.shape[1], model.config.mask_token_id
    T = P + G
    x = torch.cat([ids, torch.full((1, G), mask_id)], dim=1)
    pos = torch.arange(T)[None]
    cache = KVCache.for_model(model, 1, T)
    layer = model.layers[0]
    t = 0
    for lo in range(P, T, L):
        hi = lo + L
        while (x[0, lo:hi] == mask_id).any():
            if t % k_p == 0:
                keep = []
            elif t % k_r == 0:
                keep = list(range(P))
            else:
                sims = {}
                for j in range(P, T):
                    if lo <= j < hi:
                        continue
                    fresh = layer.attn.v_proj(layer.attn_norm(model.embed(x[:, j])))[0]  # (Hkv * D,)
                    old = cache.v[0, 0, :, j].flatten()
                    cos = torch.dot(fresh, old) / (fresh.norm() * old.norm()).clamp_min(1e-8)
                    sims[j] = float(torch.round(cos, decimals=9))  # ties (unchanged values) by column
                n = min(round(rho * G), G - L)
                picked = sorted(sorted(sims, key=lambda j: (sims[j], j))[:n])
                keep = [j for j in range(T) if j not in picked and not lo <= j < hi]
            pin = torch.zeros(1, T, dtype=torch.bool)
            pin[0, keep] = True
            cache.keep = pin if keep else None
            logits = model(x, pos, cache=cache, start=0, commit=True)[0, lo:hi]  # (L, V)
            cache.keep = None
            logits[:, mask_id] = float("-inf")
            probs = torch.softmax(logits.double(), dim=-1)
            conf, x0 = probs.max(-1)
            masked = [c for c in range(L) if x[0, lo + c] == mask_id]
            top = max(masked, key=lambda c: (conf[c], -c))
            for c in masked:
                if c == top or conf[c] >= threshold:
                    x[0, lo + c] = x0[c]
            t += 1
    return x[0, P:].tolist()


@pytest.mark.parametrize("k_p,k_r,rho", [(20, 4, 0.25), (3, 2, 0.5), (5, 100, 0.0), (100, 3, 1.0), (1, 1, 0.1)])
@pytest.mark.parametrize("seed", [0, 1])
def test_policy_equals_the_loop_reference(k_p, k_r, rho, seed):
    model = tiny_model(seed=seed)
    ids = random_prompts(1, 5, model.config, seed=seed)
    s = Sampler.of("d", policy="dllm_cache", rule="threshold", threshold=0.15, gen_length=G, block_length=L,
                   prompt_interval=k_p, gen_interval=k_r, transfer_ratio=rho)
    out = generate(model, ids, None, s)
    assert out.sequences[0, ids.shape[1]:].tolist() == ref_dllm(model, ids, k_p, k_r, rho, 0.15)


def test_between_refreshes_it_computes_less_than_a_refresh_every_step():
    model = tiny_model()
    ids = random_prompts(3, 5, model.config, seed=2)
    base = dict(policy="dllm_cache", gen_length=G, block_length=L)
    lazy = generate(model, ids, None, Sampler.of("lazy", **base))
    eager = generate(model, ids, None, Sampler.of("eager", **base, prompt_interval=1))
    assert lazy.stats.nfe == eager.stats.nfe and lazy.stats.positions_computed < eager.stats.positions_computed


def test_registered_and_reachable_from_every_front_door():
    assert registry.get("policy", "dllm_cache") is DLLMCache
    args = parser().parse_args(["--policy", "dllm_cache", "--gen-interval", "2", "--transfer-ratio", "0.5"])
    s = sampler_from_args(args)
    assert (s.option("gen_interval"), s.option("transfer_ratio")) == (2, 0.5)
    m = sampler_from_model_args("x", {"policy": "dllm_cache", "prompt_interval": 10, "threshold": 0.8})
    assert m.components("llada")[0] == DLLMCache(prompt_interval=10)
    assert "cache_dllm_cache_threshold" in {c.name for c in caches()}
    with pytest.raises(ValueError, match="transfer_ratio"):
        Sampler.of("bad", policy="dllm_cache", transfer_ratio=1.5)
