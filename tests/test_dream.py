"""Dream's samplers against plain-loop transcriptions of the two references, token for token.

* :func:`ref_diffusion_generate` transcribes Dream's ``diffusion_generate`` / ``_sample``
  (``generation_utils.py``: every ``alg``, ``alg_temp``, ``eps``, temperature, ``top_p``, ``top_k``).
* :func:`ref_fastdllm_dream` transcribes Fast-dLLM's Dream block sampler (NVlabs/Fast-dLLM
  ``dream/model/generation_utils_block.py``: the full forward at a block start committing only the
  block's first column; prefix / dual cache steps recomputing the window from the block on;
  the threshold mode and the negative-entropy timestep mode), plus its rules with every step
  recomputed (``cache=None``), the reference of "uncached".

Both draw randomness from the global RNG where the references do (``Categorical(probs).sample()``,
``torch.rand``, ``torch.multinomial``); the library draws from a ``torch.Generator`` seeded the same
(the same mt19937 stream). Deviations: [MASK] is never proposed (the library's rule); the block
sampler draws only for columns it can commit (the reference also samples, then discards, every
column at a block start and the masked columns after the block: another random stream, the same
distribution); the network is the library's model (``shift_logits`` is the reference's
``cat([logits[:, :1], logits[:, :-1]])``; key padding is the part of its mask real columns read).
"""

import copy
import itertools

import pytest
import torch
import torch.distributions as dists
import torch.nn.functional as F

import fastdllm
from dlm.attention import key_padding_mask
from dlm.cache import KVCache
from dream.sampler import DreamProposal, DreamSchedule, generate as dream_generate, sample_tokens
from dlm.spec import Sampler, generate, resolve_family
from tiny import fastdllm_model, fastdllm_prompts, unpad

MASK = fastdllm_model(shift=True).config.mask_token_id


# ------------------------------------------------------------------------------ transcriptions
def ref_sample_tokens(logits, temperature=0.0, top_p=None, top_k=None, margin_confidence=False, neg_entropy=False):
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        sorted_logits, sorted_indices = torch.sort(logits, descending=True)
        cumulative_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
        remove = cumulative_probs > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = 0
        mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, sorted_indices, remove)
        logits = logits.masked_fill(mask, torch.finfo(logits.dtype).min)
    if top_k is not None:
        top_k = min(top_k, logits.size(-1))
        logits = logits.masked_fill(logits < torch.topk(logits, top_k)[0][..., -1, None], torch.finfo(logits.dtype).min)
    probs = torch.softmax(logits, dim=-1)
    if temperature > 0:
        try:
            x0 = dists.Categorical(probs=probs).sample()
            confidence = torch.gather(probs, -1, x0.unsqueeze(-1)).squeeze(-1)
        except Exception:
            confidence, x0 = probs.max(dim=-1)
    else:
        confidence, x0 = probs.max(dim=-1)
    if margin_confidence:
        sorted_probs, _ = torch.sort(probs, dim=-1, descending=True)
        confidence = sorted_probs[:, 0] - sorted_probs[:, 1]
    if neg_entropy:
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return confidence, x0


class Net:
    """The reference's ``self(x, attention_mask, tok_idx[, past_key_values])`` on the library's model."""

    def __init__(self, model, input_ids, attention_mask, gen):
        self.model = model
        self.x = F.pad(input_ids, (0, gen), value=MASK)
        if attention_mask is not None and bool((attention_mask == 0).any()):
            am = F.pad(attention_mask, (0, gen), value=1)
            self.tok_idx = am.long().cumsum(-1) - 1
            self.tok_idx.masked_fill_(am == 0, 1)
            self.attn = key_padding_mask(am)
        else:
            self.tok_idx, self.attn = torch.arange(self.x.shape[1]).expand_as(self.x), None

    def __call__(self, start=0, stop=None, cache=None, commit=False):
        stop = self.x.shape[1] if stop is None else stop
        kw = {} if cache is None else {"cache": cache, "start": start, "commit": commit}
        logits = self.model(self.x[:, start:stop], positions=self.tok_idx[:, start:stop], attn_mask=self.attn, **kw)
        logits[..., MASK] = -torch.inf  # deviation: [MASK] is never proposed
        return logits


