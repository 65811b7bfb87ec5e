"""Testbed plumbing: SFT rows, batched evaluation, CIs, resumable JSONL, the shipped checkpoint."""

import json
from pathlib import Path

import pytest
import torch

from dlm.checkpoints import load_tokenizer
from tasks import ArithConfig, generate_problems
from tasks.evaluate import left_pad, mcnemar_exact, wilson_ci
from tasks.sft_data import SFTBatches, SFTDataConfig, encode_answer, encode_prompt, pad_rows
from tasks.tokenizer import build_tokenizer
from harness.results import JsonlLog, arith_config_of

CKPT = Path(__file__).resolve().parents[1] / "results" / "checkpoints" / "llada-arith"


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_pad_rows_keeps_prompt_and_pads_with_eos(tok):
    probs = generate_problems(ArithConfig(), 3, split="train", seed=1)
    prompts = [encode_prompt(tok, p.question) for p in probs]
    answers = [encode_answer(tok, p.answer) for p in probs]
    batch = pad_rows(prompts, answers, 40, tok.eos_token_id)
    T = -(-(max(map(len, prompts)) + 40) // 16) * 16
    assert batch["input_ids"].shape == (3, T)
    for i, (p, a) in enumerate(zip(prompts, answers)):
        row = batch["input_ids"][i].tolist()
        assert row[:len(p)] == p and row[len(p):len(p) + len(a)] == a
        assert set(row[len(p) + len(a):]) == {tok.eos_token_id}
        assert int(batch["prompt_lengths"][i]) == len(p)


def test_sft_batches_deterministic_per_step(tok):
    data = SFTBatches(tok, SFTDataConfig(batch_size=4))
    a = data(3, torch.Generator().manual_seed(11))
    b = data(3, torch.Generator().manual_seed(11))
    c = data(3, torch.Generator().manual_seed(12))
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert not (a["input_ids"].shape == c["input_ids"].shape and torch.equal(a["input_ids"], c["input_ids"]))
    with pytest.raises(ValueError, match="response_probs"):
        SFTDataConfig(response_lengths=(8, 16), response_probs=(0.5, 0.6))


def test_left_pad_and_wilson():
    ids, mask = left_pad([[5, 6], [7, 8, 9]], pad_id=0)
    assert ids.tolist() == [[0, 5, 6], [7, 8, 9]] and mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    lo, hi = wilson_ci(60, 100)
    assert 0.50 < lo < 0.51 and 0.69 < hi < 0.70  # textbook Wilson interval for 60/100
    assert wilson_ci(0, 0) == (0.0, 0.0)


def test_mcnemar_exact_matches_brute_force():
    from itertools import product

    for b, c in product(range(9), repeat=2):
        n = b + c
        # brute force: every assignment of the n discordant pairs; count those at least as extreme
        obs = abs(b - c)
        extreme = sum(abs(2 * bin(m).count("1") - n) >= obs for m in range(2 ** n))
        assert mcnemar_exact(b, c) == pytest.approx(min(1.0, extreme / 2 ** n))
    assert mcnemar_exact(26, 15) == pytest.approx(0.1173, abs=1e-4)
    with pytest.raises(ValueError, match="b"):
        mcnemar_exact(-1, 3)
    with pytest.raises(TypeError, match="c"):
        mcnemar_exact(1, 2.0)


def test_paired_table_uses_common_problems(tmp_path):
    from research.testbed import paired_table

    def write(name, correct):
        (tmp_path / f"{name}_k0.jsonl").write_text(
            "".join(json.dumps({"id": f"p{i}", "correct": c}) + "\n" for i, c in enumerate(correct)))

    write("semiar32", [True, True, True, False, True, True])
    write("pure", [True, False, False, True])  # first 4 problems only
    row = next(line for line in paired_table(tmp_path, n=500, shots=[0, 4]) if line.startswith("| 0 |"))
    cells = [c.strip() for c in row.strip("|").split("|")][2:]  # after shots and the block (32)
    assert cells[:7] == ["all", "4", "75.0", "50.0", "+25.0", "2", "1"] and row.startswith("| 0 | 32 |")
    assert float(cells[7]) == pytest.approx(mcnemar_exact(2, 1))
    assert paired_table(tmp_path / "none", n=10, shots=[0]) == []

    # per number of reasoning steps: p0, p2 have one step; p1, p3 two (p4, p5 are not in both files)
    steps_of = {"p0": 1, "p1": 2, "p2": 1, "p3": 2, "p4": 3, "p5": 3}
    rows = {cells[1]: cells for cells in ([c.strip() for c in line.strip("|").split("|")][1:]
                                          for line in paired_table(tmp_path, n=500, shots=[0], steps_of=steps_of)
                                          if line.startswith("| 0 |"))}
    assert list(rows) == ["all", "1", "2"]
    assert rows["1"][2:8] == ["2", "100.0", "50.0", "+50.0", "1", "0"]
    assert rows["2"][2:8] == ["2", "50.0", "50.0", "+0.0", "1", "1"]
    write("semiar8", [False, True, True, True, True])  # a second semi-AR block, against the same pure file
    block8 = [line for line in paired_table(tmp_path, n=500, shots=[0]) if line.startswith("| 0 | 8 | all |")]
    assert len(block8) == 1 and block8[0].split("|")[4:10] == [" 4 ", " 75.0 ", " 50.0 ", " +25.0 ", " 2 ", " 1 "]


def test_jsonl_log_resumes_after_truncated_line(tmp_path):
    path = tmp_path / "r.jsonl"
    log = JsonlLog(path)
    log.append([{"id": "a", "v": 1}, {"id": "b", "v": 2}])
    with open(path, "a") as f:
        f.write('{"id": "c", "v"')  # killed mid-write
    again = JsonlLog(path)
    assert again.done == {"a", "b"}
    again.append([{"id": "b", "v": 99}, {"id": "c", "v": 3}])  # duplicate id skipped
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["id"] for r in lines] == ["a", "b", "c"] and lines[1]["v"] == 2


