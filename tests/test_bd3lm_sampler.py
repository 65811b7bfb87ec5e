"""BD3-LM sampler: exact cache == uncached block-causal reference, batching, EOS stop, errors."""

from __future__ import annotations

import pytest
import torch

from bd3lm.sampler import sample
from dlm.commit import top_p_filter
from dlm.model import Transformer
from tiny import left_pad, random_prompts, tiny_config, tiny_model


def run(model, prompts, mask=None, seed=0, **kw):
    logits = []
    kw.setdefault("block_size", 4)
    kw.setdefault("gen_length", 12)
    out = sample(model, prompts, mask, generator=torch.Generator().manual_seed(seed),
                 callback=lambda v: logits.append(v.logits.clone()), **kw)
    return out, logits


@pytest.mark.parametrize("mode,temperature,top_p,align", [
    ("topk", 0.0, 1.0, "prompt"),
    ("topk", 1.0, 0.9, "absolute"),
    ("first_hitting", 1.0, 1.0, "prompt"),
    ("ancestral", 0.7, 0.8, "prompt"),
])
def test_cache_equals_uncached_block_causal(mode, temperature, top_p, align):
    model = tiny_model()
    rows = [[5, 6, 7, 8, 9], [10, 11, 12, 13, 14]] if align == "absolute" else [[5, 6, 7], [8, 9, 10, 11, 12]]
    ids, mask = left_pad(rows, model.config.pad_token_id)
    kw = dict(mode=mode, temperature=temperature, top_p=top_p, align=align, steps_per_block=3,
              gen_length=11 if align == "absolute" else 12, stop_at_eos=False)
    cached, lc = run(model, ids, mask, use_cache=True, **kw)
    ref, lr = run(model, ids, mask, use_cache=False, **kw)
    assert len(lc) == len(lr) > 0
    for a, b in zip(lc, lr):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert torch.equal(cached.sequences, ref.sequences)
    assert torch.equal(cached.commit_step, ref.commit_step)
    assert not (cached.sequences == model.config.mask_token_id).any()
    assert cached.stats.positions_computed < ref.stats.positions_computed


def test_cache_accounting():
    model = tiny_model()
    ids = random_prompts(2, 5, model.config)
    out, _ = run(model, ids, block_size=4, gen_length=12, steps_per_block=2, stop_at_eos=False)
    # prompt forward + 3 blocks x 2 steps + 2 commits (the last block's K/V are never needed)
    assert out.stats.nfe == 1 + 6 + 2
    assert out.stats.positions_computed == 5 + 6 * 4 + 2 * 4
    assert out.stats.steps == 6 and out.sequences.shape == (2, 17)


def test_left_padded_batch_equals_single_rows():
    model = tiny_model()
    rows = [[5, 6], [7, 8, 9, 10, 11], [12, 13, 14]]
    ids, mask = left_pad(rows, model.config.pad_token_id)
    batch, _ = run(model, ids, mask, stop_at_eos=False)
    for i, r in enumerate(rows):
        one, _ = run(model, torch.tensor([r]), stop_at_eos=False)
        assert torch.equal(one.sequences[0, len(r):], batch.sequences[i, ids.shape[1]:])


class EosAt(Transformer):
    """The tiny model with EOS forced (logit +1e3) at one position of chosen rows and
    suppressed (-1e3) everywhere else."""

    rows: tuple = ()
    at: int = 0

    def forward(self, input_ids, positions=None, *args, logits_slice=None, **kw):
        out = super().forward(input_ids, positions, *args, logits_slice=logits_slice, **kw)
        if out.shape[1]:
            pos = positions[:, logits_slice]  # (B, W)
            rows = torch.zeros(out.shape[0], dtype=torch.bool)
            rows[list(self.rows)] = True
            boost = torch.where(rows[:, None] & (pos == self.at), 1e3, -1e3).to(out.dtype)
            out = out.clone()
            out[..., self.config.eos_token_id] += boost
        return out


def eos_model(rows, at):
    model = EosAt(tiny_config()).to(torch.float64)
    model.load_state_dict(tiny_model().state_dict())
    model.rows, model.at = rows, at
    return model.eval()


