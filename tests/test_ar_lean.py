"""The lean AR decoder (dlm.ar_decode) gives the ar cache policy's tokens through the one loop,
token for token: on tiny shifted and plain models and on a committed AR checkpoint, a left-padded
batch of N equals N batches of one, and stopping at EOS keeps the full-length decode's prefix."""

from pathlib import Path

import pytest
import torch
from tiny import left_pad, tiny_model, unpad

from dlm.ar_decode import ar_decode
from dlm.sample import _fill_eos
from dlm.spec import Sampler, generate

REPO = Path(__file__).resolve().parents[1]


def loop_ar(model, ids, am, gen, stop_at_eos=False):
    return generate(model, ids, am, Sampler.of("ar", policy="ar", gen_length=gen, block_length=1,
                                               stop_at_eos=stop_at_eos))


def tiny_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return left_pad([torch.randint(4, 39, (n,), generator=g).tolist() for n in (5, 2, 7)], 0)


@pytest.mark.parametrize("shift", [False, True])
def test_tiny_model_equals_the_loop_and_single_rows(shift):
    model = tiny_model(shift_logits=shift, qkv_bias=shift)
    ids, am = tiny_batch()
    for gen in (1, 2, 12):
        lean, loop = ar_decode(model, ids, am, gen), loop_ar(model, ids, am, gen)
        assert torch.equal(lean.sequences, loop.sequences), gen
        assert torch.equal(lean.commit_step, loop.commit_step)
        assert lean.stats.nfe == loop.stats.nfe == gen
        assert lean.stats.positions_computed == loop.stats.positions_computed
        assert lean.stats.extra["flops"] == loop.stats.extra["flops"]
        assert lean.stats.forward_kinds == {k: [n, 0.0, f] for k, (n, _, f) in loop.stats.forward_kinds.items()}
    for r in range(3):  # batch of 3 under left padding = 3 batches of one
        one = unpad(ids, am, r)
        alone = ar_decode(model, one, None, 12).sequences[0]
        assert torch.equal(lean.sequences[r, -alone.shape[0]:], alone), r


def _checkpoint_batch(name, n):
    from dlm.checkpoints import load_model
    from harness.results import encode_question
    from tasks import generate_problems
    from tasks.evaluate import left_pad as pad_rows

    path = REPO / "results" / "checkpoints" / name
    model, tok = load_model(path)
    rows = [encode_question(tok, p.question, [], True) for p in generate_problems(n=n, split="test", seed=0)]
    ids, am = pad_rows(rows, tok.pad_token_id)
    return model.eval(), ids, am


def test_committed_ar_checkpoint_equals_the_loop_and_stops_at_eos():
    model, ids, am = _checkpoint_batch("dream-ar", 5)
    assert bool((am == 0).any())  # the batch is left-padded
    gen, eos = 48, model.config.eos_token_id
    full = ar_decode(model, ids, am, gen)
    assert torch.equal(full.sequences, loop_ar(model, ids, am, gen).sequences)
    answer = full.sequences[:, ids.shape[1]:]
    assert bool((answer == eos).any(-1).all())  # every row ends, some columns are decoded past it
    loop = loop_ar(model, ids, am, gen, stop_at_eos=True)
    for every in (1, 4, 64):
        stopped = ar_decode(model, ids, am, gen, stop_at_eos=True, check_every=every)
        assert torch.equal(stopped.sequences, loop.sequences), every
        assert torch.equal(stopped.commit_step, loop.commit_step)
        assert torch.equal(stopped.sequences[:, ids.shape[1]:], _fill_eos(answer, eos))  # the full decode's prefix
        assert torch.equal(stopped.stats.tokens_until_eos, loop.stats.tokens_until_eos)
        assert torch.equal(stopped.stats.row_tokens, loop.stats.row_tokens)
    last = int(loop.stats.tokens_until_eos.max())  # the step at which every row holds an EOS
    assert ar_decode(model, ids, am, gen, stop_at_eos=True, check_every=1).stats.nfe == last < gen
    for r in range(ids.shape[0]):
        one = unpad(ids, am, r)
        assert torch.equal(full.sequences[r, -one.shape[1] - gen:], ar_decode(model, one, None, gen).sequences[0]), r


def test_errors_name_the_argument():
    model = tiny_model(eos_token_id=None)
    ids, am = tiny_batch()
    with pytest.raises(ValueError, match="stop_at_eos=True needs model.config.eos_token_id"):
        ar_decode(model, ids, am, 4, stop_at_eos=True)
    with pytest.raises(ValueError, match="check_every must be >= 1, got 0"):
        ar_decode(model, ids, am, 4, check_every=0)
    with pytest.raises(ValueError, match="backend must be one of"):
        ar_decode(model, ids, am, 4, backend="nope")
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len"):
        ar_decode(model, ids, am, 1000)