def test_repo_relative_keeps_results_free_of_machine_paths(tmp_path):
    from harness.results import REPO, repo_relative
    assert repo_relative(REPO / "results" / "README.md") == "results/README.md"
    assert repo_relative(str(REPO / "dlm")) == "dlm"
    assert repo_relative(tmp_path) == str(tmp_path)  # outside the checkout: unchanged
    assert repo_relative("GSAI-ML/LLaDA-8B-Instruct") == "GSAI-ML/LLaDA-8B-Instruct"  # hub id


def test_tokens_per_step_table_compares_the_same_problems(tmp_path):
    from research.testbed import tokens_per_step_table

    def write(name, correct):
        (tmp_path / f"{name}_k0.jsonl").write_text(
            "".join(json.dumps({"id": f"p{i}", "correct": c}) + "\n" for i, c in enumerate(correct)))

    write("semiar32", [True, True, False, True])  # 4 problems at 1 token/step
    write("semiar32_s2", [False, True])  # only the first 2 at 2 tokens/step
    write("semiar32_s8", [True, False])
    write("semiar32_s32", [False, False, True])
    lines = tokens_per_step_table(tmp_path, n=500)
    row = next(line for line in lines if line.startswith("| semiar32 |"))
    assert [c.strip() for c in row.strip("|").split("|")] == ["semiar32", "2", "100.0", "50.0", "-", "50.0", "-",
                                                              "0.0"]
    p_row = next(line for line in lines if line.startswith("| semiar32: McNemar p"))
    p_cells = [c.strip() for c in p_row.strip("|").split("|")][2:]
    # same 2 problems: 1 tok/step solves both; 2 tok/step loses p0; 32 tok/step loses both
    assert p_cells[0] == "-" and p_cells[2] == "-" and p_cells[4] == "-"
    assert float(p_cells[1]) == pytest.approx(mcnemar_exact(1, 0))
    assert float(p_cells[5]) == pytest.approx(mcnemar_exact(2, 0))
    header = next(line for line in lines if line.startswith("| sampler |"))
    assert header.count("|") == row.count("|") == lines[lines.index(header) + 1].count("|")
    assert not any(line.startswith("| pure |") for line in lines)  # no pure files: no row


