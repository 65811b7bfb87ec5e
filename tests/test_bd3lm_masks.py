"""BD3-LM ``x_t ⊕ x_0`` mask: brute force, pruning, FlexAttention, and block independence."""

from __future__ import annotations

import pytest
import torch

from bd3lm.loss import bd3_logits
from bd3lm.masks import bd3_mask, check_layout, dense_bd3_mask, num_columns
from tiny import random_prompts, tiny_model


def brute_force(R: int, bs: int, P: int = 0) -> torch.Tensor:
    """The rules of BD3-LM Fig. 2 + our prompt rule, one (query, key) pair at a time."""
    n = P + 2 * R

    def kind(c):
        if c < P:
            return "prompt", -1
        if c < P + R:
            return "noisy", (c - P) // bs
        return "clean", (c - P - R) // bs

    out = torch.zeros(n, n, dtype=torch.bool)
    for q in range(n):
        qk, qb = kind(q)
        for k in range(n):
            kk, kb = kind(k)
            if kk == "prompt":
                ok = True  # the clean prompt is visible to everything
            elif qk == "prompt":
                ok = False  # the prompt sees only itself
            elif qk == "noisy":
                ok = (kk == "noisy" and kb == qb) or (kk == "clean" and kb < qb)
            else:
                ok = kk == "clean" and kb <= qb  # clean never sees noisy
            out[q, k] = ok
    return out


@pytest.mark.parametrize("R,bs,P", [(8, 1, 0), (8, 2, 0), (8, 4, 0), (8, 8, 0), (12, 3, 0),
                                    (8, 4, 3), (6, 2, 1), (4, 4, 2)])
def test_mask_matches_brute_force(R, bs, P):
    n = P + 2 * R
    cols = torch.arange(n)
    got = bd3_mask(cols[:, None], cols[None, :], R, bs, P)
    assert torch.equal(got, brute_force(R, bs, P))
    # the pruned layout drops the last clean block and nothing else changes
    m = num_columns(R, bs, P)
    assert m == n - bs
    assert torch.equal(dense_bd3_mask(R, bs, P)[0, 0], got[:m, :m])
    assert not got[:P + R, n - bs:].any(), "no x_t query may attend the last clean block"


def test_padding_keeps_rows_non_empty():
    keep = torch.tensor([[False] + [True] * 7])  # (1, N): N = 2 + 2 * 4 - 2
    mask = dense_bd3_mask(4, 2, prompt_len=2, key_keep=keep)
    assert mask.shape == (1, 1, 8, 8)
    assert mask.any(-1).all(), "every query row attends something"
    assert not mask[0, 0, 1:, 0].any(), "no other query attends a padding key"


def test_bad_layout():
    with pytest.raises(ValueError, match="block_size"):
        check_layout(10, 4)
    with pytest.raises(ValueError, match="block_size"):
        check_layout(8, 0)
    with pytest.raises(TypeError, match="resp_len"):
        check_layout(8.0, 2)


def test_flex_mask_equals_dense():
    """FlexAttention on CPU runs eagerly under no_grad (no backward on CPU)."""
    from torch.nn.attention.flex_attention import create_mask

    R, bs, P = 8, 2, 3
    n = num_columns(R, bs, P)
    dense = dense_bd3_mask(R, bs, P)

    def mod(b, h, q, kv):
        return bd3_mask(q, kv, R, bs, P)

    assert torch.equal(create_mask(mod, 1, 1, n, n, device="cpu"), dense)
    model = tiny_model()
    x0 = random_prompts(2, R, model.config, seed=1)
    xt = torch.where(torch.rand(2, R, generator=torch.Generator().manual_seed(0)) < 0.5,
                     model.config.mask_token_id, x0)
    prompt = random_prompts(2, P, model.config, seed=2)
    keep = torch.ones(2, R, dtype=torch.bool)
    keep[1, -1] = False
    with torch.no_grad():
        a = bd3_logits(model, xt, x0, bs, prompt=prompt, keep=keep, backend="sdpa")
        b = bd3_logits(model, xt, x0, bs, prompt=prompt, keep=keep, backend="flex")
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("P", [0, 3])
def test_block_independence(P):
    """x_t block b sees exactly x_t^b and x^{<b}: changing x_0 blocks >= b leaves its logits
    unchanged, changing x_0 block b - 1 changes them."""
    model = tiny_model()
    cfg = model.config
    R, bs, b = 12, 3, 2
    x0 = random_prompts(1, R, cfg, seed=3)
    xt = x0.clone()
    xt[:, ::2] = cfg.mask_token_id
    prompt = random_prompts(1, P, cfg, seed=4) if P else None
    blk = slice(b * bs, (b + 1) * bs)

    def logits(x0_):
        with torch.no_grad():
            return bd3_logits(model, xt, x0_, bs, prompt=prompt, backend="math")[:, blk]

    base = logits(x0)
    later = x0.clone()
    later[:, b * bs:] = (later[:, b * bs:] + 1) % cfg.mask_token_id  # blocks b, b+1, ...
    torch.testing.assert_close(logits(later), base, rtol=0, atol=1e-12)
    earlier = x0.clone()
    earlier[:, (b - 1) * bs] = (earlier[:, (b - 1) * bs] + 1) % cfg.mask_token_id
    assert (logits(earlier) - base).abs().max() > 1e-6


