"""AR decoding with the exact KV cache equals step-by-step uncached causal recomputation, greedy
and sampled, for shifted (Dream-style) and plain next-token models, batched under left padding."""

import pytest
import torch

from dlm.attention import causal_mask
from dlm.commit import add_gumbel_noise, suppress_logits
from dlm.spec import Sampler, generate
from tiny import left_pad, tiny_model, unpad


def reference_ar(model, prompt, gen, temperature=0.0, generator=None):
    """One uncached causal forward per token over everything so far (batch of 1, no padding)."""
    cfg = model.config
    x = prompt.clone()
    for _ in range(gen):
        j = x.shape[1]
        inp = torch.cat([x, torch.full((1, 1), cfg.mask_token_id)], dim=1)  # column j still [MASK]
        logits = model(inp, attn_mask=causal_mask(torch.arange(j + 1), j + 1))  # (1, j + 1, V)
        logit = logits[:, j] if cfg.shift_logits else logits[:, j - 1]  # from hidden state j - 1
        logit = suppress_logits(logit[:, None], (cfg.mask_token_id,))
        nxt = add_gumbel_noise(logit, temperature, generator).argmax(-1)  # (1, 1)
        x = torch.cat([x, nxt], dim=1)
    return x


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ar_cache_equals_uncached_causal_recomputation(shift, temperature):
    model = tiny_model(shift_logits=shift, qkv_bias=shift)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(4, 39, (n,), generator=g).tolist() for n in (5, 2, 7)]
    ids, am = left_pad(rows, model.config.pad_token_id)
    s = Sampler.of("ar", policy="ar", rule="topk", gen_length=10, block_length=1, temperature=temperature)
    for r in range(3):
        one = unpad(ids, am, r)
        ref = reference_ar(model, one, 10, temperature, torch.Generator().manual_seed(5))
        out = generate(model, one, None, s, generator=torch.Generator().manual_seed(5))
        assert torch.equal(out.sequences, ref), r
        prefill = one.shape[1] + int(shift)  # shifted logits: logit P needs column P in the prefill
        assert out.stats.nfe == 10 and out.stats.positions_computed == prefill + 9  # then 1 per step
    if temperature == 0:  # batch of 3 under left padding = 3 runs of one
        batch = generate(model, ids, am, s)
        for r in range(3):
            one = generate(model, unpad(ids, am, r), None, s).sequences[0]
            assert torch.equal(batch.sequences[r, -one.shape[0]:], one)


def test_ar_needs_single_column_blocks():
    with pytest.raises(ValueError, match="block_length=1"):
        Sampler.of("ar", policy="ar", rule="topk", gen_length=8, block_length=4)
    with pytest.raises(ValueError, match="block_length=1"):
        Sampler.of("ar", policy="ar", rule="threshold", gen_length=8, block_length=1, threshold=0.9)
