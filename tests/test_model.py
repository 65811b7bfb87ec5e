"""The one model and the one cache: windows vs full forward, positions, backends, dtypes."""

import pytest
import torch

from dlm.attention import (available_backends, block_causal_mask, block_ids, causal_mask,
                           key_padding_mask, padding_positions)
from dlm.cache import KVCache
from dlm.model import ModelConfig, Transformer
from tiny import random_prompts, tiny_config, tiny_model

TOL = 1e-10


@pytest.mark.parametrize("overrides", [{}, {"qkv_bias": True}, {"n_kv_heads": 4}, {"tie_embeddings": True}])
def test_cache_windows_match_full_forward(overrides):
    model = tiny_model(**overrides)
    x = random_prompts(3, 24, model.config)
    full = model(x)  # (B, T, V)
    cache = KVCache.for_model(model, 3, 64)
    model(x, cache=cache, commit=True)
    assert cache.length == 24
    # dual-style window: middle block reads prefix and suffix from the cache
    mid = model(x[:, 8:16], cache=cache, start=8)
    torch.testing.assert_close(mid, full[:, 8:16], atol=TOL, rtol=0)
    # prefix-style window: block + everything after it
    tail = model(x[:, 8:], cache=cache, start=8)
    torch.testing.assert_close(tail, full[:, 8:], atol=TOL, rtol=0)
    # non-committing windows leave the cache length, and every column outside them, untouched
    assert cache.length == 24


def test_scratch_window_writes_in_place_and_only_its_columns():
    """A non-committing window writes its fresh K/V into its own columns (attention reads one
    view of the storage) and nothing else; recomputing the window with new tokens reads them."""
    model = tiny_model()
    x = random_prompts(2, 24, model.config)
    cache = KVCache.for_model(model, 2, 32)
    model(x, cache=cache, commit=True)
    k0, v0 = cache.k.clone(), cache.v.clone()
    y = x.clone()
    y[:, 10] = (y[:, 10] + 1) % 30 + 4
    out = model(y[:, 8:16], cache=cache, start=8)  # (B, 8, V)
    ref = KVCache.for_model(model, 2, 32)
    model(x, cache=ref, commit=True)
    cat_k = [torch.cat([ref.k[i, :, :, :8], kw, ref.k[i, :, :, 16:24]], 2)
             for i, kw in enumerate(cache.k[:, :, :, 8:16])]  # what a concatenating cache would attend over
    assert all(torch.equal(a, cache.k[i, :, :, :24]) for i, a in enumerate(cat_k))
    outside = torch.ones(32, dtype=torch.bool)
    outside[8:16] = False
    assert torch.equal(cache.k[:, :, :, outside], k0[:, :, :, outside])
    assert torch.equal(cache.v[:, :, :, outside], v0[:, :, :, outside]) and cache.length == 24
    assert not torch.equal(cache.k[:, :, :, 8:16], k0[:, :, :, 8:16])  # the window's own columns are fresh
    again = model(y[:, 8:16], cache=cache, start=8)
    torch.testing.assert_close(again, out, atol=TOL, rtol=0)


def test_chunked_commit_equals_full_forward_under_causal_mask():
    """Committing prefill in chunks with a causal mask == one causal forward (AR-style use)."""
    model = tiny_model(qkv_bias=True)
    x = random_prompts(2, 20, model.config)
    full = model(x, attn_mask=causal_mask(torch.arange(20), 20))
    cache = KVCache.for_model(model, 2, 32)
    outs = []
    for lo in range(0, 20, 5):
        q = torch.arange(lo, lo + 5)
        outs.append(model(x[:, lo:lo + 5], cache=cache, start=lo, commit=True,
                          attn_mask=causal_mask(q, lo + 5)))
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=TOL, rtol=0)


def test_window_with_stale_cache_differs():
    """The cache really is read: a changed token outside the window changes the window only
    after it is recomputed, so stale K/V are observable (Fast-dLLM's approximation)."""
    model = tiny_model()
    x = random_prompts(1, 16, model.config)
    cache = KVCache.for_model(model, 1, 16)
    model(x, cache=cache, commit=True)
    y = x.clone()
    y[0, 12] = (y[0, 12] + 1) % 30 + 4
    stale = model(y[:, 0:8], cache=cache, start=0)
    torch.testing.assert_close(stale, model(x)[:, :8], atol=TOL, rtol=0)
    assert (model(y)[:, :8] - stale).abs().max() > 1e-6


def test_left_padding_with_positions_is_exact():
    model = tiny_model()
    x = random_prompts(1, 10, model.config)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], 1)
    am = torch.cat([torch.zeros(1, 3), torch.ones(1, 10)], 1).long()
    out = model(padded, positions=padding_positions(am), attn_mask=key_padding_mask(am))
    torch.testing.assert_close(out[:, 3:], model(x), atol=TOL, rtol=0)


def test_positions_are_relative_and_used():
    """RoPE attention depends only on relative positions: a global shift changes nothing,
    a gap between two halves does."""
    model = tiny_model()
    x = random_prompts(1, 8, model.config)
    torch.testing.assert_close(model(x, positions=torch.arange(5, 13)[None]), model(x), atol=1e-9, rtol=0)
    gap = torch.tensor([[0, 1, 2, 3, 10, 11, 12, 13]])
    assert (model(x, positions=gap) - model(x)).abs().max() > 1e-6


