"""lm-eval models ``fastdllm`` / ``bd3lm`` (experiments.cli.lm_eval_models) on tiny random checkpoints.

Skipped when lm-eval is not installed (``pip install -e ".[eval]"``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from dlm import save_model  # noqa: E402
from dlm.model import Transformer  # noqa: E402
from dlm.llada import generate  # noqa: E402
from dlm.sample import GenerateOutput  # noqa: E402
from dlm.spec import generate as run_sampler, resolve_family  # noqa: E402
from tasks.evaluate import length_batches, padding_waste  # noqa: E402
from experiments.cli import lm_eval_models as lem  # noqa: E402
from tiny import tokenizer_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _tiny(tok, seed=0) -> Transformer:
    return tokenizer_model(tok, seed, dtype=torch.float64)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict:
    from bd3lm import BD3Config, save_bd3
    from tasks.tokenizer import build_tokenizer

    tok = build_tokenizer()
    root = tmp_path_factory.mktemp("lm_eval_ckpt")
    model = _tiny(tok)
    return {"llada": save_model(model, tok, root / "llada"),
            "bd3_1": save_bd3(model, tok, root / "bd3_1", BD3Config(block_size=1, align="prompt")),
            "bd3_2": save_bd3(model, tok, root / "bd3_2", BD3Config(block_size=2, align="prompt"))}


def request(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=tuple(args), idx=0)


def test_generate_until_cuts_at_eos_then_stop_strings(ckpts):
    lm = lem.FastDLLMEvalLM(pretrained=str(ckpts["llada"]), policy="dual", threshold=0.9, gen_length=16,
                            block_length=8, batch_size=2, dtype="float64")
    _, rule, _ = lm.strategy.components("llada")  # threshold 0.9 is the rule's default: no option recorded
    assert lm.strategy.policy == "dual" and (lm.strategy.rule, rule.threshold) == ("threshold", 0.9)
    ids = torch.tensor([lm.tokenizer.encode("Question: Ann has 3 pens.\nAnswer:", add_special_tokens=False)] * 2)
    mask = torch.ones_like(ids)
    got, ref = lm.call(lm.model, ids, mask, None), run_sampler(lm.model, ids, mask, lm.strategy)
    assert torch.equal(got.sequences, ref.sequences) and got.stats.nfe == ref.stats.nfe  # the call is the sampler's
    real = lm.generate_until([request("generate_until", "Question: Ann has 3 pens.\nAnswer:", {"until": []})])
    assert isinstance(real[0], str)
    tok = lm.tokenizer
    answers = [" 3 + 4 = 7\n#### 7\n\nQuestion: Ben has", " 5 - 2 = 3"]
    eos = tok.eos_token_id

    def stub(model, ids, mask, generator):
        enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
        rows = [enc(answers[0]), enc(answers[1]) + [eos] + enc(" 9 Question:")]
        G = max(len(r) for r in rows)
        gen = torch.tensor([r + [eos] * (G - len(r)) for r in rows])
        return GenerateOutput(torch.cat([ids.cpu(), gen], dim=1), None, None)

    lm.call = stub
    out = lm.generate_until([request("generate_until", "Question: a\nAnswer:", {"until": ["Question:", "</s>"]}),
                             request("generate_until", "Question: b\nAnswer:", {"until": "Question:"})])
    assert out == [" 3 + 4 = 7\n#### 7\n\n", " 5 - 2 = 3"]


def test_generate_until_batches_by_length_and_answers_in_request_order(ckpts):
    lm = lem.FastDLLMEvalLM(pretrained=str(ckpts["llada"]), gen_length=16, block_length=8, batch_size=2,
                            dtype="float64")
    tok, eos = lm.tokenizer, lm.tokenizer.eos_token_id
    seen = []

    def stub(model, ids, mask, generator):  # answers each row with its own prompt length
        lengths = mask.sum(-1).tolist()
        seen.append(lengths)
        rows = [tok.encode(f" {n}", add_special_tokens=False) for n in lengths]
        G = max(len(r) for r in rows)
        gen = torch.tensor([r + [eos] * (G - len(r)) for r in rows])
        return GenerateOutput(torch.cat([ids.cpu(), gen], dim=1), None, None)

    lm.call = stub
    prompts = ["Question: a\nAnswer:", "Question: 1 + 2 + 3 + 4 + 5\nAnswer:", "Question: 7\nAnswer:",
               "Question: 1 + 2 + 3\nAnswer:"]
    lengths = [len(tok.encode(p, add_special_tokens=False)) for p in prompts]
    out = lm.generate_until([request("generate_until", p, {"until": []}) for p in prompts])
    assert [o.strip() for o in out] == [str(n) for n in lengths]  # each answer back at its request
    assert seen == [sorted(lengths, reverse=True)[:2], sorted(lengths, reverse=True)[2:]]  # longest first
    assert lm.padding_waste == pytest.approx(padding_waste(lengths, length_batches(lengths, 2)))


def test_model_args_build_one_strategy(ckpts):
    named = lem.FastDLLMEvalLM(pretrained=str(ckpts["llada"]), strategy="fastdllm_dual_threshold", gen_length=16,
                               block_length=8, dtype="float64")
    s = named.strategy
    assert (s.name, s.policy, s.rule, s.components("llada")[1].threshold, s.block, s.total_steps) == (
        "fastdllm_dual_threshold", "dual", "threshold", 0.9, 8, 16)
    full = lem.fastdllm_sampler("baseline_full", dict(gen_length=16, block_length=8, steps=8, temperature=0.0))
    assert (full.policy, full.rule, full.block, full.steps_per_block) == ("none", "topk", 16, 8)
    custom = lem.fastdllm_sampler(None, dict(policy="prefix", factor=2.0, gen_length=16, block_length=8,
                                             temperature=0.0, stop_at_eos=True))
    assert (custom.policy, custom.rule, custom.option("factor"), custom.stop_at_eos) == ("prefix", "factor", 2.0, True)
    # bad model args are refused naming them (the options of two rules: at their defaults or not)
    for kw, match in ((dict(strategy="bd3lm"), "strategy"), (dict(strategy="table1"), "strategy"),
                      (dict(strategy="baseline_semiar", policy="dual"), "fixes"), (dict(policy="exact"), "BD3-LM"),
                      (dict(threshold=0.8, factor=2.0), "factor|threshold"),
                      (dict(threshold=0.9, factor=1.0), "factor|threshold"),
                      (dict(dtype="fp8"), "dtype")):
        with pytest.raises(ValueError, match=match):
            lem.FastDLLMEvalLM(pretrained=str(ckpts["llada"]), gen_length=16, block_length=8,
                               **{"dtype": "float64", **kw})
    bd3 = lem.BD3LMEvalLM(pretrained=str(ckpts["bd3_2"]), gen_length=8, steps=4, dtype="float64")
    s = bd3.strategy
    policy, _, proposal = s.components("llada")
    assert (s.policy, s.rule, s.block, policy.align, proposal.top_p, s.steps_per_block, s.stop_at_eos) == (
        "exact", "topk", 2, "prompt", 1.0, 1, True)
    with pytest.raises(ValueError, match="gen_length"):
        lem.BD3LMEvalLM(pretrained=str(ckpts["bd3_2"]), gen_length=7, dtype="float64")


@torch.no_grad()
def _llada_reference(model, prefix, target, mc_num, b, seed) -> float:
    """LLaDA get_log_likelihood.py written out literally (forward_process + weighted CE)."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.cat([prefix, target])[None].repeat(b, 1)
    P, L = len(prefix), len(target)
    losses = []
    for _ in range(mc_num // b):
        k = torch.randint(1, L + 1, (), generator=g)
        x = torch.round(torch.linspace(float(k), k + (b - 1) * (L / b), steps=b)).long()
        x = ((x - 1) % L) + 1
        is_mask = torch.arange(L).repeat(b, 1) < x.unsqueeze(1)
        for i in range(b):
            is_mask[i] = is_mask[i][torch.randperm(L, generator=g)]
        is_mask = torch.cat([torch.zeros(b, P, dtype=torch.bool), is_mask], dim=1)
        noisy = torch.where(is_mask, model.config.mask_token_id, seq)
        p_mask = (x / L).unsqueeze(1).repeat(1, P + L)
        logits = model(noisy)
        loss = F.cross_entropy(logits[is_mask], seq[is_mask], reduction="none") / p_mask[is_mask]
        losses.append(float(loss.sum() / b))
    return -sum(losses) / len(losses)


def test_fastdllm_loglikelihood_is_llada_mc_elbo(ckpts):
    lm = lem.FastDLLMEvalLM(pretrained=str(ckpts["llada"]), gen_length=16, block_length=8, mc_num=8,
                            mc_batch_size=4, dtype="float64", seed=3)
    ctx, cont = "Question: Ann has 3 pens.\nAnswer:", " 3 + 4 = 7"
    (ll, greedy), = lm.loglikelihood([request("loglikelihood", ctx, cont)])
    c, t = lm._encode_pair(ctx, cont)
    assert t == lm.tokenizer.encode(cont, add_special_tokens=False)
    ref = _llada_reference(lm.model, torch.tensor(c), torch.tensor(t), 8, 4, seed=3)
    assert ll == pytest.approx(ref, rel=1e-9) and ll < 0 and isinstance(greedy, bool)
    # one continuation token: the ELBO is exact, log p(token | prefix, [MASK])
    one = lm.tokenizer.encode(" Ann", add_special_tokens=False)
    assert len(one) == 1
    (ll1, _), = lm.loglikelihood([request("loglikelihood", ctx, " Ann")])
    x = torch.tensor([c + [lm.model.config.mask_token_id]])
    with torch.no_grad():
        exact = torch.log_softmax(lm.model(x)[0, -1], -1)[one[0]]
    assert ll1 == pytest.approx(float(exact), rel=1e-9)
    # is_greedy: true exactly for the greedy low-confidence decode
    prefix = torch.tensor(c)
    best = generate(lm.model, prefix[None], gen_length=3, steps=3, block_length=3).sequences[0, len(c):]
    assert lm.greedy(prefix, best) and not lm.greedy(prefix, (best + 1) % 100 + 5)
    with pytest.raises(ValueError, match="mc_num"):
        lem.mc_loglikelihood(lm.model, prefix, best, mc_num=6, batch_size=4)


def test_bd3lm_loglikelihood_exact_for_block_size_one(ckpts):
    from dlm.attention import block_causal_mask, block_ids

    lm = lem.BD3LMEvalLM(pretrained=str(ckpts["bd3_1"]), gen_length=8, dtype="float64", check_greedy=False)
    ctx, cont = "Question: Ann has 3 pens.\nAnswer:", " 3 + 4"
    (ll, _), = lm.loglikelihood([request("loglikelihood", ctx, cont)])
    c, t = lm._encode_pair(ctx, cont)
    mid, total = lm.model.config.mask_token_id, 0.0
    with torch.no_grad():  # prompt = one clean block, then each token predicted from the clean past
        for j in range(len(t)):
            x = torch.tensor([c + t[:j] + [mid]])
            ids = block_ids(x.shape[1], 1, len(c))
            logits = lm.model(x, attn_mask=block_causal_mask(ids, ids))[0, -1]
            logits[mid] = float("-inf")  # SUBS: the mask token is never predicted
            total += float(torch.log_softmax(logits, -1)[t[j]])
    assert ll == pytest.approx(total, rel=1e-9)
    # block size 2: the average of bd3_nelbo draws with the same generator
    from bd3lm.loss import bd3_nelbo

    lm2 = lem.BD3LMEvalLM(pretrained=str(ckpts["bd3_2"]), gen_length=8, dtype="float64", mc_num=4,
                          mc_batch_size=2, check_greedy=False)
    (ll2, _), = lm2.loglikelihood([request("loglikelihood", ctx, cont)])
    g = torch.Generator().manual_seed(0)
    seq = torch.tensor([c + t] * 2)
    batch = {"input_ids": seq, "prompt_lengths": torch.tensor([len(c)] * 2)}
    with torch.no_grad():
        ref = [float(bd3_nelbo(lm2.model, batch, 2, generator=g).total) / 2 for _ in range(2)]
    assert ll2 == pytest.approx(-sum(ref) / 2, rel=1e-9)
    texts = lm2.generate_until([request("generate_until", ctx, {"until": ["Question:"]})])
    assert len(texts) == 1 and "Question:" not in texts[0]


def _gsm8k_files(tmp: Path) -> tuple[Path, Path]:
    """3 GSM8K-format test problems (+ 3 train for the shots): procedural arithmetic problems in
    GSM8K's jsonl layout, so the test runs the same with or without the data mirror."""
    from tasks import generate_problems

    for split in ("test", "train"):
        lines = [json.dumps({"question": p.question, "answer": p.answer}) for p in generate_problems(n=3, split=split)]
        (tmp / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return tmp / "train.jsonl", tmp / "test.jsonl"


def test_simple_evaluate_gsm8k_local_end_to_end(ckpts, tmp_path, monkeypatch):
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    train, test = _gsm8k_files(tmp_path)
    yaml_text = (REPO / "experiments" / "cli" / "lm_eval_tasks" / "gsm8k_local.yaml").read_text()
    assert "../shared/data/gsm8k/test.jsonl" in yaml_text
    yaml_text = (yaml_text.replace("../shared/data/gsm8k/train.jsonl", str(train))
                 .replace("../shared/data/gsm8k/test.jsonl", str(test))
                 .replace("  data_files:", f"  cache_dir: {tmp_path / 'hf'}\n  data_files:"))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "gsm8k_local.yaml").write_text(yaml_text)
    tm = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    res = lm_eval.simple_evaluate(
        model="fastdllm", model_args=f"pretrained={ckpts['llada']},policy=dual,threshold=0.9,gen_length=8,"
                                     "block_length=8,dtype=float64",
        tasks=["gsm8k_local"], num_fewshot=1, limit=3, batch_size=2, bootstrap_iters=0, task_manager=tm)
    r = res["results"]["gsm8k_local"]
    assert r["sample_len"] == 3 and 0.0 <= r["exact_match,strict-match"] <= 1.0
    assert "exact_match,flexible-extract" in r
    from lm_eval.api.registry import get_model

    assert get_model("fastdllm") is lem.FastDLLMEvalLM and get_model("bd3lm") is lem.BD3LMEvalLM


def test_dream_checkpoint_decodes_with_the_dream_rules_unless_told(tmp_path):
    """lm-eval's fastdllm model on a Dream-layout checkpoint: Fast-dLLM's Dream rules by default
    (the sampler's family), the LLaDA rules with ``family=llada``; the outputs are those runs'."""
    from dlm import load_model
    from tasks.tokenizer import build_tokenizer
    from tiny import tokenizer_model

    tok = build_tokenizer()
    path = save_model(tokenizer_model(tok, shift_logits=True, qkv_bias=True), tok, tmp_path / "dream", layout="dream")
    for given, family in (("auto", "dream"), ("llada", "llada")):
        lm = lem.FastDLLMEvalLM(pretrained=str(path), policy="dual", threshold=0.9, gen_length=16, block_length=8,
                                dtype="float64", family=given)
        assert resolve_family(lm.strategy.family, lm.model.config) == family
        out = lm.generate_until([request("generate_until", "Question: Ann has 3 pens.\nAnswer:", {"until": []})])
        model, _ = load_model(path, dtype=torch.float64)
        ids = torch.tensor([tok.encode("Question: Ann has 3 pens.\nAnswer:")])
        seq = run_sampler(model, ids, None, lm.strategy).sequences[0, ids.shape[1]:].tolist()
        eos = seq.index(tok.eos_token_id) if tok.eos_token_id in seq else len(seq)
        assert out[0] == tok.decode(seq[:eos])
