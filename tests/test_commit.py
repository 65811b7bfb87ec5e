"""The commit rules of the three papers (LLaDA's ``topk``, Fast-dLLM's ``threshold`` / ``factor``,
BD3-LM's ``first_hitting`` / ``ancestral``) against brute-force references written with plain
Python loops.

Every one of them is driven through the :class:`dlm.commit.CommitRule` interface exactly as
the one loop (:func:`dlm.sample.denoise`) drives it: ``block_steps`` -> ``begin`` -> ``select`` per
step, with fresh confidences each step and committed columns leaving the eligible set. The random
rules (first_hitting, ancestral) are replayed from a copy of the generator, so their references
are exact too. Also: the linear schedule, :func:`propose` / :func:`top_p_filter` on small cases,
and bad numbers raising ValueError / TypeError that name the argument.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import pytest
import torch

from bd3lm.rules import Ancestral, FirstHitting
from dlm import registry
from dlm.commit import Proposal, num_transfer_tokens, propose, select_topk, top_p_filter
from dlm.llada import TopK
from fastdllm.rules import Factor, Threshold, select_factor, select_threshold

PAPER_RULES = {"topk": TopK, "threshold": Threshold, "factor": Factor, "first_hitting": FirstHitting,
               "ancestral": Ancestral}


def make_rule(name: str, steps: int, **numbers):
    return registry.build("rule", name, numbers, {"steps_per_block": steps})

B, L = 6, 10  # rows, block width
SEEDS = range(4)
NEG_INF = float("-inf")
#: confidence levels with many exact ties; -inf is what ``eos_last`` gives EOS proposals
LEVELS = torch.tensor([NEG_INF, 0.05, 0.25, 0.5, 0.75, 0.9, 1.0], dtype=torch.float64)


def random_conf(g: torch.Generator) -> torch.Tensor:
    """(B, L) float64: rows 0, 2..5 drawn from ``LEVELS`` (ties), row 1 continuous."""
    conf = LEVELS[torch.randint(0, len(LEVELS), (B, L), generator=g)]
    conf[1] = torch.rand(L, generator=g, dtype=torch.float64)
    return conf


def random_eligible(g: torch.Generator) -> torch.Tensor:
    """(B, L) bool: row 2 nothing eligible, row 3 everything, row 4 one column, others random."""
    elig = torch.rand(B, L, generator=g) < 0.6
    elig[2] = False
    elig[3] = True
    elig[4] = False
    elig[4, int(torch.randint(0, L, (1,), generator=g))] = True
    return elig


def cols(row: torch.Tensor) -> set[int]:
    """Column indices of the True entries of a (L,) bool row."""
    return set(torch.nonzero(row).flatten().tolist())


# ------------------------------------------------------------------------------ references
def order(conf: list[float], elig: list[bool]) -> list[int]:
    """Eligible columns, most confident first, ties by lower index."""
    idx = [j for j in range(len(conf)) if elig[j]]
    return sorted(idx, key=lambda j: (-conf[j], j))


def ref_topk(conf, elig, k: int) -> set[int]:
    return set(order(conf, elig)[:k])


def ref_threshold(conf, elig, tau: float) -> set[int]:
    o = order(conf, elig)
    return set(o[:1]) | {j for j in o if conf[j] >= tau}


def ref_factor(conf, elig, f: float) -> set[int]:
    o = order(conf, elig)
    best = 1
    for n in range(1, len(o) + 1):
        if (n + 1) * (1 - conf[o[n - 1]]) < f:
            best = n
    return set(o[:best])


def ref_schedule(n: int, steps: int) -> list[int]:
    return [n // steps + (1 if i < n % steps else 0) for i in range(steps)]


def replay(g: torch.Generator) -> torch.Generator:
    """A copy of ``g`` at its current state (to redraw what the rule is about to draw)."""
    copy = torch.Generator()
    copy.set_state(g.get_state())
    return copy


def expected_commit(rule, conf, elig, i, state, g, start_counts) -> tuple[list[set[int]], list[float] | None]:
    """Per-row expected commits of step ``i`` (and first_hitting's expected times), by loops."""
    c, e = conf.tolist(), elig.tolist()
    if isinstance(rule, TopK):
        return [ref_topk(c[r], e[r], ref_schedule(start_counts[r], rule.steps)[i]) for r in range(B)], None
    if isinstance(rule, Threshold):
        return [ref_threshold(c[r], e[r], rule.threshold) for r in range(B)], None
    if isinstance(rule, Factor):
        return [ref_factor(c[r], e[r], rule.factor) for r in range(B)], None
    if isinstance(rule, FirstHitting):
        u = torch.rand(B, generator=replay(g), dtype=torch.float64).tolist()
        t = state.tolist()
        times = [t[r] * u[r] ** (1.0 / sum(e[r])) if any(e[r]) else t[r] for r in range(B)]
        return [ref_topk(c[r], e[r], 1) for r in range(B)], times
    if isinstance(rule, Ancestral):
        u = torch.rand(B, L, generator=replay(g), dtype=torch.float64).tolist()
        p = 1.0 / (rule.steps - i)
        return [{j for j in range(L) if e[r][j] and u[r][j] < p} for r in range(B)], None
    raise AssertionError(f"no reference for rule {rule!r}")


# ------------------------------------------------------------------------------ one block, all rules
RULE_CASES = [
    TopK(1), TopK(3), TopK(10), TopK(13),
    Threshold(0.25), Threshold(0.5), Threshold(0.9), Threshold(1.0),
    Factor(0.5), Factor(1.0), Factor(2.0), Factor(5.0),
    FirstHitting(),
    Ancestral(1), Ancestral(3), Ancestral(10),
]


def rule_id(rule) -> str:
    return f"{rule.name}-{rule.steps}" if hasattr(rule, "steps") else rule.label


def test_every_rule_of_the_papers_has_a_reference_and_is_registered():
    assert {type(r) for r in RULE_CASES} == set(PAPER_RULES.values())
    assert {n: registry.get("rule", n) for n in PAPER_RULES} == PAPER_RULES


class Step(NamedTuple):
    i: int
    elig: torch.Tensor  # (B, L) bool, eligible before the step
    commit: torch.Tensor  # (B, L) bool, the rule's choice
    state: object  # the rule's state after the step
    want: list  # per row, the expected committed columns (set)
    times: Optional[list]  # first_hitting: per row, the expected hitting time


def run_block(rule, seed: int):
    """Drive ``rule`` over one block of random (B, L) inputs as the one loop does; yields a
    :class:`Step` per step."""
    g_in = torch.Generator().manual_seed(seed)  # inputs
    g = torch.Generator().manual_seed(100 + seed)  # the rule's own draws
    elig = random_eligible(g_in)
    start_counts = elig.sum(-1).tolist()
    n_steps = rule.block_steps(L)
    state = rule.begin(elig, n_steps)
    i = 0
    while (i < n_steps) if n_steps is not None else bool(elig.any()):
        conf = random_conf(g_in)
        want, times = expected_commit(rule, conf, elig, i, state, g, start_counts)
        commit, state = rule.select(conf, elig, i, state, g)  # (B, L) bool
        yield Step(i, elig.clone(), commit, state, want, times)
        elig = elig & ~commit
        i += 1
        assert n_steps is not None or i <= L, "a dynamic rule made no progress"
    assert not elig.any(), "the block ended with eligible columns left"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("rule", RULE_CASES, ids=rule_id)
def test_rule_matches_brute_force(rule, seed):
    for st in run_block(rule, seed):
        for r in range(B):
            assert cols(st.commit[r]) == st.want[r], (st.i, r)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("rule", RULE_CASES, ids=rule_id)
def test_rule_never_commits_ineligible_columns(rule, seed):
    for st in run_block(rule, seed):
        assert st.commit.dtype == torch.bool and st.commit.shape == (B, L)
        assert not (st.commit & ~st.elig).any(), st.i
        assert not st.commit[2].any(), "row 2 has nothing eligible"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("rule", [r for r in RULE_CASES if isinstance(r, (Threshold, Factor, FirstHitting))],
                         ids=rule_id)
def test_dynamic_rules_commit_at_least_one_column_per_unclean_row(rule, seed):
    """threshold, factor and first-hitting make progress every step (the loop relies on it)."""
    for st in run_block(rule, seed):
        for r in range(B):
            assert bool(st.commit[r].any()) == bool(st.elig[r].any()), (st.i, r)


@pytest.mark.parametrize("seed", SEEDS)
def test_first_hitting_one_column_per_row_and_hitting_times(seed):
    rule = FirstHitting()
    assert rule.confidence == "random" and rule.records_time and rule.block_steps(L) == L
    prev = [1.0] * B
    for st in run_block(rule, seed):
        got = rule.commit_time(st.state).tolist()  # (B,)
        for r in range(B):
            assert int(st.commit[r].sum()) == (1 if st.elig[r].any() else 0), (st.i, r)
            assert got[r] == pytest.approx(st.times[r], rel=1e-12), (st.i, r)
            assert 0.0 < got[r] <= prev[r]  # the hitting time only decreases
        prev = got


def test_first_hitting_time_is_float64_exact():
    for st in run_block(FirstHitting(), seed=0):
        assert FirstHitting().commit_time(st.state).tolist() == pytest.approx(st.times, rel=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("steps", [1, 3, 10])
def test_ancestral_commits_everything_left_at_the_last_step(steps, seed):
    *_, last = run_block(Ancestral(steps), seed)
    assert last.i == steps - 1
    assert torch.equal(last.commit, last.elig)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("steps", [1, 3, 4, 10, 13])
def test_topk_schedule_commits_the_counts_of_num_transfer_tokens(steps, seed):
    per_step = [st.commit.sum(-1).tolist() for st in run_block(TopK(steps), seed)]  # steps x (B,)
    g_in = torch.Generator().manual_seed(seed)
    counts = random_eligible(g_in).sum(-1).tolist()  # (B,) eligible at the block start
    for r in range(B):
        assert [s[r] for s in per_step] == ref_schedule(counts[r], steps), r


# ------------------------------------------------------------------------------ pure functions
@pytest.mark.parametrize("seed", SEEDS)
def test_select_functions_match_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    conf, elig = random_conf(g), random_eligible(g)  # (B, L) each
    k = torch.randint(0, L + 2, (B,), generator=g)  # (B,) some k above the eligible count
    c, e = conf.tolist(), elig.tolist()
    topk, thr, fac = select_topk(conf, elig, k), select_threshold(conf, elig, 0.5), select_factor(conf, elig, 1.5)
    for r in range(B):
        assert cols(topk[r]) == ref_topk(c[r], e[r], int(k[r])), r
        assert cols(thr[r]) == ref_threshold(c[r], e[r], 0.5), r
        assert cols(fac[r]) == ref_factor(c[r], e[r], 1.5), r


@pytest.mark.parametrize("steps", [1, 2, 3, 7, 16])
def test_num_transfer_tokens_sums_to_the_mask_count(steps):
    counts = torch.tensor([0, 1, 2, 5, 7, 16, 17, 100])  # (B,)
    sched = num_transfer_tokens(counts, steps)  # (B, steps)
    assert sched.shape == (len(counts), steps) and sched.dtype == torch.long
    assert torch.equal(sched.sum(-1), counts)
    for row, n in zip(sched.tolist(), counts.tolist()):
        assert row == ref_schedule(n, steps)


def test_propose_greedy_is_argmax_without_excluded_ids_with_its_probability():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g, dtype=torch.float64)  # (B, T, V)
    logits[0, 0, 3] = 50.0  # excluded id would win
    x0, conf = propose(logits, 0.0, "low_confidence", None, exclude=(3,))  # (B, T) each
    for b in range(2):
        for t in range(5):
            row = logits[b, t].tolist()
            best = max((v, -j) for j, v in enumerate(row) if j != 3)
            j = -best[1]
            z = sum(math.exp(v) for i, v in enumerate(row) if i != 3)
            assert int(x0[b, t]) == j
            assert float(conf[b, t]) == pytest.approx(math.exp(row[j]) / z, rel=1e-12)


def test_propose_float32_confidence_is_the_float64_softmax_and_leaves_logits_intact():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 16, 4000, generator=g) * 4  # (B, T, V) float32, as a model returns
    logits[0, :4, 7] = 40.0  # the excluded id would win these columns
    logits[1, 2, 5] = logits[1, 2, 9] = 60.0  # a tie: the first maximum wins, as argmax
    before = logits.clone()
    x0, conf = propose(logits, 0.0, "low_confidence", None, exclude=(7,))
    assert torch.equal(logits, before)  # the temporary -inf of the excluded ids is undone
    ref = logits.double().index_fill(-1, torch.tensor([7]), float("-inf"))
    assert torch.equal(x0, ref.argmax(-1)) and int(x0[1, 2]) == 5 and not (x0 == 7).any()
    want = torch.softmax(ref, -1).gather(-1, x0[..., None]).squeeze(-1)  # the references' float64 softmax
    assert conf.dtype == torch.float64
    assert ((conf - want).abs() / want).max() < 1e-7
    sampled, conf_t = propose(logits, 0.7, "low_confidence", torch.Generator().manual_seed(0), exclude=(7,))
    want_t = torch.softmax(ref, -1).gather(-1, sampled[..., None]).squeeze(-1)  # not the argmax: m != l[x0]
    assert not torch.equal(sampled, x0) and ((conf_t - want_t).abs() / want_t).max() < 1e-7