def ref_transfer(x, mask_index, x0, full_confidence, n, alg_temp):
    """Both references' commit of ``n`` columns of ``x`` (a view, written in place): the top ``n``
    confidences, or ``n`` drawn from ``softmax(confidence / alg_temp)`` without replacement."""
    if n > 0:
        if alg_temp is None or alg_temp == 0:
            _, transfer_index = torch.topk(full_confidence, n)
        else:
            full_confidence = F.softmax(full_confidence / alg_temp, dim=-1)
            transfer_index = torch.multinomial(full_confidence, num_samples=n)
        x_ = torch.zeros_like(x, dtype=torch.long) + MASK
        x_[mask_index] = x0.clone()
        rows = torch.arange(x.size(0)).unsqueeze(1).expand_as(transfer_index)
        x[rows, transfer_index] = x_[rows, transfer_index]


def ref_diffusion_generate(model, input_ids, attention_mask, max_new_tokens, steps, alg, alg_temp=None,
                           eps=1e-3, temperature=0.0, top_p=None, top_k=None):
    net = Net(model, input_ids, attention_mask, max_new_tokens)
    x = net.x
    timesteps = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        mask_index = x == MASK
        logits = net()
        mask_logits = logits[mask_index]
        t, s = timesteps[i], timesteps[i + 1]
        if alg == "origin":
            p_transfer = 1 - s / t if i < steps - 1 else 1
            x0 = torch.zeros_like(x[mask_index], dtype=torch.long) + MASK
            transfer_index_t_s = torch.rand(*x0.shape) < p_transfer
            _, x0[transfer_index_t_s] = ref_sample_tokens(mask_logits[transfer_index_t_s], temperature, top_p, top_k)
            x[mask_index] = x0.clone()
            continue
        confidence, x0 = ref_sample_tokens(mask_logits, temperature, top_p, top_k,
                                           margin_confidence=alg == "topk_margin", neg_entropy=alg == "entropy")
        num_mask_token = mask_index.sum() / mask_index.shape[0]
        n = int(num_mask_token * (1 - s / t)) if i < steps - 1 else int(num_mask_token)
        full_confidence = torch.full_like(x, -torch.inf, dtype=logits.dtype)
        full_confidence[mask_index] = confidence
        ref_transfer(x, mask_index, x0, full_confidence, n, alg_temp)
    return x


def ref_fastdllm_dream(model, input_ids, attention_mask, gen_length, block_length, steps, threshold, cache,
                       temperature=0.0, top_p=None, top_k=None, eps=1e-3, alg_temp=None):
    net = Net(model, input_ids, attention_mask, gen_length)
    x, T, P = net.x, net.x.shape[1], input_ids.shape[1]
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks
    timesteps = torch.linspace(1, eps, steps_per_block + 1)
    sample = dict(temperature=temperature, top_p=top_p, top_k=top_k)
    for num_block in range(num_blocks):
        lo = P + num_block * block_length
        hi = lo + block_length
        kv = KVCache.for_model(model, x.shape[0], T)
        logits = net(cache=kv, commit=True)
        _, x0 = ref_sample_tokens(logits[:, lo], **sample)  # deviation: only the column it keeps
        x[:, lo] = x0
        if cache == "prefix":
            kv.truncate(lo)
        stop = hi if cache == "dual" else T
        i = 1
        while True:
            mask_index = x[:, lo:stop] == MASK
            logits = net()[:, lo:] if cache is None else net(lo, stop, kv)
            if threshold is not None:
                mask_index[:, block_length:] = False  # deviation: no draws for columns after the block
                confidence, x0 = ref_sample_tokens(logits[mask_index], **sample)
                x_ = torch.zeros_like(x[:, lo:stop]) + MASK
                full_confidence = torch.full_like(x[:, lo:stop], -torch.inf, dtype=logits.dtype)
                x_[mask_index] = x0.clone()
                full_confidence[mask_index] = confidence
                full_confidence[:, block_length:] = -torch.inf
                current_transfer_tokens = int((x[:, lo:hi] == MASK).sum())
                selected_confidence, select_index = torch.topk(full_confidence, current_transfer_tokens)
                transfer_index = torch.zeros_like(x_, dtype=torch.bool)
                transfer_index[0, select_index[0]] = True
                for k in range(1, current_transfer_tokens):
                    if selected_confidence[0, k] < threshold:
                        transfer_index[0, select_index[0, k]] = False
                x[:, lo:stop][transfer_index] = x_[transfer_index]
            else:
                if i == steps_per_block:
                    break
                t, s = timesteps[i], timesteps[i + 1]
                mask_index[:, block_length:] = False
                confidence, x0 = ref_sample_tokens(logits[mask_index], neg_entropy=True, **sample)
                num_mask_token = mask_index.sum() / mask_index.shape[0]
                n = int(num_mask_token * (1 - s / t)) if i < steps_per_block - 1 else int(num_mask_token)
                full_confidence = torch.full_like(x[:, lo:stop], -torch.inf, dtype=logits.dtype)
                full_confidence[mask_index] = confidence
                full_confidence[:, block_length:] = -torch.inf
                ref_transfer(x[:, lo:stop], mask_index, x0, full_confidence, n, alg_temp)
                i += 1
            if (x[:, lo:hi] == MASK).sum() == 0:
                break
    return x