def test_sft_batches_few_shot_with_one_response_length(tok):
    """A single response length (the BD3-LM recipe) must still get few-shot prompts; with several
    lengths the longest never does. (Before the fix a single length silently never took shots.)"""
    g = torch.Generator().manual_seed(0)
    one = SFTBatches(tok, SFTDataConfig(batch_size=2, response_lengths=(64,), response_probs=(1.0,),
                                        fewshot_prob=1.0))
    question = "Question:"
    for step in range(3):
        row = tok.decode(one(step, g)["input_ids"][0].tolist())
        assert row.count(question) >= 2, row  # k >= 1 worked examples before the question
    none = SFTBatches(tok, SFTDataConfig(batch_size=2, response_lengths=(64,), response_probs=(1.0,),
                                         fewshot_prob=0.0))
    assert tok.decode(none(0, g)["input_ids"][0].tolist()).count(question) == 1
    two = SFTBatches(tok, SFTDataConfig(batch_size=2, response_lengths=(16, 64), response_probs=(0.0, 1.0),
                                        fewshot_prob=1.0))
    assert tok.decode(two(0, g)["input_ids"][0].tolist()).count(question) == 1


def test_sft_batches_one_shot_count_per_batch(tok):
    data = SFTBatches(tok, SFTDataConfig(batch_size=6, response_lengths=(32,), response_probs=(1.0,),
                                         fewshot_prob=1.0, shots_per_batch=True))
    g = torch.Generator().manual_seed(3)
    counts = set()
    for step in range(4):
        ids = data(step, g)["input_ids"]
        per_row = {tok.decode(row.tolist()).count("Question:") for row in ids}
        assert len(per_row) == 1  # the same k in every row of a batch
        counts |= per_row
    assert len(counts) > 1  # ... drawn afresh per batch
    with pytest.raises(ValueError, match="max_shots"):
        SFTDataConfig(max_shots=0)


def test_sft_batches_direct_answers(tok):
    """``direct_prob``: that share of rows answers with the final ``#### N`` line only; the
    prompts, and the other rows, are those of the batch without it."""
    arith = ArithConfig(min_steps=2, max_steps=3, max_value=9)
    cfg = dict(arith=arith, batch_size=64, response_lengths=(48,), response_probs=(1.0,), fewshot_prob=0.0)
    full = SFTBatches(tok, SFTDataConfig(**cfg))(0, torch.Generator().manual_seed(5))
    mixed = SFTBatches(tok, SFTDataConfig(**cfg, direct_prob=0.5))(0, torch.Generator().manual_seed(5))
    assert torch.equal(full["prompt_lengths"], mixed["prompt_lengths"])
    eos = tok.eos_token_id
    n_direct = 0
    for row_full, row_mixed, p in zip(full["input_ids"], mixed["input_ids"], full["prompt_lengths"]):
        assert torch.equal(row_full[:p], row_mixed[:p])
        answer_full = tok.decode([t for t in row_full[p:].tolist() if t != eos])
        answer_mixed = tok.decode([t for t in row_mixed[p:].tolist() if t != eos])
        assert answer_full.count("=") >= 2  # two or more chain lines without direct answers
        if answer_mixed != answer_full:
            n_direct += 1
            assert "=" not in answer_mixed and answer_mixed.strip() == answer_full.split("\n")[-1].strip()
    assert 16 <= n_direct <= 48  # Binomial(64, 0.5)
    with pytest.raises(ValueError, match="direct_prob"):
        SFTDataConfig(direct_prob=1.0)


def test_testbed_refuses_samples_of_other_weights(tmp_path):
    from harness.evaluate import check_resumable, existing_records

    sample = {"prediction": "#### 1", "target": "1", "extracted": "1", "correct": True, "tokens_until_eos": 4,
              "nfe": 4, "seconds": 0.5, "prompt_length": 8, "first_eos_step": 3, "seed": 0}  # a valid record
    log = JsonlLog(tmp_path / "x.jsonl")
    log.append([{**sample, "id": "a", "config_hash": "h1", "model_weights": "w1"},
                {**sample, "id": "b", "config_hash": "h1"}])
    done = existing_records(log.path)
    check_resumable(done, log.path, "h1", "w1")
    with pytest.raises(ValueError, match="weights"):
        check_resumable(done, log.path, "h1", "w2")
    with pytest.raises(ValueError, match="config"):
        check_resumable(done, log.path, "h2", "w1")


