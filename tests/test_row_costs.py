"""Per-row cost accounting: a row's NFE, steps, positions, FLOPs and committed tokens are the
same whether it runs alone or in a left-padded batch (every greedy strategy), and they add up to
what the batch computed when no row is padded or finished early."""

from __future__ import annotations

import pytest
import torch

from dlm.spec import Sampler, generate
from dlm.stats import forward_flops
from test_contract import GREEDY_RULES, _cases, model, strategy, with_eos  # noqa: F401  (model: fixture)
from tiny import unpad


def sampler(policy: str, rule: str, stop: bool) -> Sampler:
    """The contract's sampler of a case (:func:`test_contract.strategy`)."""
    return strategy(policy, rule, stop).sampler


ROW_FIELDS = ("row_nfe", "row_steps", "row_positions", "row_flops", "row_tokens")


@pytest.mark.parametrize("model,cache,rule,stop", _cases(GREEDY_RULES), indirect=["model"])
def test_row_costs_do_not_depend_on_the_batch(model, prompts, cache, rule, stop):
    ids, am = prompts  # (3, P) left padded, rows of 5, 3, 4 real tokens
    s = sampler(cache, rule, stop)
    batch = generate(model, ids, am, s).stats
    for r in range(ids.shape[0]):
        alone = generate(model, unpad(ids, am, r), None, s).stats
        for f in ROW_FIELDS:
            assert int(getattr(batch, f)[r]) == int(getattr(alone, f)[0]), (f, r)
        assert int(alone.row_nfe[0]) == alone.nfe  # a batch of one: the row's costs are the batch's
        assert int(alone.row_positions[0]) == alone.positions_computed
        assert int(alone.row_flops[0]) == alone.extra["flops"]


def test_row_costs_of_the_baseline_by_hand(tiny_model, prompts):
    """LLaDA's baseline, no padding: every row pays every forward over its real columns."""
    ids, am = prompts
    ids = ids[:1, -5:]  # the 5-token row alone, no padding
    s = sampler("none", "topk", False)
    st = generate(tiny_model, ids, None, s).stats
    G, T, cfg = s.gen_length, 5 + s.gen_length, tiny_model.config
    assert st.row_nfe.tolist() == [G] and st.row_steps.tolist() == [G] and st.row_tokens.tolist() == [G]
    assert st.row_positions.tolist() == [G * T]
    per_block = forward_flops(cfg.num_params(include_embeddings=False), cfg.n_layers, cfg.d_model, T, T,
                              cfg.vocab_size, s.block)
    assert st.row_flops.tolist() == [G * per_block]


def test_finished_rows_stop_counting(tiny_model, prompts):
    """With stop_at_eos a row that finished in the first block pays nothing for the second."""
    model = with_eos(tiny_model)
    ids, am = prompts
    st = generate(model, ids, am, sampler("dual", "topk", True)).stats
    first = st.tokens_until_eos <= 4  # rows whose EOS is in the first block of 4
    assert bool(first.any()) and bool((~first).any())
    assert torch.equal(st.row_tokens[first], torch.full_like(st.row_tokens[first], 4))
    assert bool((st.row_nfe[first] < st.row_nfe[~first].min()).all())
