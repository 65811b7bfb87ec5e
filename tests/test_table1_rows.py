"""The rows of the ``table1`` grid decode exactly like the public sampler calls they stand for
(``baseline_semiar_eos``: the semi-AR baseline stopped at its first EOS block)."""

from __future__ import annotations

import torch

from dlm.spec import Sampler, generate as run_sampler
from harness.grids import GRIDS, factorial, resolve, table1
from test_gsm8k_harness import ckpt  # noqa: F401  (the tiny checkpoint fixture, rows that stop early)


def test_grid_rows_decode_like_the_sampler_calls_they_name(ckpt):
    """Each table1 row, run through the one loop, gives the tokens of the public entry it stands for."""
    import bd3lm
    import fastdllm
    from dlm import load_model
    from dlm.llada import generate

    model, _ = load_model(ckpt, dtype=torch.float64)
    ids = torch.tensor([[5, 9, 7, 11, 6], [8, 5, 12, 9, 10]])  # (2, 5)
    rows = {x.name: x for x in table1(gen_length=16, block_length=8, steps=8, threshold=0.8, factor=2.0)}
    fd = dict(gen_length=16, block_length=8, steps=8)
    expected = {
        "baseline_full": lambda: generate(model, ids, gen_length=16, steps=8, block_length=16),
        "baseline_semiar": lambda: generate(model, ids, gen_length=16, steps=8, block_length=8),
        "baseline_semiar_eos": lambda: generate(model, ids, gen_length=16, steps=8, block_length=8),
        "fastdllm_prefix": lambda: fastdllm.generate(model, ids, cache="prefix", **fd),
        "fastdllm_dual": lambda: fastdllm.generate(model, ids, cache="dual", **fd),
        "fastdllm_threshold": lambda: fastdllm.generate(model, ids, threshold=0.8, **fd),
        "fastdllm_factor": lambda: fastdllm.generate(model, ids, factor=2.0, **fd),
        "fastdllm_prefix_threshold": lambda: fastdllm.generate(model, ids, cache="prefix", threshold=0.8, **fd),
        "fastdllm_dual_threshold": lambda: fastdllm.generate(model, ids, cache="dual", threshold=0.8, **fd),
        "bd3lm": lambda: bd3lm.sample(model, ids, block_size=4, gen_length=16, steps_per_block=2, stop_at_eos=True),
    }
    assert list(expected) == list(rows)
    eos = model.config.eos_token_id
    for name, call in expected.items():
        strategy = rows[name].for_block_model(4, "prompt")
        a, b = run_sampler(model, ids, None, strategy), call()
        if name == "baseline_semiar_eos":  # the semi-AR tokens, EOS after a row's first EOS, fewer steps
            answer = b.sequences[:, 5:].clone()  # (2, 16)
            seen = (answer == eos).cumsum(-1) > 0
            answer[seen] = eos
            stopped = seen[:, 7].all()  # every row holds an EOS in its first block of 8
            assert torch.equal(a.sequences[:, 5:], answer), name
            assert a.stats.nfe == (4 if stopped else 8) and b.stats.nfe == 8, name
            continue
        assert torch.equal(a.sequences, b.sequences) and a.stats.nfe == b.stats.nfe, name
    assert rows["bd3lm"].for_block_model(4, "prompt").steps_per_block == 2
    cells = factorial(gen_length=64, block_length=16, steps=32, threshold=0.8)
    assert len(cells) == 24 == len({(c.policy, c.rule, c.stop_at_eos, c.block) for c in cells})
    abl = {c.name: c for c in cells}["abl_dual_threshold_eos_full"]
    assert (abl.policy, abl.option("threshold"), abl.stop_at_eos, abl.block) == ("dual", 0.8, True, 64)
    assert [x.name for x in resolve(["baseline_full", "table1"])] == [x.name for x in GRIDS["table1"]()]
    assert Sampler.of(gen_length=32, block_length=None).total_steps == 32


def test_eos_baseline_row_is_the_semiar_baseline_stopped_at_its_first_eos_block(ckpt):
    """``baseline_semiar_eos`` per row: the semi-AR tokens up to the first EOS, EOS after it, and
    only the steps of the blocks up to the one holding that EOS (brute force from the full run)."""
    from dlm import load_model
    from dlm.llada import generate

    model, _ = load_model(ckpt, dtype=torch.float64)
    eos = model.config.eos_token_id
    row = {x.name: x for x in table1(gen_length=32, block_length=8, steps=16)}["baseline_semiar_eos"]
    stopped_early = 0
    for ids in ([[5, 9, 7, 11, 6]], [[8, 5, 12, 9, 10]], [[7, 7, 5, 6, 13]]):
        ids = torch.tensor(ids)  # (1, 5)
        full = generate(model, ids, gen_length=32, steps=16, block_length=8).sequences[0, 5:]  # (32,)
        hits = (full == eos).nonzero()
        blocks = 4 if len(hits) == 0 else int(hits[0]) // 8 + 1
        expected = full.clone()
        if len(hits):
            expected[int(hits[0]):] = eos
        out = run_sampler(model, ids, None, row)
        assert torch.equal(out.sequences[0, 5:], expected)
        assert out.stats.nfe == 4 * blocks
        stopped_early += blocks < 4
    assert stopped_early > 0  # the test sees a row stop before the last block