def test_training_flop_ratios_of_the_benchmark():
    """The benchmark's FLOP floors: one block (L' = L) is MDLM exactly; the allowed-pairs count is
    below the dense count and equals the brute-force count of the mask."""
    from experiments.bench.bench_bd3lm import flop_ratios
    from tiny import tiny_config

    cfg = tiny_config()
    one = flop_ratios(cfg, 16, 16)
    assert one["flop_ratio_dense"] == pytest.approx(1.0) and one["flop_ratio_sparse"] == pytest.approx(1.0)
    r = flop_ratios(cfg, 32, 4)
    assert 1.0 < r["flop_ratio_sparse"] < r["flop_ratio_dense"] < 2 * 32 / 32 + 1
    N = num_columns(32, 4)
    pairs = sum(bool(bd3_mask(torch.tensor(q), torch.tensor(k), 32, 4)) for q in range(N) for k in range(N))
    assert pairs == int(dense_bd3_mask(32, 4).sum())
    # pruned: layer by layer from the model's own parameter counts (the last layer computes K/V for
    # all N rows, everything else for the 32 noisy rows only, over the pairs those rows see)
    from dlm.model import Transformer

    model = Transformer(cfg)
    head = 2 * cfg.d_model * cfg.vocab_size * 32
    layer = sum(p.numel() for p in model.layers[0].parameters())
    kv = sum(p.numel() for n, p in model.layers[0].named_parameters() if n.startswith(("attn.k_proj", "attn.v_proj")))
    mask = dense_bd3_mask(32, 4)[0, 0]
    noisy_pairs = int(mask[:32].sum())
    final = 2 * (cfg.num_params(include_embeddings=False) - cfg.n_layers * layer) * N  # the final norm
    full = (cfg.n_layers - 1) * (2 * layer * N + 4 * cfg.d_model * pairs) + final + head
    last = 2 * kv * N + 2 * (layer - kv) * 32 + 4 * cfg.d_model * noisy_pairs
    mdlm = cfg.n_layers * (2 * layer * 32 + 4 * cfg.d_model * 32 * 32) + 2 * (final // (2 * N)) * 32 + head
    assert r["flop_ratio_sparse_pruned"] == pytest.approx((full + last) / mdlm, rel=2e-3)
    assert r["flop_ratio_sparse_pruned"] < r["flop_ratio_sparse"] and r["flop_ratio_dense_pruned"] < r["flop_ratio_dense"]
    assert one["flop_ratio_dense_pruned"] == pytest.approx(1.0) and one["flop_ratio_sparse_pruned"] == pytest.approx(1.0)


@pytest.mark.parametrize("R,bs,P", [(32, 4, 0), (24, 8, 5), (64, 16, 0)])
def test_blocksparse_attention_equals_dense_with_gradients(R, bs, P):
    """The 'blocksparse' backend (SDPA on each query chunk's visible keys) gives the dense
    masked attention's logits and parameter gradients, with and without key padding."""
    from bd3lm.loss import bd3_nelbo
    from dlm.attention import sparse_plan

    model = tiny_model(qkv_bias=True).double()
    B = 2
    g = torch.Generator().manual_seed(1)
    x0 = random_prompts(B, R, model.config)
    prompt = random_prompts(B, P, model.config) if P else None
    keep = torch.ones(B, R, dtype=torch.long)
    keep[1, -3:] = 0
    grads = {}
    for backend in ("sdpa", "blocksparse"):
        model.zero_grad(set_to_none=True)
        logits = bd3_logits(model, x0.clone(), x0, bs, prompt=prompt, keep=keep, backend=backend)
        batch = {"input_ids": x0}
        loss = bd3_nelbo(model, batch, bs, generator=torch.Generator().manual_seed(0), backend=backend).total
        loss.backward()
        grads[backend] = (logits.detach(), float(loss.detach()), [p.grad.clone() for p in model.parameters()])
    (l1, s1, g1), (l2, s2, g2) = grads["sdpa"], grads["blocksparse"]
    torch.testing.assert_close(l2, l1, atol=1e-10, rtol=1e-10)
    assert s2 == pytest.approx(s1, rel=1e-10)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(b, a, atol=1e-10, rtol=1e-8)
    mask = dense_bd3_mask(R, bs, P)
    n = mask.shape[-1]
    plan = sparse_plan(mask, chunk=16)
    assert not plan.unmasked and plan is sparse_plan(mask, chunk=16)  # made once per mask
    seen = sum((b - a) * (n if cols is None else len(cols)) for a, b, cols in plan.spans)
    assert seen < n * n  # work skipped: keys no row of a chunk may see
    assert sparse_plan(torch.ones(1, 1, 8, 8, dtype=torch.bool)).unmasked
    for a, b, cols in plan.spans:  # and no visible key dropped
        vis = mask[0, 0, a:b].any(0).nonzero().squeeze(-1)
        assert cols is None or torch.equal(cols, vis)
