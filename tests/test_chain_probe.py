"""Teacher-forced chain probes (research.chain_probe): sites, masks against brute force, and scoring
with oracle models."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dlm.io import round_floats
from tasks import ArithConfig, generate_problems, parse_chain
from tasks.sft_data import encode_answer, encode_prompt
from tasks.tokenizer import build_tokenizer
from research.chain_probe import PROBES, main, number_sites, probe_problem, probe_rows

CHECKPOINT = Path(__file__).resolve().parents[1] / "results" / "checkpoints" / "llada-arith"


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.mark.parametrize("cot", ["terse", "checked", "verbose"])
def test_number_sites_cover_every_line_result_and_the_final_answer(tok, cot):
    config = ArithConfig(min_steps=2, max_steps=4, max_value=50, ops=("+", "-", "*"), cot=cot)
    for pr in generate_problems(config, 20, split="test", seed=3):
        ids, sites = number_sites(tok, pr.answer)
        assert ids == encode_answer(tok, pr.answer)  # the tokens SFT trains on
        numbers = [tok.decode(ids[s:e]).strip() for s, e, _ in sites]
        finals = [f for _, _, f in sites]
        assert finals == [False] * (len(sites) - 1) + [True]
        assert numbers[-1] == str(pr.target)
        # brute force: the number after " = " on every line that has one (check lines included)
        expected = [line.split(" = ")[1].rstrip(")") for line in pr.answer.split("\n")[:-1] if " = " in line]
        assert numbers[:-1] == expected
        if cot != "checked":  # parse_chain reads the same results off terse and verbose answers
            assert numbers[:-1] == [str(c) for *_, c in parse_chain(pr.answer)]


def test_probe_rows_match_brute_force():
    n_prompt, gen = 5, 12
    sites = [(0, 2, False), (4, 5, False), (7, 8, True)]
    rows = probe_rows(n_prompt, gen, sites)
    masks, targets = {p: m for p, (m, _) in rows.items()}, {p: t for p, (_, t) in rows.items()}
    L = n_prompt + gen
    want = {p: [] for p in PROBES}
    want_t = {p: [] for p in PROBES}
    for s, e, final in sites:
        s, e = s + n_prompt, e + n_prompt
        span = [s <= j < e for j in range(L)]
        if final:
            want["final_chain"].append([j >= s for j in range(L)])
            want["final_question"].append([j >= n_prompt for j in range(L)])
            want_t["final_chain"].append(span)
            want_t["final_question"].append(span)
        else:
            want["line_left"].append([j >= s for j in range(L)])
            want["line_rest"].append(span)
            want_t["line_left"].append(span)
            want_t["line_rest"].append(span)
    for p in PROBES:
        assert masks[p].tolist() == want[p], p
        assert targets[p].tolist() == want_t[p], p


class _Oracle(torch.nn.Module):
    """Predicts the reference tokens ``x0`` everywhere, except at ``wrong`` (prompt-relative answer
    positions), where it predicts token 0, but only when ``wrong`` is masked in that row."""

    def __init__(self, x0, mask_id, wrong=()):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.x0, self.wrong = x0, list(wrong)
        self.config = SimpleNamespace(mask_token_id=mask_id, eos_token_id=2)

    def forward(self, x):
        pred = self.x0[None, :].expand_as(x).clone()  # (R, L)
        for j in self.wrong:
            pred[:, j] = torch.where(x[:, j] == self.config.mask_token_id, 0, pred[:, j])
        return torch.nn.functional.one_hot(pred, 200).float()  # (R, L, V)


def test_probe_problem_scores_oracle_and_its_mistakes(tok):
    pr = generate_problems(ArithConfig(min_steps=2, max_steps=2, max_value=9), 1, split="test")[0]
    prompt = encode_prompt(tok, pr.question)
    ids, sites = number_sites(tok, pr.answer)
    gen = 32
    x0 = torch.tensor(prompt + ids + [2] * (gen - len(ids)))
    perfect = probe_problem(_Oracle(x0, tok.mask_token_id), tok, pr.question, pr.answer, gen)
    assert perfect == {"line_left": (2, 2), "line_rest": (2, 2), "final_chain": (1, 1), "final_question": (1, 1)}
    # wrong on the first line's result: every probe that masks it and scores it fails
    first = len(prompt) + sites[0][0]
    out = probe_problem(_Oracle(x0, tok.mask_token_id, [first]), tok, pr.question, pr.answer, gen)
    assert out == {"line_left": (1, 2), "line_rest": (1, 2), "final_chain": (1, 1), "final_question": (1, 1)}
    # wrong on the final number: only the final probes fail
    final = len(prompt) + sites[-1][0]
    out = probe_problem(_Oracle(x0, tok.mask_token_id, [final]), tok, pr.question, pr.answer, gen)
    assert out == {"line_left": (2, 2), "line_rest": (2, 2), "final_chain": (0, 1), "final_question": (0, 1)}
    with pytest.raises(ValueError, match="gen_length"):
        probe_problem(_Oracle(x0, tok.mask_token_id), tok, pr.question, pr.answer, 4)


@pytest.mark.slow
def test_chain_probe_script_on_the_shipped_checkpoint(tmp_path):
    out = tmp_path / "probe.json"
    res = main(["--model", str(CHECKPOINT), "--n", "8", "--gen-length", "32", "--threads", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == round_floats(res)  # written at 10 significant digits
    problems = generate_problems(ArithConfig(min_steps=1, max_steps=2, max_value=9), 8, split="test")
    assert res["probes"]["line_left"]["total"] == sum(len(parse_chain(p.answer)) for p in problems)
    assert res["probes"]["final_chain"]["total"] == 8
    # the shipped model does each step given the whole reference around it
    assert res["probes"]["line_rest"]["accuracy"] >= 0.9
    with pytest.raises(ValueError, match="--n"):
        main(["--model", str(CHECKPOINT), "--n", "0"])