def test_testbed_counts_distinct_problems_and_draws_unique_ones():
    from argparse import Namespace

    from tasks import problem_key
    from research.testbed import held_out_problems, per_key_accuracy

    args = Namespace(model=str(CKPT), n=120, seed=0, unique=False)
    repeated = held_out_problems(args)
    keys = [problem_key(p) for p in repeated]
    assert len(set(keys)) < len(keys)  # the 1-2 step single-digit test split has few keys
    unique = held_out_problems(Namespace(**{**vars(args), "n": 40, "unique": True}))
    assert len({problem_key(p) for p in unique}) == 40
    with pytest.raises(ValueError, match="unique problems"):
        held_out_problems(Namespace(**{**vars(args), "n": 10_000, "unique": True}))

    # brute force: group by key, average each group's accuracy, then average the groups
    recs = [{"id": p.id, "correct": i % 3 == 0} for i, p in enumerate(repeated)]
    groups = {}
    for r, k in zip(recs, keys):
        groups.setdefault(k, []).append(r["correct"])
    n, acc = per_key_accuracy(recs, {p.id: k for p, k in zip(repeated, keys)})
    assert n == len(groups)
    assert acc == pytest.approx(sum(sum(g) / len(g) for g in groups.values()) / len(groups))


def test_is_direct_answer():
    from research.testbed import is_direct_answer

    assert is_direct_answer("#### 7") and is_direct_answer("Ann has 7 pens.\n#### 7")
    assert not is_direct_answer("3 + 4 = 7\n#### 7")
    assert not is_direct_answer("She finds 4 more. 3 + 4 = 7\n#### 7")
    assert not is_direct_answer("3 + 4 = 7") and not is_direct_answer("")


def test_chain_stats_splits_direct_answers_from_chains():
    from research.testbed import chain_stats

    recs = [{"prediction": "#### 7", "correct": True},                       # direct, right
            {"prediction": "#### 3", "correct": False},                      # direct, wrong
            {"prediction": "#### 5\n2 + 3 = 5", "correct": True},            # '####' first: direct
            {"prediction": " 3 + 4 = 7\n7 - 2 = 5\n#### 5", "correct": True},  # chain, lines right
            {"prediction": " 3 + 4 = 8\n8 - 2 = 6\n#### 7", "correct": False},  # 1 wrong line, ends off
            {"prediction": " 3 + 4 = 7", "correct": False},                  # chain, no '####' line
            {"prediction": "no answer", "correct": False}]                   # neither
    assert chain_stats(recs) == {
        "chain_answers": 3, "chain_right": 1, "direct_answers_n": 3, "direct_right": 2,
        "reasoning_lines": 5, "lines_arithmetic_right": 4, "chains_with_final_line": 2,
        "final_is_last_result": 1}


