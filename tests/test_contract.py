"""The sampler contract, once for every registered cache policy and commit rule (:mod:`dlm.registry`).

Samplers (:class:`dlm.spec.Sampler`): policy x rule x stop_at_eos, every combination the registry
allows, read from it: the policies that are not block models on the tiny bidirectional models
(LLaDA layout and Dream's shifted logits), the block-model policies on the tiny LLaDA model used
block-causally, each with every registered rule at its ``probe`` values, with and without
``stop_at_eos``. A policy whose ``check`` refuses the block length or rule (``ar``: one column
per step, ``tests/test_ar.py``) is left out. A new rule or policy is in the grid by registering.

(a) a left-padded batch of N equals N batches of 1, token for token (rules that draw nothing at
    temperature 0);
(b) cached == uncached where a policy promises it (its ``same_as``: ``exact`` == ``block_causal``,
    ``prefix`` / ``dual`` / ``delayed`` with ``refresh_every=1`` == ``none``);
(c) a callback that only reads changes nothing;
(d) same seed, same tokens at temperature > 0; the generator is the only source of randomness;
(e) bad input raises ValueError / TypeError before any forward.

The models' EOS id is set to a token they often propose, so ``stop_at_eos`` really stops rows
(:func:`test_stop_at_eos_is_exercised` guards that precondition).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools

import pytest
import torch

import bd3lm
import fastdllm
from dlm import registry
from dlm.llada import generate
from dlm.spec import Sampler, generate as run
from tiny import tiny_config, unpad

G, L = 8, 4  # gen_length, block_length: two blocks
MASK = tiny_config().mask_token_id
EOS = 16  # a token the tiny models propose often, so stop_at_eos stops some rows and not others
RULES = registry.names("rule")
POLICIES = registry.names("policy")
RULE_NUMBERS = {r: {p.name: p.probe for p in registry.user_params(registry.get("rule", r)) if p.probe is not None}
                for r in RULES}


def _runs(policy: str, rule: str) -> bool:
    try:
        registry.get("policy", policy).check(L, rule)
    except ValueError:
        return False
    return True


def _is_block_model(policy: str) -> bool:
    return registry.get("policy", policy).block_model


GREEDY_RULES = tuple(r for r in RULES if not Sampler.of("g", rule=r, gen_length=G, block_length=L,
                                                         **RULE_NUMBERS[r]).components("llada")[1].random)
MODELS = {"llada": POLICIES, "dream": tuple(p for p in POLICIES if not _is_block_model(p))}  # Dream: no block model


def _cases(rules=RULES, caches=None, models=tuple(MODELS)):
    """pytest params (model, cache, rule, stop) for every allowed strategy."""
    out = []
    for model in models:
        allowed = MODELS[model]
        for cache, rule, stop in itertools.product(allowed, rules, (False, True)):
            if (caches is None or cache in caches) and _runs(cache, rule):
                name = f"{model}-{cache}-{rule}-{'eos' if stop else 'noeos'}"
                out.append(pytest.param(model, cache, rule, stop, id=name))
    return out


ALL = _cases()
LLADA = _cases(models=("llada",))  # (c), (d): Dream's window shift draws nothing and calls back the same way


class strategy:
    """``strategy(policy, rule, stop, **options).run(model, ids, am, ...)``: the sampler of a case."""

    def __init__(self, cache: str, rule: str, stop: bool, **kw) -> None:
        self.sampler = Sampler.of(f"{cache}_{rule}", policy=cache, rule=rule, gen_length=G,
                                  block_length=1 if cache == "ar" else L, stop_at_eos=stop,
                                  **{**RULE_NUMBERS[rule], **kw})

    def run(self, model, ids, am=None, **kw):
        return run(model, ids, am, self.sampler, **kw)


def with_eos(m):
    """``m`` with EOS = ``EOS`` (config only; the weights are unchanged)."""
    m.config = dataclasses.replace(m.config, eos_token_id=EOS)
    return m


@pytest.fixture
def model(request):
    """Indirect parameter: ``"llada"`` -> the conftest's ``tiny_model``, ``"dream"`` -> ``tiny_dream``,
    with EOS = ``EOS``."""
    return with_eos(request.getfixturevalue({"llada": "tiny_model", "dream": "tiny_dream"}[request.param]))


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def same_tokens(a, b) -> None:
    assert torch.equal(a.sequences, b.sequences)
    assert torch.equal(a.commit_step, b.commit_step)


def fill_after_eos(x: torch.Tensor, P: int) -> torch.Tensor:
    """(B, T) ``x`` with every answer column after a row's first EOS set to EOS (plain loops)."""
    out = x.clone()
    for r in range(x.shape[0]):
        row = x[r, P:].tolist()
        if EOS in row:
            out[r, P + row.index(EOS):] = EOS
    return out


@contextlib.contextmanager
def no_forward(model):
    """Fail the test if ``model`` runs a forward inside the block."""
    handle = model.register_forward_pre_hook(lambda *a: pytest.fail("a forward ran on bad input"))
    try:
        yield model
    finally:
        handle.remove()


