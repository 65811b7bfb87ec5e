"""Batches of similar prompt length (tasks.evaluate.length_batches / padding_waste); the
harness's ``--sort-prompts`` is tested in test_gsm8k_harness.py, the lm-eval model's order in
test_lm_eval.py."""

import pytest

from tasks.evaluate import length_batches, padding_waste


def test_length_batches_brute_force():
    lengths = [5, 9, 2, 9, 7, 1, 5]
    batches = length_batches(lengths, 3)
    assert batches == [[1, 3, 4], [0, 6, 2], [5]]  # longest first, ties in order
    assert length_batches(lengths, 3, sort=False) == [[0, 1, 2], [3, 4, 5], [6]]
    for b in (1, 2, 3, 7, 10):
        flat = [i for batch in length_batches(lengths, b) for i in batch]
        assert sorted(flat) == list(range(len(lengths)))  # every row once
    waste = padding_waste(lengths, batches)
    assert waste == pytest.approx(1 - sum(lengths) / (3 * 9 + 3 * 5 + 1 * 1))
    assert waste < padding_waste(lengths, length_batches(lengths, 3, sort=False))
    assert padding_waste(lengths, [[i] for i in range(7)]) == 0.0
    with pytest.raises(ValueError, match="batch_size"):
        length_batches(lengths, 0)