def test_testbed_report_length_column_and_refusal_of_other_problems(tmp_path):
    from argparse import Namespace

    from research.testbed import held_out_problems, report

    args = Namespace(model=str(CKPT), out=str(tmp_path), n=30, seed=0, unique=False, fewshot=[0], gen_length=256)
    rec = {"correct": True, "first_eos_step": 1, "prompt_length": 27, "prediction": ""}
    problems = held_out_problems(args)
    tok = load_tokenizer(CKPT)
    # every third answer as long as the reference (its tokens + the first EOS), the others one longer
    ref = [len(encode_answer(tok, p.answer)) + 1 for p in problems]
    until_eos = [r if i % 3 == 0 else r + 1 for i, r in enumerate(ref)]
    # a chain, a direct answer (no reasoning line) and no answer at all, in turn
    predictions = ["Ann has 3 pens.\n3 - 2 = 1\n#### 1", "#### 1", "3 - 2 = 1"]
    (tmp_path / "semiar32_k0.jsonl").write_text("".join(
        json.dumps({**rec, "id": p.id, "target": p.target_str, "tokens_until_eos": t,
                    "prediction": predictions[i % 3]}) + "\n"
        for i, (p, t) in enumerate(zip(problems, until_eos))))
    report(args)  # the problems these records were made for
    assert "| semiar32 | 0 |" in (tmp_path / "testbed.md").read_text()
    assert "EOS tail committed first" not in (tmp_path / "testbed.md").read_text()  # records predate it
    row = json.loads((tmp_path / "testbed.json").read_text())["rows"][0]
    assert row["length_as_reference"] == pytest.approx(sum(i % 3 == 0 for i in range(30)) / 30)
    assert row["direct_answers"] == pytest.approx(1 / 3) and row["no_final_line"] == pytest.approx(1 / 3)
    assert (row["chain_answers"], row["reasoning_lines"], row["lines_arithmetic_right"]) == (20, 20, 20)
    assert "| semiar32 | 0 | 30 | 10 |" in (tmp_path / "testbed.md").read_text()  # the chains table
    with pytest.raises(ValueError, match="other held-out problems"):
        report(Namespace(**{**vars(args), "unique": True}))  # same ids, other problems
    # records with tail_before_answer: 1.0, 0.5, none (no EOS tail), in turn
    tails = [1.0, 0.5, None]
    (tmp_path / "semiar32_k0.jsonl").write_text("".join(
        json.dumps({**rec, "id": p.id, "target": p.target_str, "tokens_until_eos": 5, "prediction": "#### 1",
                    "tail_before_answer": tails[i % 3]}) + "\n" for i, p in enumerate(problems)))
    report(args)
    row = json.loads((tmp_path / "testbed.json").read_text())["rows"][0]
    assert (row["tail_rows"], row["tail_before_answer"], row["tail_all_before_answer"]) == (20, 0.75, 0.5)
    assert "| semiar32 | 0 | 20 | 75.0% | 50.0% |" in (tmp_path / "testbed.md").read_text()


def test_train_llada_script_records_its_flags(tmp_path, capsys, monkeypatch):
    """The retrain script end to end on a tiny net: the data flags reach ``SFTDataConfig``, the
    checkpoint loads, and its ``config.json`` records the flags and the task it was trained on."""
    from dlm.checkpoints import load_model
    from experiments.train import train_llada

    seen = []
    monkeypatch.setattr(train_llada, "SFTBatches", lambda tok, cfg: seen.append(cfg) or SFTBatches(tok, cfg))
    out = tmp_path / "run"
    train_llada.main(["--out", str(out), "--d-model", "16", "--n-layers", "1", "--n-heads", "2",
                      "--max-seq-len", "512", "--steps", "2", "--batch-size", "2", "--max-value", "9",
                      "--min-steps-per-problem", "2", "--max-steps-per-problem", "3",
                      "--ops", "+", "*", "--max-factor", "3", "--cot", "checked",
                      "--response-lengths", "32", "--response-probs", "1", "--fewshot-prob", "1",
                      "--shots-per-batch", "--warmup", "1", "--eval-every", "0", "--save-every", "2"])
    assert '"steps": 2' in capsys.readouterr().out
    assert [(c.shots_per_batch, c.fewshot_prob, c.response_lengths) for c in seen] == [(True, 1.0, (32,))]
    extra = json.loads((out / "model" / "config.json").read_text())["extra"]
    assert extra["args"]["shots_per_batch"] is True and extra["recipe"] == "llada-sft"
    assert (extra["arith"]["max_value"], extra["arith"]["min_steps"], extra["arith"]["max_steps"]) == (9, 2, 3)
    assert seen[0].arith == ArithConfig(min_steps=2, max_steps=3, max_value=9, ops=("+", "*"), max_factor=3,
                                        cot="checked")
    assert arith_config_of(out / "model") == seen[0].arith
    model, tok = load_model(out / "model", dtype=torch.float32)
    assert model.config.d_model == 16 and tok.eos_token_id == model.config.eos_token_id