def test_top_p_filter_keeps_the_smallest_nucleus():
    g = torch.Generator().manual_seed(1)
    logp = torch.log_softmax(torch.randn(4, 9, generator=g, dtype=torch.float64), -1)  # (B, V)
    for p in (0.05, 0.3, 0.7, 0.99, 1.0):
        kept = torch.isfinite(top_p_filter(logp, p))  # (B, V)
        for b in range(4):
            probs = logp[b].exp().tolist()
            ranked = sorted(range(9), key=lambda j: -probs[j])
            want, mass = set(), 0.0
            for j in ranked:
                if mass >= p:
                    break
                want.add(j)
                mass += probs[j]
            assert cols(kept[b]) == want, (p, b)


# ------------------------------------------------------------------------------ bad numbers
NAN, INF = float("nan"), float("inf")
BAD_NUMBERS = [
    *[(Threshold, "threshold", v) for v in (NAN, INF, -0.5, 0.0, 1.5, True, "0.9", None)],
    *[(Factor, "factor", v) for v in (NAN, INF, -1.0, 0.0, True, "1.0", None)],
    *[(TopK, "steps", v) for v in (NAN, INF, -1, 0, True, 2.0, "3", None)],
    *[(Ancestral, "steps", v) for v in (NAN, INF, -1, 0, True, 2.0, "3", None)],
    *[(lambda v: Proposal(temperature=v), "temperature", v) for v in (NAN, INF, -1.0, True, "1.0", None)],
    *[(lambda v: Proposal(top_p=v), "top_p", v) for v in (NAN, INF, -0.1, 0.0, 1.5, True, "0.9")],
    *[(lambda v: make_rule("threshold", 4, threshold=v), "threshold", v) for v in (NAN, 1.5, True)],
    *[(lambda v: make_rule("factor", 4, factor=v), "factor", v) for v in (NAN, -1.0, "2")],
    *[(lambda v: make_rule("topk", v), "steps", v) for v in (0, 2.5, True)],
    *[(lambda v: num_transfer_tokens(torch.tensor([4, 5]), v), "steps", v) for v in (0, -3)],
]


