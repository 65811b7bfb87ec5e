import math

import pytest
import torch

from dlm.objectives import LLaDAPretrainLoss, LLaDASFTLoss, sample_masking_noise
from tiny import micro_config, micro_model

V, MASK = micro_config().vocab_size, micro_config().mask_token_id  # 16, 15


def tiny(seed=0, eos=None):
    """The 1-layer float32 training model (:func:`tiny.micro_model`), EOS id ``eos``."""
    return micro_model(seed, eos_token_id=eos)


def ids(B=3, L=7, seed=1):
    return torch.randint(0, MASK, (B, L), generator=torch.Generator().manual_seed(seed))


class Spy(torch.nn.Module):
    """Wraps ``model`` and records every input it is called with in ``seen``."""

    def __init__(self, model, seen):
        super().__init__()
        self.inner, self.config, self.seen = model, model.config, seen

    def forward(self, input_ids, **kw):
        self.seen.append(input_ids.clone())
        return self.inner(input_ids, **kw)


def test_pretrain_matches_bruteforce():
    model, x, eps = tiny(), ids(), 1e-3
    loss, metrics = LLaDAPretrainLoss(eps)(model, {"input_ids": x}, torch.Generator().manual_seed(5))
    noise = sample_masking_noise({"input_ids": x}, torch.Generator().manual_seed(5))
    B, L = x.shape
    total = 0.0
    for b in range(B):
        p = (1 - eps) * float(noise["noise_t"][b]) + eps
        row = x[b].clone()
        masked = [i for i in range(L) if float(noise["noise_u"][b, i]) < p]
        for i in masked:
            row[i] = MASK
        logp = torch.log_softmax(model(row[None])[0], dim=-1).detach()
        for i in masked:
            total += -float(logp[i, x[b, i]]) / p
    assert math.isclose(loss.item(), total / (B * L), rel_tol=1e-5)
    assert float(metrics["loss"]) == loss.item()


def test_pretrain_padding_never_masked_and_ignored():
    model, x, eps = tiny(), ids(B=2, L=6), 1e-3
    am = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    g = torch.Generator().manual_seed(2)
    noise = sample_masking_noise({"input_ids": x}, g)
    noise["noise_t"] = torch.tensor([0.9, 0.6])  # mask most tokens
    loss, _ = LLaDAPretrainLoss(eps)(model, {"input_ids": x, "attention_mask": am, **noise}, g)
    total = 0.0
    for b in range(2):
        p = (1 - eps) * float(noise["noise_t"][b]) + eps
        real = [i for i in range(6) if am[b, i]]
        row = x[b, real].clone()  # run the row without its padding
        masked = [j for j, i in enumerate(real) if float(noise["noise_u"][b, i]) < p]
        assert masked
        row[masked] = MASK
        logp = torch.log_softmax(model(row[None])[0], dim=-1).detach()
        total += sum(-float(logp[j, x[b, real[j]]]) / p for j in masked)
    assert math.isclose(loss.item(), total / 12, rel_tol=1e-5)


def test_inverse_p_mask_weighting():
    """Constant logits: CE = log V at the one masked token, weighted by 1 / eps."""

    class Uniform(torch.nn.Module):
        config = tiny().config

        def forward(self, input_ids, **kw):
            return torch.zeros(*input_ids.shape, V, requires_grad=True)

    x = ids(B=2, L=4)
    u = torch.ones(2, 4)
    u[0, 1] = 0.0  # only (0, 1) can be masked
    batch = {"input_ids": x, "noise_t": torch.zeros(2), "noise_u": u}
    eps = 0.01
    loss, _ = LLaDAPretrainLoss(eps)(Uniform(), batch, torch.Generator())
    assert math.isclose(loss.item(), math.log(V) / eps / 8, rel_tol=1e-6)


def test_sft_matches_bruteforce_and_keeps_prompt():
    model, x, eps = tiny(), ids(B=3, L=8), 1e-3
    prompt = torch.tensor([2, 5, 0])
    seen = []

    batch = {"input_ids": x, "prompt_lengths": prompt}
    g = torch.Generator().manual_seed(9)
    noise = sample_masking_noise(batch, torch.Generator().manual_seed(9))
    loss, _ = LLaDASFTLoss(eps)(Spy(model, seen), batch, g)
    noisy = seen[0]
    total = 0.0
    for b in range(3):
        P = int(prompt[b])
        assert torch.equal(noisy[b, :P], x[b, :P])  # prompt never masked
        p = (1 - eps) * float(noise["noise_t"][b]) + eps
        masked = [i for i in range(P, 8) if float(noise["noise_u"][b, i]) < p]
        expect = x[b].clone()
        expect[masked] = MASK
        assert torch.equal(noisy[b], expect)
        logp = torch.log_softmax(model(expect[None])[0], dim=-1).detach()
        total += sum(-float(logp[i, x[b, i]]) / p for i in masked) / (8 - P)
    assert math.isclose(loss.item(), total / 3, rel_tol=1e-5)


