"""``prune_last_layer``: the last block computes queries, attention output and MLP for the
logits slice only. Same logits, same gradients, same K/V written to a cache as the full forward."""

from __future__ import annotations

import pytest
import torch

from bd3lm import bd3_logits
from bd3lm.masks import dense_bd3_mask, flex_bd3_mask, num_columns
from dlm.cache import KVCache
from tiny import random_prompts, tiny_dream, tiny_model


def _bd3_input(cfg, R: int = 16, bs: int = 4, P: int = 3):
    """The 2L layout of a response of R with a prompt of P: ids, positions, mask, logits slice."""
    x0 = random_prompts(2, P + R, cfg, seed=1)
    N = num_columns(R, bs) + P
    inp = torch.cat([x0, x0[:, P:P + R - bs]], dim=1)  # (B, N): prompt, noisy half, clean half
    pos = torch.cat([torch.arange(P + R), torch.arange(P, P + R - bs)]).expand(2, N)
    keep = torch.ones(2, N, dtype=torch.bool)
    keep[1, 0] = False  # a padded prompt column in row 1
    return inp, pos, dense_bd3_mask(R, bs, P, key_keep=keep), slice(P, P + R)


@pytest.mark.parametrize("backend", ["sdpa", "math", "blocksparse"])
def test_same_logits_as_the_full_last_layer(backend):
    model = tiny_model(n_layers=3)
    inp, pos, mask, rows = _bd3_input(model.config)
    with torch.no_grad():
        full = model(inp, positions=pos, attn_mask=mask, backend=backend, logits_slice=rows)
        pruned = model(inp, positions=pos, attn_mask=mask, backend=backend, logits_slice=rows,
                       prune_last_layer=True)
        hidden = model(inp, positions=pos, attn_mask=mask, backend=backend, logits_slice=rows,
                       prune_last_layer=True, return_hidden=True)
    assert pruned.shape == full.shape == (2, 16, model.config.vocab_size) and hidden.shape[1] == 16
    torch.testing.assert_close(pruned, full, rtol=0, atol=1e-12)


def test_same_gradients():
    model = tiny_model(n_layers=2)
    inp, pos, mask, rows = _bd3_input(model.config)
    grads = []
    for prune in (False, True):
        model.zero_grad(set_to_none=True)
        out = model(inp, positions=pos, attn_mask=mask, logits_slice=rows, prune_last_layer=prune)
        out.logsumexp(-1).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-10, atol=1e-12, msg=name)


def test_every_column_kv_still_reaches_the_cache():
    model = tiny_model(n_layers=2)
    x = random_prompts(2, 12, model.config, seed=4)
    caches = []
    for prune in (False, True):
        cache = KVCache.for_model(model, 2, 12)
        with torch.no_grad():
            out = model(x, cache=cache, commit=True, logits_slice=slice(8, 12), prune_last_layer=prune)
        caches.append((cache, out))
    (c0, o0), (c1, o1) = caches
    assert c0.length == c1.length == 12
    torch.testing.assert_close(c1.k, c0.k, rtol=0, atol=0)
    torch.testing.assert_close(c1.v, c0.v, rtol=0, atol=0)
    torch.testing.assert_close(o1, o0, rtol=0, atol=1e-12)


def test_bd3_logits_prunes_and_flex_does_not(monkeypatch):
    model = tiny_model()
    seen = []
    real = type(model).forward

    def spy(self, *a, **kw):
        seen.append(kw.get("prune_last_layer"))
        return real(self, *a, **kw)

    monkeypatch.setattr(type(model), "forward", spy)
    x0 = random_prompts(2, 8, model.config, seed=2)
    bd3_logits(model, x0, x0, 4, backend="sdpa")
    assert seen == [True]
    pytest.importorskip("torch.nn.attention.flex_attention")
    with torch.no_grad():  # FlexAttention has no CPU backward
        bd3_logits(model, x0, x0, 4, backend="flex")  # a BlockMask: rows cannot be cut
    assert seen == [True, False]


def test_refused_where_rows_cannot_be_cut():
    dream = tiny_dream()
    x = random_prompts(1, 8, dream.config)
    with pytest.raises(ValueError, match="prune_last_layer"):
        dream(x, logits_slice=slice(4, 8), prune_last_layer=True)  # shifted logits read column i - 1
    model = tiny_model()
    try:
        block = flex_bd3_mask(8, 4)
    except (ImportError, RuntimeError):
        pytest.skip("FlexAttention unavailable")
    x = random_prompts(1, num_columns(8, 4), model.config)
    with pytest.raises(ValueError, match="prune_last_layer"):
        model(x, attn_mask=block, backend="flex", logits_slice=slice(0, 8), prune_last_layer=True)
