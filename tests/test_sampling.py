"""Baseline sampler: LLaDA generate.py semantics against a plain loop reference, commit rules
against brute force, block confinement, determinism, batch invariance, bad input."""

import pytest
import torch

from dlm.commit import num_transfer_tokens, select_topk
from dlm.llada import generate
from tiny import left_pad, random_prompts, tiny_model


def reference_generate(model, prompt, gen_length, steps, block_length, remasking="low_confidence",
                       cfg_scale=0.0):
    """Straightforward per-row loop transcription of LLaDA's generate.py (batch of 1 rows)."""
    mask_id = model.config.mask_token_id
    B, P = prompt.shape
    x = torch.full((B, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    prompt_index = x != mask_id
    nb = gen_length // block_length
    spb = steps // nb
    for b in range(nb):
        blk = x[:, P + b * block_length: P + (b + 1) * block_length] == mask_id
        n = blk.sum(1)
        sched = [[int(n[r]) // spb + (1 if i < int(n[r]) % spb else 0) for i in range(spb)] for r in range(B)]
        for i in range(spb):
            mask_index = x == mask_id
            if cfg_scale > 0:
                un = x.clone()
                un[prompt_index] = mask_id
                lg = model(torch.cat([x, un]))
                c, u = lg.chunk(2)
                logits = u + (cfg_scale + 1) * (c - u)
            else:
                logits = model(x)
            logits[..., mask_id] = -float("inf")  # [MASK] is never proposed
            x0 = logits.argmax(-1)
            p = torch.softmax(logits.double(), -1)
            conf = p.gather(-1, x0[..., None]).squeeze(-1)
            conf[:, P + (b + 1) * block_length:] = -float("inf")
            x0 = torch.where(mask_index, x0, x)
            conf = torch.where(mask_index, conf, torch.tensor(-float("inf"), dtype=conf.dtype))
            for r in range(B):
                _, idx = torch.topk(conf[r], k=sched[r][i])
                x[r, idx] = x0[r, idx]
    return x


@pytest.mark.parametrize("gen,steps,block", [(16, 16, 16), (16, 8, 4), (24, 6, 8), (12, 12, 3)])
def test_matches_llada_reference(gen, steps, block):
    model = tiny_model()
    prompt = random_prompts(2, 7, model.config)
    out = generate(model, prompt, gen_length=gen, steps=steps, block_length=block)
    ref = reference_generate(model, prompt, gen, steps, block)
    assert torch.equal(out.sequences, ref)
    assert out.stats.nfe == steps
    assert out.stats.positions_computed == steps * (7 + gen)
    assert not (out.sequences == model.config.mask_token_id).any()


def test_cfg_matches_reference():
    model = tiny_model()
    prompt = random_prompts(1, 6, model.config)
    out = generate(model, prompt, gen_length=8, steps=8, block_length=4, cfg_scale=1.5)
    ref = reference_generate(model, prompt, 8, 8, 4, cfg_scale=1.5)
    assert torch.equal(out.sequences, ref)


def test_transfer_schedule():
    counts = torch.tensor([0, 1, 7, 8, 13])
    sched = num_transfer_tokens(counts, 4)
    for row, n in zip(sched.tolist(), counts.tolist()):
        assert sum(row) == n
        assert row == [n // 4 + (1 if i < n % 4 else 0) for i in range(4)]


def test_select_topk_brute_force():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        conf = torch.rand(4, 10, generator=g, dtype=torch.float64)
        conf[0, 3] = conf[0, 5]  # a tie
        eligible = torch.rand(4, 10, generator=g) < 0.6
        k = torch.randint(0, 8, (4,), generator=g)
        got = select_topk(conf, eligible, k)
        for r in range(4):
            idx = [i for i in range(10) if eligible[r, i]]
            idx.sort(key=lambda i: (-float(conf[r, i]), i))  # ties -> lower index first
            want = set(idx[: int(k[r])])
            assert set(torch.nonzero(got[r]).flatten().tolist()) == want


def test_commits_never_leave_the_current_block():
    model = tiny_model()
    prompt = random_prompts(3, 5, model.config)
    gen, block, steps = 24, 8, 12
    out = generate(model, prompt, gen_length=gen, steps=steps, block_length=block)
    spb = steps // (gen // block)
    cs = out.commit_step  # (B, G)
    assert (cs >= 0).all()
    for b in range(gen // block):
        s = cs[:, b * block:(b + 1) * block]
        assert ((s >= b * spb) & (s < (b + 1) * spb)).all()
    # linear schedule: exactly block / spb tokens per step
    for step in range(steps):
        assert ((cs == step).sum(1) == block // spb).all()


def test_temperature_zero_deterministic_and_seeded_sampling():
    model = tiny_model()
    prompt = random_prompts(2, 6, model.config)
    a = generate(model, prompt, gen_length=8, steps=8, block_length=8)
    b = generate(model, prompt, gen_length=8, steps=8, block_length=8)
    assert torch.equal(a.sequences, b.sequences)
    s1 = generate(model, prompt, gen_length=8, steps=8, temperature=1.0, block_length=8,
                  generator=torch.Generator().manual_seed(3))
    s2 = generate(model, prompt, gen_length=8, steps=8, temperature=1.0, block_length=8,
                  generator=torch.Generator().manual_seed(3))
    s3 = generate(model, prompt, gen_length=8, steps=8, temperature=1.0, block_length=8,
                  generator=torch.Generator().manual_seed(4))
    assert torch.equal(s1.sequences, s2.sequences)
    assert not torch.equal(s1.sequences, s3.sequences)
    r = generate(model, prompt, gen_length=8, steps=8, block_length=8, remasking="random",
                 generator=torch.Generator().manual_seed(0))
    assert not (r.sequences == model.config.mask_token_id).any()


@pytest.mark.parametrize("cfg_scale", [0.0, 1.0])
def test_batch_with_left_padding_equals_single_rows(cfg_scale):
    model = tiny_model()
    lengths = [3, 7, 5]
    rows = [random_prompts(1, n, model.config, seed=n) for n in lengths]  # (1, n) each
    P = max(lengths)
    batch, am = left_pad([r[0].tolist() for r in rows], model.config.pad_token_id)  # (3, P) each
    kw = dict(gen_length=12, steps=6, block_length=4, cfg_scale=cfg_scale)
    out = generate(model, batch, attention_mask=am, **kw)
    for i, r in enumerate(rows):
        single = generate(model, r, **kw)
        assert torch.equal(out.sequences[i, P:], single.sequences[0, r.shape[1]:])


def test_eos_suppression_and_stats():
    model = tiny_model()
    eos = model.config.eos_token_id
    with torch.no_grad():
        model.lm_head.weight[eos] += 5.0  # make EOS attractive everywhere
    prompt = random_prompts(2, 5, model.config)
    plain = generate(model, prompt, gen_length=8, steps=8, block_length=8)
    assert (plain.sequences[:, 5:] == eos).any()
    assert (plain.stats.first_eos_step >= 0).all()
    first = (plain.sequences[:, 5:] == eos).float().argmax(-1) + 1
    assert torch.equal(plain.stats.tokens_until_eos, first)
    sup = generate(model, prompt, gen_length=8, steps=8, block_length=8, logits_eos_inf=True)
    assert not (sup.sequences[:, 5:] == eos).any()
    assert (sup.stats.first_eos_step == -1).all()
    assert (sup.stats.tokens_until_eos == 8).all()
    low = generate(model, prompt, gen_length=8, steps=8, block_length=8, confidence_eos_eot_inf=True)
    assert not (low.sequences == model.config.mask_token_id).any()


class _NoForward(torch.nn.Module):
    """Wraps a model and fails the test if a forward pass happens."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.config = model, model.config

    def forward(self, *a, **k):  # pragma: no cover - must not run
        raise AssertionError("forward ran before input validation")


@pytest.mark.parametrize("kwargs,match", [
    (dict(gen_length=10, block_length=4), "divisible by block_length"),
    (dict(gen_length=16, block_length=4, steps=6), "multiple of the number of blocks"),
    (dict(gen_length=16, block_length=4, steps=0), "steps"),
    (dict(gen_length=512, block_length=512), "max_seq_len"),
    (dict(remasking="greedy"), "remasking"),
    (dict(temperature=-1.0), "temperature"),
    (dict(cfg_scale=-1.0), "cfg_scale"),
    (dict(gen_length=8.0), "gen_length"),
])
def test_bad_input(kwargs, match):
    model = _NoForward(tiny_model())
    prompt = random_prompts(1, 4, model.config)
    base = dict(gen_length=16, steps=16, block_length=16)
    base.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        generate(model, prompt, **base)


def test_bad_prompts():
    model = _NoForward(tiny_model())
    cfg = model.config
    with pytest.raises(ValueError, match="empty prompt"):
        generate(model, torch.zeros(1, 0, dtype=torch.long), gen_length=8, steps=8, block_length=8)
    p = random_prompts(1, 4, cfg)
    p[0, 2] = cfg.mask_token_id
    with pytest.raises(ValueError, match="mask id"):
        generate(model, p, gen_length=8, steps=8, block_length=8)
    with pytest.raises(ValueError, match="attention_mask"):
        generate(model, random_prompts(2, 4, cfg), attention_mask=torch.ones(2, 5, dtype=torch.long),
                 gen_length=8, steps=8, block_length=8)
    with pytest.raises(ValueError, match="attention_mask"):
        generate(model, random_prompts(1, 4, cfg), attention_mask=torch.zeros(1, 4, dtype=torch.long),
                 gen_length=8, steps=8, block_length=8)
    with pytest.raises(TypeError, match="input_ids"):
        generate(model, [[5, 6]], gen_length=8, steps=8, block_length=8)


def test_tail_before_answer_matches_brute_force():
    """dlm.stats.tail_before_answer against a per-row loop: rows with the EOS at 0 (no answer) or
    with no EOS are NaN; never-committed (-1) tail positions do not count as early."""
    from dlm.stats import tail_before_answer

    g = torch.Generator().manual_seed(0)
    B, G, eos = 64, 12, 2
    ids = torch.randint(3, 9, (B, G), generator=g)
    first = torch.randint(0, G + 3, (B,), generator=g)  # >= G: no EOS in the row
    ids = torch.where(torch.arange(G)[None] >= first[:, None], eos, ids)
    ids[:, -1] = torch.where(torch.arange(B) % 5 == 0, 7, ids[:, -1])  # non-EOS after the EOS
    steps = torch.randint(-1, 30, (B, G), generator=g)
    got = tail_before_answer(ids, steps, eos)
    for b in range(B):
        row, cs = ids[b].tolist(), steps[b].tolist()
        if eos not in row or row.index(eos) == 0:
            assert got[b].isnan(), b
            continue
        k = row.index(eos)
        done = max(cs[:k])
        want = sum(0 <= c < done for c in cs[k:]) / (G - k)
        assert got[b].item() == pytest.approx(want), b
    assert tail_before_answer(ids, steps, None).isnan().all()