@pytest.mark.parametrize("backend", [b for b in available_backends() if b != "sdpa"])
def test_backends_agree(backend):
    model = tiny_model(n_kv_heads=2)
    x = random_prompts(2, 16, model.config)
    am = torch.ones(2, 16, dtype=torch.long)
    am[1, :5] = 0
    ids = block_ids(16, 4, prompt_len=6)
    masks = [None, key_padding_mask(am), block_causal_mask(ids, ids, am)]
    with torch.no_grad():  # FlexAttention has no CPU backward
        for mask in masks:
            ref = model(x, attn_mask=mask, backend="sdpa")
            got = model(x, attn_mask=mask, backend=backend)
            if mask is not None and mask.shape[2] == 1:
                ref, got = ref[1:, 5:], got[1:, 5:]  # padding query rows are don't-care
            torch.testing.assert_close(got, ref, atol=1e-9, rtol=0)


def test_unknown_backend_raises():
    model = tiny_model()
    with pytest.raises(ValueError, match="backend"):
        model(random_prompts(1, 4, model.config), backend="nope")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_close_to_float64(dtype):
    model = tiny_model()
    x = random_prompts(2, 12, model.config)
    ref = model(x)
    low = model.to(dtype)(x)
    assert low.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 0.2
    assert (low.double() - ref).abs().max() < tol * ref.abs().max()


def test_block_causal_mask_brute_force():
    ids = block_ids(13, 3, prompt_len=4)
    expected_ids = [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert ids.tolist() == expected_ids
    m = block_causal_mask(ids, ids)[0, 0]
    for i in range(13):
        for j in range(13):
            assert bool(m[i, j]) == (expected_ids[j] <= expected_ids[i])


def test_dream_shifted_logits():
    model = tiny_model(shift_logits=True, qkv_bias=True)
    x = random_prompts(2, 9, model.config)
    h = model(x, return_hidden=True)
    plain = Transformer(model.config.__class__(**{**model.config.to_dict(), "shift_logits": False}))
    plain.load_state_dict(model.state_dict())
    unshifted = plain.double()(x)
    logits = model(x)
    torch.testing.assert_close(logits[:, 1:], unshifted[:, :-1], atol=TOL, rtol=0)
    torch.testing.assert_close(logits[:, 0], unshifted[:, 0], atol=TOL, rtol=0)
    assert h.shape == (2, 9, model.config.d_model)


def test_logits_slice():
    model = tiny_model()
    x = random_prompts(2, 12, model.config)
    torch.testing.assert_close(model(x, logits_slice=slice(4, 8)), model(x)[:, 4:8], atol=TOL, rtol=0)


def test_config_validation():
    with pytest.raises(ValueError, match="n_heads"):
        tiny_config(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="n_kv_heads"):
        tiny_config(n_kv_heads=3)
    with pytest.raises(ValueError, match="vocab_size"):
        tiny_config(vocab_size=0)
    with pytest.raises(ValueError, match="unknown ModelConfig"):
        ModelConfig.from_dict({**tiny_config().to_dict(), "bogus": 1})
    assert tiny_config().num_params() == sum(p.numel() for p in Transformer(tiny_config()).parameters())
    qkv = tiny_config(qkv_bias=True, tie_embeddings=True)
    assert qkv.num_params() == sum(p.numel() for p in Transformer(qkv).parameters())


def test_cache_errors():
    model = tiny_model()
    cache = KVCache.for_model(model, 1, 16)
    x = random_prompts(1, 4, model.config)
    with pytest.raises(ValueError, match="no gaps"):
        model(x, cache=cache, start=4)
    with pytest.raises(ValueError, match="max_len"):
        model(random_prompts(1, 20, model.config), cache=cache)
    with pytest.raises(ValueError, match="max_seq_len"):
        KVCache.for_model(model, 1, 10_000)
    with pytest.raises(ValueError, match="positions"):
        model(x, positions=torch.arange(3)[None])


@pytest.mark.parametrize("shift", [False, True])
def test_a_gathered_window_equals_the_full_forward_at_its_columns(shift):
    """A forward over cached columns in any order per row (``start`` a (B, W) tensor) writes the
    full bidirectional forward's K/V there and (unshifted) gives its logits at those columns; the
    other columns are read from the cache."""
    model = tiny_model(shift_logits=shift)
    cfg = model.config
    B, T, W = 2, 10, 6
    x = random_prompts(B, T, cfg, seed=3)
    pos = torch.arange(T).expand(B, T)
    cache = KVCache.for_model(model, B, T)
    full = model(x, pos, cache=cache, commit=True)  # (B, T, V)
    k0, v0 = cache.k.clone(), cache.v.clone()
    g = torch.Generator().manual_seed(0)
    cols = torch.stack([torch.randperm(T, generator=g)[:W] for _ in range(B)])  # (B, W) distinct per row
    part = model(x.gather(1, cols), pos.gather(1, cols), cache=cache, start=cols)  # (B, W, V)
    if not shift:  # shifted logits come from the window's previous column, not the sequence's
        assert torch.allclose(part, full.gather(1, cols[..., None].expand(-1, -1, full.shape[-1])), atol=1e-10)
    assert torch.allclose(cache.k, k0, atol=1e-12) and torch.allclose(cache.v, v0, atol=1e-12)
    outside = [c for c in range(T) if c not in cols[0].tolist()][0]
    cache.v[:, 0, :, outside] += 1.0  # a column outside the window: read from the cache
    moved = model(x.gather(1, cols), pos.gather(1, cols), cache=cache, start=cols)
    assert not torch.allclose(moved[0], part[0]) and torch.allclose(moved[1], part[1], atol=1e-10)
    with pytest.raises(ValueError, match="positions"):
        model(x.gather(1, cols), cache=cache, start=cols)