@pytest.mark.parametrize("make,name,value", BAD_NUMBERS,
                         ids=[f"{n}={v!r}-{i}" for i, (_, n, v) in enumerate(BAD_NUMBERS)])
def test_bad_numbers_raise_naming_the_argument(make, name, value):
    with pytest.raises((ValueError, TypeError), match=rf"\b{name}\b"):
        make(value)


@pytest.mark.parametrize("steps", [2.5, True, NAN, INF, "3"])
def test_num_transfer_tokens_validates_steps(steps):
    with pytest.raises((ValueError, TypeError), match=r"\bsteps\b"):
        num_transfer_tokens(torch.tensor([3, 7]), steps)


def test_the_registry_refuses_unknown_names_and_foreign_options():
    with pytest.raises(ValueError, match="rule 'greedy'"):
        make_rule("greedy", 4)
    with pytest.raises(ValueError, match="threshold"):
        make_rule("topk", 4, threshold=0.9)
    with pytest.raises(ValueError, match="factor"):
        make_rule("threshold", 4, factor=1.0)


def test_the_registry_builds_each_rule_with_its_number():
    assert make_rule("topk", 4) == TopK(4)
    assert make_rule("ancestral", 4) == Ancestral(4)
    assert make_rule("threshold", 4, threshold=0.7) == Threshold(0.7)
    assert make_rule("factor", 4, factor=2.0) == Factor(2.0)
    assert make_rule("first_hitting", 4) == FirstHitting()
    assert {type(make_rule(n, 4)) for n in PAPER_RULES} == set(PAPER_RULES.values())