def test_the_grid_covers_every_policy_and_rule():
    covered = {(c.values[1], c.values[2]) for c in ALL}
    assert {r for _, r in covered} == set(RULES)
    assert {p for p, _ in covered} == {p for p in POLICIES if any(_runs(p, r) for r in RULES)}
    assert {p for p in POLICIES if not any(_runs(p, r) for r in RULES)} <= {"ar"}  # ar: tests/test_ar.py
    n_runs = sum(_runs(p, r) for p in POLICIES for r in RULES)
    n_dream = sum(_runs(p, r) for p in MODELS["dream"] for r in RULES)
    assert len(ALL) == (n_runs + n_dream) * 2


def test_stop_at_eos_is_exercised(tiny_model, tiny_dream, prompts):
    """Precondition of the stop_at_eos cases: rows that stop in the first block next to rows
    that do not, under several strategies."""
    ids, am = prompts
    models = {"llada": with_eos(tiny_model), "dream": with_eos(tiny_dream)}
    mixed = 0
    for model, cache, rule, stop in (p.values for p in _cases(GREEDY_RULES)):
        if stop:
            t = strategy(cache, rule, stop).run(models[model], ids, am).stats.tokens_until_eos  # (B,)
            mixed += bool((t <= L).any() and (t == G).any())
    assert mixed >= 10


@pytest.mark.parametrize("cache", ["none", "exact"])
@pytest.mark.parametrize("rule", ["threshold", "factor"])
def test_parallel_rules_are_exercised(tiny_model, prompts, cache, rule):
    """Precondition: with these numbers the parallel rules commit several columns in some steps."""
    out = strategy(cache, rule, False).run(tiny_model, *prompts)
    assert out.stats.steps < G


# ------------------------------------------------------------------------------ (a) batching
@pytest.mark.parametrize("model,cache,rule,stop", _cases(GREEDY_RULES), indirect=["model"])
def test_batch_equals_rows_alone(model, prompts, cache, rule, stop):
    ids, am = prompts  # (3, P) left padded
    s, P = strategy(cache, rule, stop), ids.shape[1]
    batch = s.run(model, ids, am)
    for r in range(ids.shape[0]):
        real = unpad(ids, am, r)  # (1, P_r)
        alone = s.run(model, real)
        assert torch.equal(batch.sequences[r, P:], alone.sequences[0, real.shape[1]:]), r
        if rule == "topk":  # fixed schedule: the same step numbers too
            assert torch.equal(batch.commit_step[r], alone.commit_step[0]), r


# ------------------------------------------------------------------------------ (b) cached == uncached
SAME_AS = {p: registry.get("policy", p).same_as for p in POLICIES if registry.get("policy", p).same_as}


def _reference(model, cache: str) -> tuple[str, dict]:
    """The policy (and its options) ``cache`` must equal. Under Fast-dLLM's Dream rules no cache
    is Fast-dLLM's *other* sampler (``generation_utils.py``, without the first-column step:
    tests/test_dream_nocache.py), so there a cache is compared with the block sampler recomputing
    everything at every step: the dual cache (the prefix cache for the dual one) refreshed each step."""
    reference, _ = SAME_AS[cache]
    if model.config.shift_logits and reference == "none":
        return ("prefix" if cache == "dual" else "dual"), {"refresh_every": 1}
    return reference, {}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("model,cache,rule,stop", _cases(caches=tuple(SAME_AS)), indirect=["model"])
def test_cached_equals_uncached(model, prompts, cache, rule, stop, temperature):
    ids, am = prompts
    options = SAME_AS[cache][1]
    reference, ref_options = _reference(model, cache)
    cached = strategy(cache, rule, stop, temperature=temperature, **dict(options)).run(model, ids, am,
                                                                                       generator=seeded(3))
    ref = strategy(reference, rule, stop, temperature=temperature, **ref_options).run(model, ids, am,
                                                                                      generator=seeded(3))
    same_tokens(cached, ref)
    assert cached.stats.steps == ref.stats.steps
    assert not (cached.sequences == MASK).any()
    if not options:  # the cache itself is exact: it saves work
        assert cached.stats.positions_computed < ref.stats.positions_computed


def test_the_exactness_promises_cover_the_papers_caches():
    assert {"prefix", "dual", "delayed", "exact"} <= set(SAME_AS)


# ------------------------------------------------------------------------------ (c) read-only callback
@pytest.mark.parametrize("model,cache,rule,stop", LLADA, indirect=["model"])
def test_reading_callback_changes_nothing(model, prompts, cache, rule, stop):
    ids, am = prompts
    s = strategy(cache, rule, stop)
    seen = []

    def read(v) -> None:  # touches every field of the StepView, keeps copies only
        seen.append((v.block, v.step, v.global_step, v.lo, v.hi, v.full, v.x.clone(), float(v.logits.sum()),
                     v.commit.clone(), None if v.cache is None else v.cache.length))

    plain = s.run(model, ids, am, generator=seeded(1))
    watched = s.run(model, ids, am, generator=seeded(1), callback=read)
    same_tokens(watched, plain)
    assert watched.stats.nfe == plain.stats.nfe
    assert len(seen) == plain.stats.steps > 0
    assert [v[2] for v in seen] == list(range(len(seen)))  # global_step counts every step
    last = seen[-1][6]  # (B, T) x after the last step
    assert torch.equal(fill_after_eos(last, ids.shape[1]) if stop else last, plain.sequences)