def test_sft_prompt_never_masked_at_t_one():
    x = ids(B=4, L=6)
    prompt = torch.tensor([1, 2, 3, 5])
    seen = []
    model = tiny()

    def spy(input_ids, **kw):
        seen.append(input_ids)
        return model(input_ids)

    spy.config = model.config
    batch = {"input_ids": x, "prompt_lengths": prompt, "noise_t": torch.ones(4), "noise_u": torch.rand(4, 6)}
    LLaDASFTLoss()(spy, batch, torch.Generator())
    cols = torch.arange(6)[None]
    assert torch.equal(seen[0] == MASK, cols >= prompt[:, None])  # p_mask = 1: all response masked


def test_generator_only_randomness_and_shard_mean():
    model, x = tiny(), ids(B=4, L=5)
    state = torch.random.get_rng_state()
    obj = LLaDAPretrainLoss()
    a, _ = obj(model, {"input_ids": x}, torch.Generator().manual_seed(1))
    b, _ = obj(model, {"input_ids": x}, torch.Generator().manual_seed(1))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert a.item() == b.item()
    # equal shards with their slice of the global noise average to the full-batch loss
    batch = {"input_ids": x, **obj.sample_noise({"input_ids": x}, torch.Generator().manual_seed(4))}
    full, _ = obj(model, batch, torch.Generator())
    halves = [obj(model, {k: v[s] for k, v in batch.items()}, torch.Generator())[0]
              for s in (slice(0, 2), slice(2, 4))]
    assert torch.allclose(full, (halves[0] + halves[1]) / 2, atol=1e-6)


def test_bad_inputs():
    model, g = tiny(), torch.Generator()
    for eps in (0.0, 1.0, -1, "x", True):
        with pytest.raises(ValueError, match="eps"):
            LLaDAPretrainLoss(eps)
    with pytest.raises(ValueError, match="input_ids"):
        LLaDAPretrainLoss()(model, {}, g)
    with pytest.raises(TypeError, match="input_ids"):
        LLaDAPretrainLoss()(model, {"input_ids": torch.zeros(2, 3)}, g)
    with pytest.raises(TypeError, match="generator"):
        LLaDAPretrainLoss()(model, {"input_ids": ids()}, 0)
    with pytest.raises(ValueError, match="attention_mask"):
        LLaDAPretrainLoss()(model, {"input_ids": ids(), "attention_mask": torch.ones(3, 2)}, g)
    with pytest.raises(ValueError, match="prompt_lengths"):
        LLaDASFTLoss()(model, {"input_ids": ids(L=4), "prompt_lengths": torch.tensor([0, 4, 1])}, g)
    with pytest.raises(ValueError, match="prompt_lengths"):
        LLaDASFTLoss()(model, {"input_ids": ids()}, g)
    with pytest.raises(ValueError, match="noise"):
        LLaDAPretrainLoss()(model, {"input_ids": ids(), "noise_t": torch.rand(2),
                                    "noise_u": torch.rand(3, 7)}, g)


def test_gradient_flows_only_through_masked():
    model, x = tiny(), ids(B=2, L=4)
    u = torch.ones(2, 4)
    batch = {"input_ids": x, "noise_t": torch.zeros(2), "noise_u": u}  # nothing masked
    loss, _ = LLaDAPretrainLoss()(model, batch, torch.Generator())
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


