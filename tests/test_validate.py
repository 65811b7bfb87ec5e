"""Input validation at the sampler boundary: bad ids, masks and numbers fail before any forward,
with a message naming the argument."""

from __future__ import annotations

import math

import pytest
import torch

import fastdllm
from dlm.llada import generate
from dlm.spec import Sampler
from test_contract import no_forward


@pytest.mark.parametrize("mask,word", [
    (torch.tensor([[0, 2, 1, 1, 1]]), "0/1"),           # a value other than 0/1
    (torch.tensor([[0.0, 1.0, 1.0, 1.0, 1.0]]), "0/1"),  # float masks are ambiguous
    (torch.tensor([[1, 1, 0, 1, 1]]), "left padding"),   # a hole: positions would skip
    (torch.tensor([[1, 1, 1, 1, 0]]), "left padding"),   # right padding
])
def test_attention_mask_must_be_binary_left_padding(tiny_model, mask, word):
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with no_forward(tiny_model), pytest.raises(ValueError, match=word):
        generate(tiny_model, ids, mask, gen_length=4, steps=4, block_length=4)


def test_a_bool_mask_is_accepted_and_equals_the_0_1_mask(tiny_model):
    ids, mask = torch.tensor([[3, 3, 7, 8, 9]]), torch.tensor([[0, 0, 1, 1, 1]])
    a = generate(tiny_model, ids, mask, gen_length=4, steps=4, block_length=4)
    b = generate(tiny_model, ids, mask.bool(), gen_length=4, steps=4, block_length=4)
    assert torch.equal(a.sequences, b.sequences)


@pytest.mark.parametrize("bad", [-1, 10_000])
@pytest.mark.parametrize("column", [0, 3])  # a padding column and a real one
def test_token_ids_outside_the_vocabulary(tiny_model, bad, column):
    ids, mask = torch.tensor([[3, 4, 7, 8, 9]]), torch.tensor([[0, 1, 1, 1, 1]])
    ids[0, column] = bad
    with no_forward(tiny_model), pytest.raises(ValueError, match=r"input_ids\[0, %d\]" % column):
        generate(tiny_model, ids, mask, gen_length=4, steps=4, block_length=4)


@pytest.mark.parametrize("mask_id", [-1, 10_000, 2.0, True])
def test_mask_id_outside_the_vocabulary(tiny_model, mask_id):
    with no_forward(tiny_model), pytest.raises((ValueError, TypeError), match="mask_id"):
        generate(tiny_model, torch.tensor([[5, 6]]), gen_length=4, steps=4, block_length=4, mask_id=mask_id)


@pytest.mark.parametrize("kw,word", [
    (dict(temperature=math.nan), "temperature"), (dict(temperature=math.inf), "temperature"),
    (dict(temperature=-1.0), "temperature"), (dict(cfg_scale=math.nan), "cfg_scale"),
    (dict(cfg_scale=math.inf), "cfg_scale"),
])
def test_non_finite_numbers_of_the_baseline(tiny_model, kw, word):
    with no_forward(tiny_model), pytest.raises(ValueError, match=word):
        generate(tiny_model, torch.tensor([[5, 6]]), gen_length=4, steps=4, block_length=4, **kw)


@pytest.mark.parametrize("kw,word", [
    (dict(threshold=math.nan), "threshold"), (dict(threshold=math.inf), "threshold"),
    (dict(factor=math.nan), "factor"), (dict(factor=math.inf), "factor"), (dict(factor=0.0), "factor"),
    (dict(temperature=math.nan), "temperature"), (dict(refresh_every=0, cache="dual"), "refresh_every"),
])
def test_non_finite_numbers_of_fastdllm(tiny_model, kw, word):
    with no_forward(tiny_model), pytest.raises((ValueError, TypeError), match=word):
        fastdllm.generate(tiny_model, torch.tensor([[5, 6]]), gen_length=4, block_length=4, **kw)


@pytest.mark.parametrize("kw,word", [(dict(top_p=math.nan), "top_p"), (dict(top_p=0.0), "top_p"),
                                     (dict(cfg_scale=math.nan), "cfg_scale"), (dict(temperature=math.inf), "temperature")])
def test_sampler_refuses_non_finite_numbers_when_built(kw, word):
    with pytest.raises((ValueError, TypeError), match=word):
        Sampler.of("x", gen_length=8, block_length=4, **kw)