def test_per_row_eos_stop():
    P, eos = 3, tiny_config().eos_token_id
    ids = random_prompts(2, P, tiny_config())
    model = eos_model(rows=(0,), at=P + 5)  # row 0: EOS in block 1
    out, _ = run(model, ids, gen_length=16)
    gen = out.sequences[:, P:]
    assert gen[0, 5] == eos and (gen[0, 5:] == eos).all() and not (gen[0, :5] == eos).any()
    assert out.stats.tokens_until_eos.tolist()[0] == 6
    assert out.stats.extra["blocks"] == 4, "row 1 keeps going to the maximum length"
    both = eos_model(rows=(0, 1), at=P + 5)
    early, _ = run(both, ids, gen_length=16)
    assert early.stats.extra["blocks"] == 2 and early.stats.nfe < out.stats.nfe
    assert (early.sequences[:, P + 5:] == eos).all()
    assert torch.equal(early.sequences[0], out.sequences[0])


def test_top_p_filter_keeps_nucleus():
    lp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    kept = torch.isfinite(top_p_filter(lp, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.isfinite(top_p_filter(lp, 0.01)).sum() == 1


def test_bad_input():
    model = tiny_model()
    ids = random_prompts(1, 4, model.config)
    with pytest.raises(ValueError, match="max_seq_len"):
        sample(model, ids, block_size=4, max_length=model.config.max_seq_len + 4)
    with pytest.raises(ValueError, match="divide"):
        sample(model, ids, block_size=4, gen_length=10)
    with pytest.raises(ValueError, match="exactly one"):
        sample(model, ids, block_size=4, gen_length=8, max_length=12)
    with pytest.raises(ValueError, match="mode"):
        sample(model, ids, block_size=4, gen_length=8, mode="greedy")
    with pytest.raises(ValueError, match="top_p"):
        sample(model, ids, block_size=4, gen_length=8, top_p=0.0)
    with pytest.raises(ValueError, match="block_size"):
        sample(model, ids, block_size=0, gen_length=8)
    with pytest.raises(ValueError, match="padding"):
        ids2, mask = left_pad([[5, 6, 7], [8, 9]], 0)
        sample(model, ids2, mask, block_size=4, max_length=8, align="absolute")


@pytest.mark.parametrize("align", ["prompt", "absolute"])
@pytest.mark.parametrize("padded", [False, True])
def test_window_mask_equals_brute_force(align, padded):
    """The exact policy's per-window mask (None when nothing is hidden) against the block-causal
    rule written out key by key; a block's steps share one mask object."""
    from bd3lm.policy import ExactBlockCache
    from dlm.sample import Run
    from dlm.stats import ForwardTimer, SampleStats

    L, P, G = 4, 8, 12
    model = tiny_model()
    T = P + G
    am = None
    if padded:
        am = torch.ones(2, T, dtype=torch.long)
        am[1, :4] = 0  # a multiple of L, so ``absolute`` accepts it
    policy = ExactBlockCache(block_size=L, align=align)
    stats = SampleStats(extra={"flops": 0})
    run = Run(model, torch.zeros(2, T, dtype=torch.long), torch.zeros(2, T, dtype=torch.long), am, P, 0,
              (), "sdpa", stats, ForwardTimer(stats, torch.device("cpu"), False))
    start = P if align == "prompt" else 0

    def block(c):
        return 0 if c < start else (c - start) // L + (1 if start > 0 else 0)

    windows = [(0, P - (P % L if align == "absolute" else 0))] + list(policy.layout(P, G, L, am))
    for lo, hi in windows:
        got = policy._mask(run, lo, hi)
        assert policy._mask(run, lo, hi) is got
        want = torch.zeros(2, 1, hi - lo, hi, dtype=torch.bool)
        for b in range(2):
            for q in range(lo, hi):
                for k in range(hi):
                    real = am is None or bool(am[b, k])
                    want[b, 0, q - lo, k] = (block(k) <= block(q) and real) or (am is not None and q == k)
        full = torch.ones_like(want) if got is None else got.expand_as(want)
        assert torch.equal(full, want), (align, padded, lo, hi)
        assert (got is None) == (not padded and block(lo) == block(hi - 1))