def test_sft_suffix_rows_match_bruteforce():
    """suffix_prob: rows with noise_suffix[:, 0] < suffix_prob mask the answer from a cut drawn
    over its content tokens and first EOS; other rows keep LLaDA's masking; loss is the per-row
    mean cross-entropy (uniform weighting)."""
    model = tiny(eos=2)
    eos = model.config.eos_token_id
    x = ids(B=4, L=10, seed=3)
    x[x == eos] = (eos + 1) % MASK
    x[0, 7:] = eos  # answer 3..6 content, EOS at 7
    x[1, 4:] = eos  # answer content 2..3, EOS at 4
    x[3, 5:] = eos
    prompt = torch.tensor([3, 2, 1, 5])  # row 3: its answer is EOS only; row 2: no EOS at all
    seen = []

    obj = LLaDASFTLoss(weighting="uniform", suffix_prob=0.5)
    batch = {"input_ids": x, "prompt_lengths": prompt}
    noise = obj.sample_noise(batch, torch.Generator().manual_seed(2))
    noise["noise_suffix"][:, 0] = torch.tensor([0.1, 0.4, 0.2, 0.3])  # rows 0-3 suffix rows ...
    noise["noise_suffix"][1, 0] = 0.9  # ... but row 1 is a LLaDA row
    noise["noise_suffix"][:, 1] = torch.tensor([0.99, 0.5, 0.0, 0.7])
    loss, _ = obj(Spy(model, seen), {**batch, **noise}, torch.Generator())
    total = 0.0
    for b in range(4):
        P = int(prompt[b])
        if float(noise["noise_suffix"][b, 0]) < 0.5:
            first_eos = next((i for i in range(P, 10) if int(x[b, i]) == eos), 9)
            choices = list(range(P, first_eos + 1))
            cut = choices[int(float(noise["noise_suffix"][b, 1]) * len(choices))]
            masked = list(range(cut, 10))
        else:
            p = (1 - 1e-3) * float(noise["noise_t"][b]) + 1e-3
            masked = [i for i in range(P, 10) if float(noise["noise_u"][b, i]) < p]
        expect = x[b].clone()
        expect[masked] = MASK
        assert torch.equal(seen[0][b], expect), b
        logp = torch.log_softmax(model(expect[None])[0], dim=-1).detach()
        total += sum(-float(logp[i, x[b, i]]) for i in masked) / max(len(masked), 1)
    assert torch.equal(seen[0][0, 6:], torch.tensor([int(x[0, 6]), MASK, MASK, MASK]))  # cut at the first EOS
    assert torch.equal(seen[0][2, 1:], torch.full((9,), MASK))  # no EOS: cut over the whole answer
    assert math.isclose(loss.item(), total / 4, rel_tol=1e-5)
    # suffix_prob=0 draws no extra noise and leaves LLaDA's masks as they were
    assert set(LLaDASFTLoss(weighting="uniform").sample_noise(batch, torch.Generator())) == {"noise_t", "noise_u"}
    for bad in (-0.1, 1.5, "x", True):
        with pytest.raises(ValueError, match="suffix_prob"):
            LLaDASFTLoss(weighting="uniform", suffix_prob=bad)
    with pytest.raises(ValueError, match="uniform"):
        LLaDASFTLoss(suffix_prob=0.5)
    with pytest.raises(ValueError, match="noise_suffix"):
        obj(model, {**batch, "noise_t": noise["noise_t"], "noise_u": noise["noise_u"]}, torch.Generator())
    with pytest.raises(TypeError, match="eos_token_id"):
        obj(tiny(), {**batch, **noise}, torch.Generator())


@pytest.mark.parametrize("shift", [False, True])
def test_ar_sft_loss_is_next_token_cross_entropy_on_the_response(shift):
    """ARSFTLoss: causal attention, each response token predicted from its prefix (brute force: one
    uncached forward per prefix), per-row mean over the response, mean over rows."""
    from dlm.objectives import ARSFTLoss
    from tiny import micro_model

    torch.manual_seed(0)
    model = micro_model(shift_logits=shift).double()
    ids = torch.randint(0, 15, (3, 9))
    starts = torch.tensor([2, 4, 0])
    loss, _ = ARSFTLoss()(model, {"input_ids": ids, "prompt_lengths": starts})
    plain = micro_model().double()  # the same weights without the shift: last logit = next token
    plain.load_state_dict(model.state_dict())
    rows = []
    for b in range(3):
        ces = []
        for i in range(max(int(starts[b]), 1), 9):
            logits = plain(ids[b:b + 1, :i])[0, -1]  # sees tokens < i only
            ces.append(torch.nn.functional.cross_entropy(logits[None].float(), ids[b, i:i + 1]))
        rows.append(torch.stack(ces).mean())
    assert torch.allclose(loss, torch.stack(rows).mean(), atol=1e-6)
    with pytest.raises(ValueError, match="prompt_lengths"):
        ARSFTLoss()(model, {"input_ids": ids, "prompt_lengths": torch.tensor([9, 0, 0])})
