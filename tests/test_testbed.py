"""Testbed plumbing: SFT rows, batched evaluation, CIs, resumable JSONL, the shipped checkpoint."""

import json
from pathlib import Path

import pytest
import torch

from dlm.checkpoints import load_tokenizer
from dlm.tasks import ArithConfig, fewshot_examples, generate_problems
from dlm.tasks.evaluate import left_pad, mcnemar_exact, wilson_ci
from experiments.evaluate import score
from experiments.strategy import Strategy
from dlm.tasks.sft_data import SFTBatches, SFTDataConfig, encode_answer, encode_prompt, pad_rows
from dlm.tasks.tokenizer import build_tokenizer
from experiments.common import JsonlLog, arith_config_of

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


@pytest.mark.slow
@pytest.mark.parametrize("gen_length", [32, 128])
def test_shipped_checkpoint_solves_problems(tok, gen_length):
    """The committed embedded model really solves held-out problems (semi-AR, 1 token/step), also
    with a masked EOS tail longer than its answers (a model trained only on short answers fails)."""
    assert CKPT.is_dir(), f"embedded checkpoint {CKPT} is missing"
    from dlm import load_model
    model, mtok = load_model(CKPT)
    from experiments.common import arith_config_of
    problems = generate_problems(arith_config_of(CKPT), 16, split="test", seed=777)
    r = score(model, mtok, problems, Strategy("semiar32", gen_length=gen_length, block_length=32), batch_size=16)
    assert r["n"] == 16
    assert r["accuracy"] >= 0.5, [x["prediction"] for x in r["records"]]
    assert all(x["extracted"] is not None for x in r["records"][:8])
    # semi-AR 32: only the answer's own block can hold tail tokens committed before it is done
    for x in r["records"]:
        n = x["tokens_until_eos"]
        assert n <= 32 and 0 <= x["tail_before_answer"] <= (32 - n + 1) / (gen_length - n + 1), x


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [4, 8, 16])
def test_shipped_bd3lm_checkpoints_solve_problems(block_size):
    """The committed block-diffusion models (exact KV cache, stop at the first EOS block) solve
    held-out problems zero-shot and with 4 worked examples (before the few-shot fix in
    ``dlm.tasks.sft_data`` BD3-LM never saw a few-shot prompt and scored 0% 4-shot), and never
    decode past the block that holds EOS."""
    ckpt = CKPT.parent / f"bd3lm-arith-{block_size}"
    assert ckpt.is_dir(), f"embedded BD3-LM checkpoint {ckpt} is missing"
    from bd3lm import BD3LM
    from experiments.common import arith_config_of
    bd3, mtok = BD3LM.load(ckpt)
    assert bd3.block_size == block_size
    arith = arith_config_of(ckpt)
    problems = generate_problems(arith, 16, split="test", seed=777)
    for shots, floor in (((), 0.5), (fewshot_examples(arith, 4, seed=777), 0.3)):
        strategy = Strategy("bd3lm", "exact", gen_length=128, top_p=1.0, stop_at_eos=True).for_bd3(block_size, bd3.align)
        r = score(bd3.model, mtok, problems, strategy, batch_size=16, shots=shots)
        assert r["accuracy"] >= floor, (len(shots), [x["prediction"] for x in r["records"]])
        limit = -(-22 // block_size) * block_size  # answers are <= 21 tokens + EOS
        assert all(x["tokens_until_eos"] <= limit for x in r["records"]), "decoded past the EOS block"


def _shipped_runs(name: str, n: int, gen_length: int = 128):
    """The committed checkpoint ``name`` on ``n`` distinct held-out problems: semi-AR blocks of 32 and
    pure diffusion (one block) at ``gen_length``, 1 token/step; and semi-AR 32 with 4 worked examples on
    the first 8 at gen 64. Returns (its ArithConfig, semi, pure, few-shot) results."""
    ckpt = CKPT.parent / name
    assert ckpt.is_dir(), f"checkpoint {ckpt} is missing"
    from dlm import load_model
    model, mtok = load_model(ckpt)
    arith = arith_config_of(ckpt)
    problems = generate_problems(arith, n, split="test", seed=777, unique=True)
    semi, pure = (score(model, mtok, problems, Strategy("s", gen_length=gen_length, block_length=b), batch_size=n)
                  for b in (32, gen_length))
    few = score(model, mtok, problems[:8], Strategy("few", gen_length=64, block_length=32), batch_size=8,
                shots=fewshot_examples(arith, 4, seed=777))
    return arith, semi, pure, few


@pytest.mark.slow
def test_shipped_loop_checkpoint_pure_diffusion_commits_the_eos_tail_first():
    """The committed loop-task model (``ArithConfig(loop=True)``: the answer's length is known only once
    the loop is worked out) solves held-out problems with semi-AR blocks of 32, zero-shot and with 4
    worked examples. At gen 128 pure diffusion (one block) commits nearly all of its EOS tail before
    the answer is done; semi-AR only the tail inside the answer's last block."""
    G = 128
    arith, semi, pure, few = _shipped_runs("llada-loop", 16, G)
    assert arith.loop and (arith.min_steps, arith.max_steps) == (2, 3)
    for r in (semi, few):
        assert r["accuracy"] >= 0.5, [x["prediction"] for x in r["records"]]
    for x in semi["records"]:
        n = x["tokens_until_eos"]
        end = 32 * ((n - 1) // 32 + 1)  # end of the block that holds the answer's last token
        assert x["tail_before_answer"] <= (end - n + 1) / (G - n + 1) + 1e-4, x  # records round to 4 places
    tails = {name: [x["tail_before_answer"] for x in r["records"]] for name, r in (("semi", semi), ("pure", pure))}
    mean = {k: sum(v) / len(v) for k, v in tails.items()}
    assert mean["pure"] > 0.8 and mean["pure"] > mean["semi"] + 0.4, tails


@pytest.mark.slow
def test_shipped_chain_checkpoint_solves_chains_and_pure_diffusion_is_not_ahead():
    """The committed chain-task model (five stated steps, SFT rows mostly masked from a random cut to
    the end) solves held-out problems with semi-AR blocks of 32, zero-shot and with 4 worked
    examples; pure diffusion commits its EOS tail before the answer is done and is not more
    accurate on the same problems (measured here: 20/24 semi-AR, 19/24 pure, 5/8 4-shot; the
    testbed measures the gap on 500)."""
    arith, semi, pure, few = _shipped_runs("llada-chain", 24)
    assert not arith.loop and (arith.min_steps, arith.max_steps) == (5, 5)
    assert semi["accuracy"] >= 0.75, [x["prediction"] for x in semi["records"]]
    assert few["accuracy"] >= 0.5, [x["prediction"] for x in few["records"]]
    assert pure["accuracy"] <= semi["accuracy"], (semi["accuracy"], pure["accuracy"])
    tails = [x["tail_before_answer"] for x in pure["records"]]
    assert sum(tails) / len(tails) > 0.8, tails


def test_chain_control_differs_from_llada_chain_only_in_its_suffix_share():
    """``llada-chain-s50`` is the control of the README's suffix-share claim: the training arguments
    its checkpoint records are ``llada-chain``'s but for ``suffix_prob`` (and the run's paths)."""
    args = {}
    for name in ("llada-chain", "llada-chain-s50"):
        cfg = CKPT.parent / name / "config.json"
        assert cfg.is_file(), f"checkpoint {cfg.parent} is missing"
        args[name] = json.loads(cfg.read_text())["extra"]["args"]
    main, control = args["llada-chain"], args["llada-chain-s50"]
    assert main.keys() == control.keys()
    assert {k for k in main if main[k] != control[k]} == {"out", "init", "suffix_prob"}
    assert (main["suffix_prob"], control["suffix_prob"]) == (0.9, 0.5)


def test_repo_relative_keeps_results_free_of_machine_paths(tmp_path):
    from experiments.common import REPO, repo_relative
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
    from experiments.evaluate import check_resumable, existing_records

    log = JsonlLog(tmp_path / "x.jsonl")
    log.append([{"id": "a", "config_hash": "h1", "model_weights": "w1"}, {"id": "b", "config_hash": "h1"}])
    done = existing_records(log.path)
    check_resumable(done, log.path, "h1", "w1")
    with pytest.raises(ValueError, match="weights"):
        check_resumable(done, log.path, "h1", "w2")
    with pytest.raises(ValueError, match="config"):
        check_resumable(done, log.path, "h2", "w1")


def test_testbed_counts_distinct_problems_and_draws_unique_ones():
    from argparse import Namespace

    from dlm.tasks import problem_key
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
    from experiments import train_llada

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