def seeded(fn, seed, *args, **kw):
    torch.manual_seed(seed)
    return fn(*args, **kw)


def gen(seed):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------ Dream's sampler
def sharpened(model, scale):
    """A copy of ``model`` with its LM head scaled: confident enough that tau = 0.9 commits blocks in
    parallel (the memoized Fast-dLLM test model itself rarely reaches 0.9)."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


MODEL = sharpened(fastdllm_model(n_layers=2, shift=True), 3.0)
DREAM_CASES = [  # (alg, alg_temp, temperature, top_p, top_k, eps)
    ("origin", None, 0.0, None, None, 1e-3),
    ("origin", None, 1.0, None, None, 1e-3),
    ("origin", None, 0.7, 0.9, 20, 1e-2),
    ("maskgit_plus", None, 0.0, None, None, 1e-3),
    ("maskgit_plus", None, 1.0, 0.95, None, 1e-3),
    ("topk_margin", None, 0.0, None, None, 1e-3),
    ("topk_margin", 0.5, 0.8, None, 10, 0.05),
    ("entropy", None, 0.0, None, None, 1e-3),
    ("entropy", 1.0, 1.0, 0.9, 30, 1e-3),
    ("entropy", None, 0.5, None, None, 0.2),
]


@pytest.mark.parametrize("case", DREAM_CASES)
@pytest.mark.parametrize("padded", [False, True])
def test_dream_sampler_matches_reference(case, padded):
    alg, alg_temp, temperature, top_p, top_k, eps = case
    ids, am = fastdllm_prompts(padded=padded)
    for gen_len, steps in ((12, 12), (12, 5)):
        ref = seeded(ref_diffusion_generate, 7, MODEL, ids.clone(), am, gen_len, steps, alg, alg_temp, eps,
                     temperature, top_p, top_k)
        out = dream_generate(MODEL, ids, am, max_new_tokens=gen_len, steps=steps, alg=alg, alg_temp=alg_temp,
                             eps=eps, temperature=temperature, top_p=top_p, top_k=top_k, generator=gen(7))
        assert torch.equal(out.sequences, ref), (case, gen_len, steps)
        assert out.stats.nfe == steps


def test_dream_sampler_uses_its_options():
    """Each option changes the output somewhere (the equality above is not vacuous)."""
    ids, _ = fastdllm_prompts()
    base = dict(max_new_tokens=12, steps=6, alg="entropy")
    runs = {k: dream_generate(MODEL, ids, **{**base, **v}, generator=gen(3)).sequences for k, v in {
        "base": {}, "origin": {"alg": "origin"},
        "alg_temp": {"alg_temp": 1.0}, "temperature": {"temperature": 1.0},
        "top_k": {"temperature": 1.0, "top_k": 1}, "eps": {"eps": 0.5}}.items()}
    for k, v in runs.items():
        if k != "base":
            assert not torch.equal(v, runs["base"]), k
    assert not torch.equal(runs["top_k"], runs["temperature"])


# ------------------------------------------------------------------------------ Fast-dLLM's Dream rules
BLOCK_CASES = list(itertools.product(("prefix", "dual"), (0.5, 0.9, None)))  # without a cache: test_dream_nocache


@pytest.mark.parametrize("cache,threshold", BLOCK_CASES)
def test_fastdllm_dream_rules_match_reference_batch_one(cache, threshold):
    ids, _ = fastdllm_prompts()
    for row, (G, L, S) in itertools.product(range(3), ((12, 4, 12), (16, 8, 8), (8, 8, 4))):
        prompt = ids[row:row + 1]
        ref = ref_fastdllm_dream(MODEL, prompt.clone(), None, G, L, S, threshold, cache)
        out = fastdllm.generate(MODEL, prompt, gen_length=G, block_length=L, steps=S, cache=cache, threshold=threshold)
        assert torch.equal(out.sequences, ref), (row, G, L, S)


def test_thresholds_commit_several_columns_per_step():
    """The tiny model is confident enough that 0.5 and 0.9 both decode blocks in parallel."""
    ids, _ = fastdllm_prompts()
    for tau in (0.5, 0.9):
        out = fastdllm.generate(MODEL, ids, gen_length=16, block_length=8, cache="dual", threshold=tau)
        assert out.stats.steps < 16, tau


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_fastdllm_dream_sampled_matches_reference(cache):
    ids, _ = fastdllm_prompts()
    for threshold, kw in ((0.9, dict(temperature=1.0)), (None, dict(temperature=0.8, top_p=0.9, top_k=20)),
                          (None, dict(temperature=1.0, alg_temp=0.5)), (0.5, dict(temperature=0.7, top_k=5))):
        ref = seeded(ref_fastdllm_dream, 11, MODEL, ids[:1].clone(), None, 12, 4, 12, threshold, cache, **kw)
        out = fastdllm.generate(MODEL, ids[:1], gen_length=12, block_length=4, steps=12, cache=cache,
                                threshold=threshold, generator=gen(11), **kw)
        assert torch.equal(out.sequences, ref), (threshold, kw)


@pytest.mark.parametrize("cache,threshold", BLOCK_CASES)
def test_fastdllm_dream_padded_batch_rows_equal_reference(cache, threshold):
    """A left-padded batch: each row equals the reference on that prompt alone (the reference's
    threshold mode only runs batch 1); the scheduled mode also equals the batched reference."""
    ids, am = fastdllm_prompts(padded=True)
    out = fastdllm.generate(MODEL, ids, am, gen_length=12, block_length=4, steps=12, cache=cache, threshold=threshold)
    for r in range(3):
        p = unpad(ids, am, r)
        ref = ref_fastdllm_dream(MODEL, p.clone(), None, 12, 4, 12, threshold, cache)
        assert torch.equal(out.sequences[r, -ref.shape[1]:], ref[0]), r
    if threshold is None:
        ref = ref_fastdllm_dream(MODEL, ids.clone(), am, 12, 4, 12, None, cache)
        assert torch.equal(out.sequences, ref)


def test_batch_of_16_equals_16_runs_of_one():
    """Every Dream strategy (Fast-dLLM's Dream rules under each cache, Dream's own sampler):
    16 mixed-length left-padded prompts in one batch equal 16 batch-1 runs."""
    from tiny import left_pad

    g = torch.Generator().manual_seed(5)
    rows = [torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(2, 9, (16,), generator=g)]
    ids, am = left_pad(rows, MODEL.config.pad_token_id)
    strategies = [Sampler.of(f"s{i}", policy=cache, rule=rule, gen_length=12, block_length=4, threshold=t, factor=f)
                  for i, (cache, (rule, t, f)) in enumerate(itertools.product(
                      ("none", "prefix", "dual"), (("topk", None, None), ("threshold", 0.9, None),
                                                   ("factor", None, 1.0))))]
    strategies += [Sampler.of("own", rule="dream", gen_length=12, block_length=None, alg=a)
                   for a in ("entropy", "maskgit_plus")]
    for s in strategies:
        batch = generate(MODEL, ids, am, s).sequences
        for r, row in enumerate(rows):
            one = generate(MODEL, torch.tensor([row]), None, s).sequences[0]
            assert torch.equal(batch[r, -one.shape[0]:], one), (s.name, r)


# ------------------------------------------------------------------------------ which rules run
def test_auto_rules_follow_the_family_and_llada_rules_stay_reachable():
    ids, _ = fastdllm_prompts()
    kw = dict(gen_length=12, block_length=4, cache="dual", threshold=0.9)
    auto = fastdllm.generate(MODEL, ids, **kw)
    assert torch.equal(auto.sequences, fastdllm.generate(MODEL, ids, rules="dream", **kw).sequences)
    assert auto.stats.extra["rule"].endswith("first_column")
    llada = fastdllm.generate(MODEL, ids, rules="llada", **kw)
    assert llada.stats.extra["rule"] == "threshold=0.9"
    plain = fastdllm_model(n_layers=2)  # a LLaDA-family model: auto = the LLaDA rules
    assert fastdllm.generate(plain, ids, **kw).stats.extra["rule"] == "threshold=0.9"
    s = Sampler.of("t", policy="dual", rule="threshold", gen_length=12, block_length=4, threshold=0.9)
    assert torch.equal(generate(MODEL, ids, None, s).sequences, auto.sequences)
    assert resolve_family(s.family, MODEL.config) == "dream" and resolve_family(s.family, plain.config) == "llada"


def test_first_step_of_a_block_commits_only_its_first_column():
    ids, _ = fastdllm_prompts()
    steps = []
    fastdllm.generate(MODEL, ids, gen_length=8, block_length=4, cache="prefix", threshold=1e-9,
                      callback=lambda v: steps.append((v.step, v.commit.clone())))
    firsts = [c for i, c in steps if i == 0]
    assert len(firsts) == 2
    for c in firsts:
        assert c[:, 0].all() and not c[:, 1:].any()
    assert all(c[:, 1:].all() for i, c in steps if i == 1)  # tau ~ 0 commits the rest at once


# ------------------------------------------------------------------------------ pieces and bad input
def test_sample_tokens_margin_and_entropy_brute_force():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 9, generator=g, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    conf, x0 = sample_tokens(logits, 0.0, None, None, "margin", None)
    for r in range(5):
        a, b = sorted(p[r].tolist(), reverse=True)[:2]
        assert conf[r].item() == pytest.approx(a - b, abs=1e-15) and x0[r] == p[r].argmax()
    conf, _ = sample_tokens(logits, 0.0, None, None, "neg_entropy", None)
    assert torch.allclose(conf, (p * torch.log(p + 1e-10)).sum(-1))


@pytest.mark.parametrize("kwargs,exc,word", [
    ({"alg": "greedy"}, ValueError, "alg"),
    ({"alg_temp": -1.0}, ValueError, "alg_temp"),
    ({"alg_temp": float("nan")}, ValueError, "alg_temp"),
    ({"eps": 0.0}, ValueError, "eps"),
    ({"eps": 1.5}, ValueError, "eps"),
    ({"top_k": 0}, ValueError, "top_k"),
    ({"top_k": 2.5}, TypeError, "top_k"),
    ({"top_p": float("inf")}, ValueError, "top_p"),
    ({"temperature": -0.1}, ValueError, "temperature"),
    ({"steps": 0}, ValueError, "steps"),
    ({"alg": "origin", "alg_temp": 0.5}, ValueError, "alg_temp"),
])
def test_bad_dream_options_raise_before_any_forward(kwargs, exc, word):
    ids, _ = fastdllm_prompts()
    calls = []
    handle = MODEL.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(exc, match=word):
            dream_generate(MODEL, ids, **{"max_new_tokens": 8, "steps": 8, "alg": "entropy", **kwargs})
    finally:
        handle.remove()
    assert not calls


def test_dream_options_need_the_dream_rules():
    ids, _ = fastdllm_prompts()
    with pytest.raises(ValueError, match="top_k"):
        fastdllm.generate(fastdllm_model(), ids, gen_length=8, block_length=4, top_k=3, rules="llada")
    with pytest.raises(ValueError, match="remasking"):
        fastdllm.generate(MODEL, ids, gen_length=8, block_length=4, remasking="random")
    with pytest.raises(ValueError, match="family 'qwen'"):
        fastdllm.generate(MODEL, ids, gen_length=8, block_length=4, rules="qwen")
    with pytest.raises(ValueError, match="alg_temp"):
        Sampler.of("x", gen_length=8, block_length=4, alg_temp=0.5)
    with pytest.raises(ValueError, match="window"):
        DreamSchedule(4, window="left")
    with pytest.raises(ValueError, match="confidence"):
        DreamProposal(confidence="entropy")
