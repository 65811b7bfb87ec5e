"""EB-Sampler (``methods/eb_sampler.py``) against a brute-force reference, and its registration
reaching the CLI, the sampler spec, lm-eval model_args and the grids by itself."""

from __future__ import annotations


import pytest
import torch

from dlm import registry
from dlm.spec import Sampler, generate
from experiments.cli.generate import parser
from harness.grids import sweep
from harness.sampler_flags import sampler_from_args, sampler_from_model_args
from methods.eb_sampler import EntropyBounded, select_entropy_bounded
from tiny import random_prompts, tiny_model


def ref_eb(neg_entropy: list[float], eligible: list[bool], gamma: float) -> set[int]:
    """Loops: eligible columns by entropy (ties: lower index first); the longest prefix with
    sum - max <= gamma, at least one."""
    order = sorted((j for j in range(len(eligible)) if eligible[j]), key=lambda j: (-neg_entropy[j], j))
    best = order[:1]
    for k in range(2, len(order) + 1):
        h = [max(-neg_entropy[j], 0.0) for j in order[:k]]
        if sum(h) - max(h) <= gamma:
            best = order[:k]
    return set(best)


@pytest.mark.parametrize("gamma", [0.0, 0.05, 0.3, 1.0, 5.0])
@pytest.mark.parametrize("seed", range(4))
def test_rule_equals_the_brute_force_reference(gamma, seed):
    g = torch.Generator().manual_seed(seed)
    levels = torch.tensor([-2.0, -0.5, -0.1, -0.02, 0.0], dtype=torch.float64)  # ties included
    conf = levels[torch.randint(0, 5, (6, 9), generator=g)]
    conf[1] = -torch.rand(9, generator=g, dtype=torch.float64)  # continuous row
    elig = torch.rand(6, 9, generator=g) < 0.7
    elig[2] = True
    elig[3] = False
    commit = select_entropy_bounded(conf, elig, gamma)
    for r in range(6):
        want = ref_eb(conf[r].tolist(), elig[r].tolist(), gamma) if elig[r].any() else set()
        assert set(torch.nonzero(commit[r]).flatten().tolist()) == want, (r, gamma)


def test_gamma_zero_is_one_column_per_step_and_a_large_gamma_decodes_a_block_in_one_step():
    model = tiny_model()
    ids = random_prompts(2, 5, model.config, seed=1)
    one = generate(model, ids, None, Sampler.of("eb0", rule="eb", gamma=0.0, gen_length=8, block_length=4))
    assert one.stats.steps == 8
    allat = generate(model, ids, None, Sampler.of("eb", rule="eb", gamma=1e6,
                                                   gen_length=8, block_length=4))
    assert allat.stats.steps == 2 and not (allat.sequences == model.config.mask_token_id).any()


def test_registered_and_reachable_from_every_front_door():
    assert registry.get("rule", "eb") is EntropyBounded
    args = parser().parse_args(["--rule", "eb", "--gamma", "0.5", "--policy", "dual"])
    assert sampler_from_args(args).option("gamma") == 0.5
    assert sampler_from_args(parser().parse_args(["--gamma", "0.5"])).rule == "eb"  # the rule whose option it is
    assert sampler_from_model_args("x", {"rule": "eb", "gamma": 0.2}).components("llada")[1] == EntropyBounded(0.2)
    assert {"sw_dual_g0p5", "sw_none_g0p1"} <= {s.name for s in sweep()}
    with pytest.raises(ValueError, match="gamma"):
        Sampler.of("bad", rule="eb", gamma=-1.0)
