"""Tests for tasks: prompts, few-shot draws, GSM8K answer extraction and loading."""

from __future__ import annotations

import json
import sys

import pytest

from tasks import (
    DEFAULT_TEMPLATE,
    ArithConfig,
    extract_flexible,
    extract_strict,
    fewshot_examples,
    format_prompt,
    generate_problems,
    is_correct,
    load_gsm8k,
    normalize_number,
    problem_key,
    sample_shots,
)


# --------------------------------------------------------------------------- prompts
def test_format_prompt_layout():
    shots = fewshot_examples(ArithConfig(), k=2, seed=0)
    prompt = format_prompt("Q?", shots)
    expected = "".join(f"Question: {s.question}\nAnswer: {s.answer}\n\n" for s in shots) + "Question: Q?\nAnswer:"
    assert prompt == expected
    assert format_prompt("Q?") == "Question: Q?\nAnswer:"
    assert prompt + DEFAULT_TEMPLATE.completion("7") == prompt + " 7"


def test_fewshot_examples_are_distinct_train_problems():
    shots = fewshot_examples(ArithConfig(), k=10, seed=5)
    assert len(shots) == 10 and all(s.split == "train" for s in shots)
    assert len({problem_key(s) for s in shots}) == 10
    assert fewshot_examples(ArithConfig(), k=10, seed=5) == shots
    assert fewshot_examples(k=0) == []


def test_prompt_bad_inputs():
    with pytest.raises(ValueError, match="k"):
        fewshot_examples(ArithConfig(), k=-1)
    with pytest.raises(TypeError, match="question"):
        format_prompt(3)
    with pytest.raises(TypeError, match="shots"):
        format_prompt("q", [{"question": "a", "answer": "b"}])
    with pytest.raises(TypeError, match="template"):
        format_prompt("q", (), template="Question: {q}")


def test_sample_shots():
    pool = generate_problems(ArithConfig(), 20, seed=0)
    shots = sample_shots(pool, 5, seed=1, exclude_id=pool[0].id)
    assert len({s.id for s in shots}) == 5 and pool[0] not in shots
    assert sample_shots(pool, 5, seed=1, exclude_id=pool[0].id) == shots
    with pytest.raises(ValueError, match="k"):
        sample_shots(pool, 21)


# --------------------------------------------------------------------------- extraction
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1,234.50", "1234.5"),
        ("$1,234.00", "1234"),
        ("+7", "7"),
        ("12.", "12"),
        ("-0", "0"),
        ("007", "7"),
        (".5", "0.5"),
        (" -3.10 ", "-3.1"),
        ("abc", None),
        ("", None),
        ("-", None),
        ("1e5", None),
    ],
)
def test_normalize_number(raw, expected):
    assert normalize_number(raw) == expected


@pytest.mark.parametrize(
    ("text", "strict", "flexible"),
    [
        ("She pays $1,234.00 in total.", None, "1234"),
        ("so 2 - 7 = -5\n#### -5", "-5", "-5"),
        ("The answer is 12.", None, "12"),
        ("no number here", None, None),
        ("#### $1,234.50", "1234.5", "1234.5"),
        ("#### 18\n#### 20", "18", "20"),
        ("####", None, None),
        ("#### many, 4", None, "4"),
        ("between 3-5 apples", None, "5"),
        ("x1 and 2.5.", None, "2.5"),
        ("####7", "7", "7"),
    ],
)
def test_extraction(text, strict, flexible):
    assert extract_strict(text) == strict
    assert extract_flexible(text) == flexible


def test_is_correct():
    assert is_correct("12 + 7 = 19\n#### 19", 19)
    assert is_correct("#### 1,234.00", "1234")
    assert is_correct("#### 2.50", 2.5)
    assert not is_correct("19", 19, mode="strict")
    assert is_correct("it is 19", 19, mode="flexible")
    assert not is_correct("#### 18", 19)
    with pytest.raises(ValueError, match="mode"):
        is_correct("#### 1", 1, mode="loose")
    with pytest.raises(ValueError, match="target"):
        is_correct("#### 1", "one")
    with pytest.raises(TypeError, match="text"):
        extract_strict(None)


# --------------------------------------------------------------------------- GSM8K loading
def test_real_gsm8k_test_answers_all_parse(shared_data):
    path = shared_data("gsm8k/test.jsonl")
    problems = load_gsm8k(path, split="test")
    assert len(problems) == 1319
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for problem, row in zip(problems, rows):
        gold = extract_strict(row["answer"])
        assert gold is not None
        assert str(problem.target) == gold
        assert is_correct(row["answer"], problem.target)
    assert problems[0].id == "gsm8k-test-0" and problems[0].target == 18
    assert load_gsm8k(path.parent, split="test")[5] == problems[5]


def test_load_gsm8k_local_file_and_errors(tmp_path, monkeypatch):
    path = tmp_path / "mini.jsonl"
    path.write_text(
        json.dumps({"question": "q1", "answer": "1 + 1 = 2\n#### 2"}) + "\n\n"
        + json.dumps({"question": "q2", "answer": "half\n#### 2.50"}) + "\n",
        encoding="utf-8",
    )
    problems = load_gsm8k(path, split="train")
    assert [p.target for p in problems] == [2, "2.5"]
    assert [p.id for p in problems] == ["gsm8k-train-0", "gsm8k-train-1"]
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_gsm8k(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="answer"):
        load_gsm8k(bad)
    bad.write_text("{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_gsm8k(bad)
    with pytest.raises(ValueError, match="split"):
        load_gsm8k(path, split="")
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ValueError, match="needs the 'datasets' package .* or pass a local JSONL"):
        load_gsm8k("openai/gsm8k")  # a user error, one line: no ImportError traceback