# ------------------------------------------------------------------------------ (d) seeded randomness
@pytest.mark.parametrize("model,cache,rule,stop", LLADA, indirect=["model"])
def test_same_seed_same_tokens_and_only_the_generator_is_random(model, prompts, cache, rule, stop):
    ids, am = prompts
    s = strategy(cache, rule, stop, temperature=1.0)
    torch.manual_seed(0)
    global_state = torch.get_rng_state()
    a = s.run(model, ids, am, generator=seeded(7))
    assert torch.equal(torch.get_rng_state(), global_state), "the global RNG was drawn from"
    torch.manual_seed(12345)  # another global state changes nothing
    b = s.run(model, ids, am, generator=seeded(7))
    c = s.run(model, ids, am, generator=seeded(8))
    same_tokens(a, b)
    assert not torch.equal(a.sequences, c.sequences)


# ------------------------------------------------------------------------------ (e) bad input
@pytest.mark.parametrize("cache", tuple(POLICIES))
@pytest.mark.parametrize("bad,exc,word", [
    (lambda ids, am: (ids.double(), am), TypeError, "input_ids"),  # float ids
    (lambda ids, am: (ids[None], None), ValueError, "input_ids"),  # (1, B, P)
    (lambda ids, am: (ids.masked_fill(am.bool() & (torch.arange(ids.shape[1]) == 3), MASK), am), ValueError,
     "mask id"),  # column 3 is a real token in every row
    (lambda ids, am: (ids, am[:, 1:]), ValueError, "attention_mask"),  # (B, P - 1)
    (lambda ids, am: (ids, torch.zeros_like(am)), ValueError, "attention_mask"),  # no real token
], ids=["float-ids", "3d-ids", "mask-in-prompt", "mask-shape", "empty-row"])
def test_bad_input_raises_before_any_forward(tiny_model, prompts, cache, bad, exc, word):
    ids, am = bad(*prompts)
    with no_forward(tiny_model), pytest.raises(exc, match=word):
        strategy(cache, "topk", False).run(tiny_model, ids, am)


@pytest.mark.parametrize("cache", ["none", "exact"])
@pytest.mark.parametrize("ids", [torch.tensor([5, 6, 7]), [[5, 6, 7]]], ids=["1d-tensor", "list"])
def test_strategy_run_refuses_non_matrix_input_ids(tiny_model, cache, ids):
    with no_forward(tiny_model), pytest.raises((TypeError, ValueError), match="input_ids"):
        strategy(cache, "topk", False).run(tiny_model, ids)


@pytest.mark.parametrize("kwargs,word", [
    (dict(gen_length=10, block_length=4), "divisible"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(rule="threshold", threshold=1.5), "threshold"),
    (dict(rule="threshold", threshold=0.0), "threshold"),
    (dict(rule="threshold", threshold=float("nan")), "threshold"),
    (dict(rule="factor", factor=-1.0), "factor"),
    (dict(steps=3), "steps"),  # not a multiple of the 2 blocks
])
@pytest.mark.parametrize("cache", tuple(POLICIES))
def test_bad_strategy_numbers_raise_at_construction(cache, kwargs, word):
    base = dict(policy=cache, rule="topk", gen_length=G, block_length=1 if cache == "ar" else L)
    with pytest.raises(ValueError, match=word):
        Sampler.of("bad", **{**base, **kwargs})


ENTRIES = {  # the thin entries with the same bad numbers
    "llada": lambda m, ids, **kw: generate(m, ids, **{"gen_length": G, "block_length": L, "steps": G, **kw}),
    "fastdllm": lambda m, ids, **kw: fastdllm.generate(m, ids, **{"gen_length": G, "block_length": L, **kw}),
    "bd3lm": lambda m, ids, **kw: bd3lm.sample(m, ids, **{"gen_length": G, "block_size": L, **kw}),
}


@pytest.mark.parametrize("entry,kwargs,word", [
    ("llada", dict(gen_length=10), "divisible"),
    ("llada", dict(temperature=float("nan")), "temperature"),
    ("fastdllm", dict(gen_length=10), "divisible"),
    ("fastdllm", dict(temperature=float("nan")), "temperature"),
    ("fastdllm", dict(threshold=1.5), "threshold"),
    ("fastdllm", dict(threshold=float("nan")), "threshold"),
    ("bd3lm", dict(gen_length=10), "divide"),
    ("bd3lm", dict(temperature=float("nan")), "temperature"),
    ("bd3lm", dict(mode="threshold", threshold=1.5), "threshold"),
])
def test_thin_entries_refuse_bad_numbers_before_any_forward(tiny_model, prompts, entry, kwargs, word):
    ids, _ = prompts
    with no_forward(tiny_model), pytest.raises(ValueError, match=word):
        ENTRIES[entry](tiny_model, ids, **kwargs)
