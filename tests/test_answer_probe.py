"""research.answer_probe: the AR probe is the trainer's answer loss; a model that knows every answer
token scores 100% in both layouts and at every mask ratio (the logit alignment is right)."""

from types import SimpleNamespace

import pytest
import torch

from dlm.objectives import ARSFTLoss
from dlm.tokenizer import build_word_tokenizer
from research.answer_probe import probe
from tasks import sudoku
from tasks.pairs import PairBatches
from tests.tiny import tiny_dream

TOK = build_word_tokenizer(sudoku.vocabulary())


def _batch(n: int = 6) -> dict:
    return PairBatches(TOK, sudoku.generate, n, 24)(0, torch.Generator().manual_seed(3))


class Oracle(torch.nn.Module):
    """Logits that put all mass on the reference token: at column i for a shifted (Dream) layout or
    a diffusion model, at column i - 1 for an unshifted AR model."""

    def __init__(self, ids: torch.Tensor, shift: bool) -> None:
        super().__init__()
        self.ids, self.config = ids, SimpleNamespace(shift_logits=shift, eos_token_id=TOK.eos_token_id,
                                                     mask_token_id=TOK.mask_token_id)

    def forward(self, x, attn_mask=None):
        target = self.ids if self.config.shift_logits or attn_mask is None else self.ids.roll(-1, 1)
        return torch.nn.functional.one_hot(target, len(TOK)).float() * 50.0


@pytest.mark.parametrize("shift", [True, False])
def test_a_model_that_knows_the_answer_scores_every_token(shift):
    b = _batch()
    ar = probe(Oracle(b["input_ids"], shift), b, "ar", None)
    assert ar["accuracy"] == 1.0 and ar["exact"] == 1.0 and ar["ce"] < 1e-6 and ar["rows"] == 6
    for ratio in (1.0, 0.5, 0.15):
        d = probe(Oracle(b["input_ids"], shift), b, "diffusion", ratio)
        assert d["accuracy"] == 1.0 and d["exact"] == 1.0 and 0 < d["tokens"] <= ar["tokens"]
    assert probe(Oracle(b["input_ids"], shift), b, "diffusion", 1.0)["tokens"] == ar["tokens"]  # all masked


def test_the_ar_probe_is_the_trainers_answer_loss():
    b = _batch()
    model = tiny_dream(vocab_size=len(TOK), mask_token_id=TOK.mask_token_id, eos_token_id=TOK.eos_token_id)
    model.eval()
    with torch.no_grad():
        _, logged = ARSFTLoss()(model, b)
    assert probe(model, b, "ar", None)["ce"] == pytest.approx(float(logged["answer_loss"]), rel=1e-5)


def test_the_masks_follow_the_ratio_and_the_seed():
    b = _batch()
    model = Oracle(b["input_ids"], True)
    low, high = (probe(model, b, "diffusion", r)["tokens"] for r in (0.15, 0.5))
    assert low < high
    assert probe(model, b, "diffusion", 0.5, seed=1) == probe(model, b, "diffusion", 0.5, seed=1)