def test_neg_entropy_confidence_is_minus_the_entropy_of_the_proposal_distribution():
    """``propose(..., "neg_entropy")``: sum_v p_v log p_v over the ids not excluded, by loops."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 3, 7, generator=g)
    x0, conf = propose(logits, 0.0, "neg_entropy", None, (6,))
    for b in range(2):
        for t in range(3):
            row = logits[b, t, :6].double()
            z = sum(math.exp(v) for v in row.tolist())
            want = sum((math.exp(v) / z) * (v - math.log(z)) for v in row.tolist())
            assert conf[b, t].item() == pytest.approx(want, rel=1e-12)
            assert x0[b, t].item() == int(row.argmax())


def test_a_sampler_records_one_spec_however_it_is_built():
    """Built directly, with a dict, a default-valued or an unset option: the same spec and hash as ``of``."""
    from dlm.spec import Sampler
    from harness.results import config_hash

    want = Sampler.of("s", policy="dual", rule="threshold", threshold=0.8)
    default = registry.get("rule", "threshold")().threshold
    for built in (Sampler("s", "dual", "threshold", options=(("threshold", 0.8),)),
                  Sampler("s", "dual", "threshold", options={"threshold": 0.8, "temperature": None}),
                  Sampler("s", "dual", "threshold", options=(("threshold", 0.8), ("temperature", 0.0)))):
        assert built == want and config_hash(built.as_dict()) == config_hash(want.as_dict())
    assert Sampler("s", "dual", "threshold", options={"threshold": default}).options == ()
    with pytest.raises(ValueError, match="sampler s: 'thresh' is no registered option"):
        Sampler("s", "dual", "threshold", options={"thresh": 0.8})
