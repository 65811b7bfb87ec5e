"""What goes into a prompt is checked before the run (harness.prompt_checks): an over-long lm-eval
prompt is refused (or cut with a warning under ``truncate=left``), few-shot examples that are
evaluated test questions are refused, the mask token's text is refused and text the tokenizer
cannot represent is reported, each naming the file / problem / flag, before any forward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_gsm8k_harness import FakeClock, ckpt  # noqa: F401  (ckpt: fixture)

from experiments.eval import gsm8k
from harness.prompt_checks import check_shots_unseen, encode_prompts
from tasks import Problem, generate_problems
from tasks.tokenizer import build_tokenizer

REPO = Path(__file__).resolve().parents[1]


def _write(path: Path, problems, edit=None) -> Path:
    rows = [{"question": p.question, "answer": p.answer} for p in problems]
    for i, text in (edit or {}).items():
        rows[i]["question"] = text
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _harness(ckpt, data: Path, out: Path, *extra, clock=None):
    args = ["--model", str(ckpt), "--data", str(data), "--out", str(out), "--limit", "3", "--batch-size", "3",
            "--gen-length", "8", "--block-length", "4", "--dtype", "float64", "--strategies", "baseline_semiar", *extra]
    return gsm8k.run(gsm8k.parse_config(args), clock=clock or FakeClock())


def _nothing_written(out: Path) -> bool:
    return not list(out.glob("*.jsonl")) and not (out / "config.json").exists()


# ----------------------------------------------------------------------------- the GSM8K harness
def test_a_train_file_equal_to_the_test_file_is_refused_naming_the_file_and_ids(ckpt, tmp_path):
    test = _write(tmp_path / "test.jsonl", generate_problems(n=4, split="test"))
    (tmp_path / "train.jsonl").write_bytes(test.read_bytes())  # every shot is a test question with its answer
    clock, out = FakeClock(), tmp_path / "o"
    with pytest.raises(ValueError) as e:
        _harness(ckpt, test, out, "--num-fewshot", "2", clock=clock)
    msg = str(e.value)
    assert msg.startswith("--num-fewshot 2: ") and str(tmp_path / "train.jsonl") in msg
    assert "gsm8k-train-" in msg and "= gsm8k-test-" in msg and "\n" not in msg
    assert clock.calls == 0 and _nothing_written(out)
    # case and spacing do not hide a copy; distinct train questions pass
    shots = [Problem(p.id.replace("test", "train"), "  " + p.question.upper(), p.answer, p.target, "train")
             for p in generate_problems(n=2, split="test")]
    with pytest.raises(ValueError, match="2 of the 2 few-shot examples"):
        check_shots_unseen(shots, generate_problems(n=2, split="test"), "x/train.jsonl")
    check_shots_unseen(generate_problems(n=2, split="train"), generate_problems(n=2, split="test"), "x/train.jsonl")


def test_the_mask_tokens_text_in_a_question_is_refused_before_any_forward(ckpt, tmp_path):
    problems = generate_problems(n=3, split="test")
    data = _write(tmp_path / "test.jsonl", problems, {1: problems[1].question + " <|mask|>"})
    clock, out = FakeClock(), tmp_path / "o"
    with pytest.raises(ValueError) as e:
        _harness(ckpt, data, out, clock=clock)
    msg = str(e.value)
    assert msg.startswith(f"--data {data} on ") and "problem gsm8k-test-1's question holds '<|mask|>'" in msg
    assert "mask token (id 3)" in msg and clock.calls == 0 and _nothing_written(out)


def test_text_the_tokenizer_cannot_represent_is_reported_before_the_run(ckpt, tmp_path, capsys):
    problems = generate_problems(n=3, split="test")
    data = _write(tmp_path / "test.jsonl", problems, {2: problems[2].question + " 😀 日本"})
    with pytest.raises(RuntimeError, match="simulated kill"):  # the first sampler call never happens
        _harness(ckpt, data, tmp_path / "o", clock=FakeClock(kill_at=1))
    lines = [line for line in capsys.readouterr().err.splitlines() if "cannot represent" in line]
    assert lines == [(f"warning: --data {data} on {ckpt}: 1 of 3 prompts hold text the tokenizer cannot represent "
                      "(encoded as <|unk|>): gsm8k-test-2: '😀' '日' '本'")]
    tok = build_tokenizer()  # the unk token's own text is not reported
    encode_prompts(tok, [Problem("a", problems[0].question + " <|unk|>", "#### 3", 3, "test")], mask_id=3, where="w")
    assert "cannot represent" not in capsys.readouterr().err


def test_the_harness_refusal_of_an_over_long_prompt_names_the_problem(ckpt, tmp_path):
    clock, out = FakeClock(), tmp_path / "o"
    with pytest.raises(ValueError) as e:
        gsm8k.run(gsm8k.parse_config(["--model", str(ckpt), "--out", str(out), "--limit", "4", "--gen-length", "96",
                                      "--block-length", "32", "--strategies", "baseline_semiar"]), clock=clock)
    msg = str(e.value)
    assert msg.startswith("--data arith: problem test-") and "+ gen_length 96 exceeds max_seq_len=96" in msg
    assert "--num-fewshot or --gen-length" in msg and clock.calls == 0 and _nothing_written(out)


def test_every_committed_problem_set_encodes_cleanly(capsys):
    """The prompts of every committed harness run (results/*/config.json): no mask token, nothing
    the tokenizer cannot represent, no shot among the test questions, so the checks change none."""
    from dlm.checkpoints import load_tokenizer

    configs = sorted(REPO.glob("results/*/config.json"))
    runs = [json.loads(c.read_text())["argv"] for c in configs]
    runs = [a for a in runs if "--model" in a and (REPO / a[a.index("--model") + 1]).is_dir()]
    if not runs:
        pytest.skip("no committed harness runs with their checkpoints")
    for argv in runs:
        argv = [str(REPO / a) if a.startswith("results/") else a for a in argv]
        cfg = gsm8k.parse_config(argv)
        problems, shots = gsm8k.load_problems(cfg), gsm8k.load_shots(cfg)
        check_shots_unseen(shots, problems, cfg.data)
        for model in filter(None, (cfg.model, cfg.bd3_model)):
            mask_id = json.loads((Path(model) / "config.json").read_text())["mask_token_id"]
            encode_prompts(load_tokenizer(model), problems, shots, cfg.chat_template, mask_id=mask_id, where=model)
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- the lm-eval models
@pytest.fixture(scope="module")
def lm(ckpt):
    pytest.importorskip("lm_eval")
    from experiments.cli import lm_eval_models as lem

    return lem.FastDLLMEvalLM(pretrained=str(ckpt), gen_length=16, block_length=8, dtype="float64")


def _request(kind, *args, doc=None, doc_id=0):
    from lm_eval.api.instance import Instance

    return Instance(request_type=kind, doc=doc or {}, arguments=tuple(args), idx=0,
                    metadata=("gsm8k_local", doc_id, 1))


class _NoForward:
    def __init__(self, lm, monkeypatch):
        self.calls = 0
        monkeypatch.setattr(lm, "call", self)
        monkeypatch.setattr(lm, "score", self)

    def __call__(self, *args):
        self.calls += 1
        raise AssertionError("a forward ran")


def test_an_over_long_lm_eval_prompt_is_refused_unless_truncate_left(lm, ckpt, monkeypatch, capsys):
    from experiments.cli import lm_eval_models as lem

    long = "".join(f"Question: What is {i} + 1?\nAnswer: {i + 1}\n\n" for i in range(12)) + "Question: 2?\nAnswer:"
    n = len(lm.tokenizer.encode(long, add_special_tokens=False))
    assert n > 96 - 16
    stub = _NoForward(lm, monkeypatch)
    reqs = [_request("generate_until", "Question: 1?\nAnswer:", {"until": []}, doc_id=3),
            _request("generate_until", long, {"until": []}, doc_id=7)]
    with pytest.raises(ValueError) as e:
        lm.generate_until(reqs)
    assert str(e.value) == (f"gsm8k_local doc 7 (1 of 2 generate_until requests too long): the prompt ({n} tokens) "
                            "+ gen_length 16 exceeds max_seq_len=96: use fewer shots (--num_fewshot) or a smaller "
                            "gen_length, or pass truncate=left in --model_args to keep their last tokens")
    with pytest.raises(ValueError, match="gsm8k_local doc 7 .*continuation 2 exceeds max_seq_len=96"):
        lm.loglikelihood([_request("loglikelihood", long * 2, " 3", doc_id=7)])
    assert stub.calls == 0
    cut = lem.FastDLLMEvalLM(pretrained=str(ckpt), gen_length=16, block_length=8, dtype="float64", truncate="left")
    widths = []
    monkeypatch.setattr(cut, "call", lambda model, ids, mask, gen: widths.append(ids.shape[1]) or
                        lem.generate(model, ids, mask, cut.strategy, generator=gen))
    assert len(cut.generate_until(reqs)) == 2 and max(widths) == 96 - 16
    assert (f"warning: truncate=left: 1 of 2 generate_until prompts cut to their last tokens to fit max_seq_len=96 "
            f"(first: gsm8k_local doc 7, {n} tokens)") in capsys.readouterr().err
    with pytest.raises(ValueError, match="truncate must be 'no'"):
        lem.FastDLLMEvalLM(pretrained=str(ckpt), gen_length=16, block_length=8, truncate="right")


def test_lm_eval_prompts_with_the_mask_token_or_test_questions_as_shots_are_refused(lm, monkeypatch):
    stub = _NoForward(lm, monkeypatch)
    with pytest.raises(ValueError, match=r"^lm-eval generate_until: the prompt of gsm8k_local doc 1 holds "
                                         r"'<\|mask\|>', the text of the mask token \(id 3\)"):
        lm.generate_until([_request("generate_until", "Question: 1?\nAnswer:", {}, doc_id=0),
                           _request("generate_until", "Question: 2 <|mask|>?\nAnswer:", {}, doc_id=1)])
    with pytest.raises(ValueError, match="gsm8k_local doc 1: a few-shot example of its prompt is the test question "
                                         "of gsm8k_local doc 0"):
        lm.generate_until([_request("generate_until", "Question: What is 1?\nAnswer:", {},
                                    doc={"question": "What is 1?"}, doc_id=0),
                           _request("generate_until", "Question: What is  1?\nAnswer: 1\n\nQuestion: What is 2?\n"
                                    "Answer:", {}, doc={"question": "What is 2?"}, doc_id=1)])
    assert stub.calls == 0


def test_lm_eval_task_with_its_train_file_equal_to_the_test_file_is_refused(ckpt, tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    test = _write(tmp_path / "test.jsonl", generate_problems(n=3, split="test"))
    train = tmp_path / "train.jsonl"
    train.write_bytes(test.read_bytes())
    yaml_text = (REPO / "experiments" / "cli" / "lm_eval_tasks" / "gsm8k_local.yaml").read_text()
    yaml_text = (yaml_text.replace("../shared/data/gsm8k/train.jsonl", str(train))
                 .replace("../shared/data/gsm8k/test.jsonl", str(test))
                 .replace("  data_files:", f"  cache_dir: {tmp_path / 'hf'}\n  data_files:"))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "gsm8k_local.yaml").write_text(yaml_text)
    tm = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    with pytest.raises(ValueError, match=r"gsm8k_local doc \d: a few-shot example of its prompt is the test question"):
        lm_eval.simple_evaluate(model="fastdllm", model_args=f"pretrained={ckpt},gen_length=8,block_length=8,"
                                "dtype=float64", tasks=["gsm8k_local"], num_fewshot=1, limit=3, bootstrap_iters=0,
                                task_manager=tm)
