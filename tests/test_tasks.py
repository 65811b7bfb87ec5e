"""Tests for tasks: the procedural arithmetic generator and its chains (prompts and GSM8K:
test_task_prompts.py)."""

from __future__ import annotations

import re

import pytest

from tasks import (
    COT_STYLES,
    ArithConfig,
    Problem,
    extract_strict,
    generate_problems,
    iter_problems,
    parse_chain,
    problem_key,
    reasoning_lines,
    split_of_key,
)

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


# --------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("kwargs", "exc", "word"),
    [
        ({"min_steps": 0}, ValueError, "min_steps"),
        ({"min_steps": 3, "max_steps": 2}, ValueError, "max_steps"),
        ({"max_value": 1}, ValueError, "max_value"),
        ({"max_value": 5.0}, TypeError, "max_value"),
        ({"min_steps": True}, TypeError, "min_steps"),
        ({"ops": ()}, ValueError, "ops"),
        ({"ops": ("/",)}, ValueError, "ops"),
        ({"ops": ("+", "+")}, ValueError, "ops"),
        ({"ops": "+-"}, TypeError, "ops"),
        ({"max_factor": 1}, ValueError, "max_factor"),
        ({"cot": "long"}, ValueError, "cot"),
        ({"loop": 1}, TypeError, "loop"),
    ],
)
def test_config_rejects_bad_values(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        ArithConfig(**kwargs)


def test_config_coerces_ops_to_tuple_and_is_frozen():
    config = ArithConfig(ops=["+", "*"])
    assert config.ops == ("+", "*")
    with pytest.raises(AttributeError):
        config.max_value = 10  # type: ignore[misc]


# --------------------------------------------------------------------------- generator
def test_generation_is_deterministic_and_prefix_stable():
    first = generate_problems(ArithConfig(), 200, "train", seed=3)
    assert first == generate_problems(ArithConfig(), 200, "train", seed=3)
    assert first[:50] == generate_problems(ArithConfig(), 50, "train", seed=3)
    assert [p.question for p in first] != [p.question for p in generate_problems(ArithConfig(), 200, "train", seed=4)]
    assert [p.id for p in first[:3]] == ["train-3-0", "train-3-1", "train-3-2"]
    assert len({p.id for p in first}) == 200


def test_iter_problems_matches_generate_and_is_unbounded():
    stream = iter_problems(ArithConfig(), "test", seed=1)
    taken = [next(stream) for _ in range(30)]
    assert taken == generate_problems(ArithConfig(), 30, "test", seed=1)


def test_splits_are_disjoint_by_key():
    train = generate_problems(ArithConfig(), 5000, "train", seed=0)
    test = generate_problems(ArithConfig(), 1000, "test", seed=0)
    train_keys = {problem_key(p) for p in train}
    test_keys = {problem_key(p) for p in test}
    assert train_keys.isdisjoint(test_keys)
    assert all(split_of_key(k) == "train" for k in train_keys)
    assert all(split_of_key(k) == "test" for k in test_keys)
    assert {p.split for p in train} == {"train"} and {p.split for p in test} == {"test"}
    assert len(test_keys) > 500  # the test split is not degenerate


@pytest.mark.parametrize(
    "config",
    [ArithConfig(), ArithConfig(min_steps=2, max_steps=4, max_value=30), ArithConfig(ops=("+", "-", "*"), max_steps=3)],
)
def test_answers_are_correct_and_in_range(config):
    for p in generate_problems(config, 400, "train", seed=7):
        chain = parse_chain(p.answer)
        assert config.min_steps <= len(chain) <= config.max_steps
        current = chain[0][0]
        assert 1 <= current <= config.max_value
        for a, op, b, c in chain:
            assert op in config.ops
            assert a == current and OPS[op](a, b) == c
            assert 0 <= b <= config.max_value and 0 <= c <= config.max_value
            if op == "*":
                assert a <= config.max_factor and 2 <= b <= config.max_factor
            current = c
        assert p.target == current and isinstance(p.target, int)
        assert extract_strict(p.answer) == str(p.target)
        # The question mentions exactly the operands, in order.
        assert [int(x) for x in re.findall(r"\d+", p.question)] == [chain[0][0]] + [b for _, _, b, _ in chain]
        assert p.question.endswith("have?")


@pytest.mark.parametrize("config", [ArithConfig(min_steps=1, max_steps=3, max_value=9, loop=True),
                                    ArithConfig(ops=("+", "-", "*"), max_value=30, max_steps=4, loop=True)])
def test_loop_problems_spell_out_the_repeated_subtraction(config):
    """``loop=True``: after one stated step (not the last, unless it is the only one) the amount
    ``v`` loses ``b`` while at least ``b`` is left, one line per subtraction, and the later steps go
    on from ``v mod b``; answers of one question shape take many lengths; keys spell the
    subtractions out, so the splits stay disjoint."""
    lengths, places = set(), set()
    for split in ("train", "test"):
        for p in generate_problems(config, 300, split, seed=5):
            chain = parse_chain(p.answer)
            opening, *told, closing = re.split(r"(?<=\.) ", p.question)
            assert closing.startswith("How many")
            loops = [j for j, t in enumerate(told) if "as many times as" in t]
            assert len(loops) == 1
            j, stated = loops[0], [int(re.search(r"\d+", t)[0]) for t in told]
            assert 1 <= j and (j < len(told) - 1 or len(told) == 2)
            assert config.min_steps <= len(told) - 1 <= config.max_steps
            b = stated[j]
            assert re.fullmatch(rf"(He|She) [a-z ]+{b}[a-z ]* as many times as [A-Z][a-z]+ has {b}\.", told[j])
            v = chain[j - 1][3]
            assert 2 <= b <= max(2, v // 2)
            assert chain[j:j + v // b] == [(v - i * b, "-", b, v - (i + 1) * b) for i in range(v // b)]
            rest = chain[j + v // b:]
            assert [line[2] for line in chain[:j] + rest] == stated[:j] + stated[j + 1:]
            assert not rest or rest[0][0] == v % b
            assert int(re.search(r"\d+", opening)[0]) == chain[0][0]
            assert p.target == chain[-1][3] and split_of_key(problem_key(p)) == split
            lengths.add(len(p.answer))
            places.add((j, len(told) - 1))
    assert len(lengths) >= 5 and len(places) >= 3
    plain = ArithConfig(**{**config.__dict__, "loop": False})
    assert not any("many times" in p.question for p in generate_problems(plain, 300, "train", seed=5))


@pytest.mark.parametrize("config", [ArithConfig(max_value=9), ArithConfig(ops=("+", "-", "*"), max_steps=3)])
def test_verbose_cot_same_problems_retold_steps(config):
    """``cot="verbose"`` keeps the problem stream (questions, targets, keys, split) and retells
    every step in some phrasing of its operator before the same equation."""
    from tasks.arith import _STEP_TEMPLATES

    verbose_cfg = ArithConfig(**{**config.__dict__, "cot": "verbose"})
    terse = generate_problems(config, 300, "test", seed=2)
    verbose = generate_problems(verbose_cfg, 300, "test", seed=2)
    assert [(p.id, p.question, p.target) for p in verbose] == [(p.id, p.question, p.target) for p in terse]
    phrasings = {op: [re.escape(t).replace(re.escape("{b}"), r"(\d+)").replace(re.escape("{p}"), "(He|She)")
                      for t in ts] for op, ts in _STEP_TEMPLATES.items()}
    n_lines = set()
    for t, v in zip(terse, verbose):
        assert parse_chain(v.answer) == parse_chain(t.answer)
        assert problem_key(v) == problem_key(t)
        lines = v.answer.split("\n")
        name = t.question.split()[0]
        chain = parse_chain(t.answer)
        assert re.fullmatch(rf"{name} has {chain[0][0]} [a-z]+\.", lines[0])
        assert re.fullmatch(rf"{name} has {chain[-1][3]} [a-z]+\.", lines[-2])
        for line, terse_line, (a, op, b, c) in zip(lines[1:-2], t.answer.split("\n"), chain):
            retold, equation = line.rsplit(". ", 1)
            assert equation == terse_line
            match = next(re.fullmatch(ph, retold + ".") for ph in phrasings[op] if re.fullmatch(ph, retold + "."))
            assert int(match.group(2)) == b
        assert lines[-1] == f"#### {t.target}"
        n_lines.add(tuple(line.split()[1] for line in lines[1:-2]))
    assert len(n_lines) > 10  # the retold phrasing varies


@pytest.mark.parametrize("config", [ArithConfig(max_value=9), ArithConfig(ops=("+", "-", "*"), max_steps=3)])
@pytest.mark.parametrize("cot", ["checked", "final_check"])
def test_checked_cot_same_problems_optional_check_lines(config, cot):
    """``cot="checked"`` keeps the problem stream and the terse lines, and after each step
    writes its check (the inverse operation, in parentheses) or nothing, each about half the
    time, so one question's answers take several lengths; ``"final_check"`` does so after the
    last step only."""
    undo = {"+": "-", "-": "+", "*": "/"}
    checked_cfg = ArithConfig(**{**config.__dict__, "cot": cot})
    terse = generate_problems(config, 300, "test", seed=2)
    checked = generate_problems(checked_cfg, 300, "test", seed=2)
    assert [(p.id, p.question, p.target) for p in checked] == [(p.id, p.question, p.target) for p in terse]
    n_checks, n_checkable, patterns = 0, 0, set()
    for t, c in zip(terse, checked):
        chain = parse_chain(t.answer)
        assert parse_chain(c.answer) == chain and problem_key(c) == problem_key(t)
        expected = t.answer.split("\n")[:-1]
        lines = c.answer.split("\n")
        assert lines[-1] == f"#### {t.target}"
        pattern = []
        for line in lines[:-1]:  # brute force: the terse lines in order, each maybe followed by its check
            if line.startswith("("):
                a, op, b, r = chain[len(pattern) - 1]
                assert pattern and not pattern[-1] and line == f"({r} {undo[op]} {b} = {a})"
                pattern[-1] = True
            else:
                assert line == expected[len(pattern)]
                pattern.append(False)
        assert len(pattern) == len(chain)
        if cot == "final_check":
            assert not any(pattern[:-1])
        n_checks += sum(pattern)
        n_checkable += len(pattern) if cot == "checked" else 1
        patterns.add(tuple(pattern))
    assert 0.4 < n_checks / n_checkable < 0.6
    two_step = {(False, False), (False, True), (True, False), (True, True)}
    assert patterns & two_step == (two_step if cot == "checked" else {(False, False), (False, True)})
    with pytest.raises(ValueError, match="does not undo"):
        parse_chain("7 - 3 = 4\n(4 + 2 = 6)\n#### 4")
    with pytest.raises(ValueError, match="does not undo"):
        parse_chain("(4 + 3 = 7)\n7 - 3 = 4\n#### 4")


def test_multiplication_is_actually_used():
    problems = generate_problems(ArithConfig(ops=("+", "*")), 300, seed=0)
    assert sum("*" in p.answer for p in problems) > 50


def test_unique_keys_and_exhaustion():
    problems = generate_problems(ArithConfig(max_steps=1, max_value=10), 40, "train", seed=0, unique=True)
    assert len({problem_key(p) for p in problems}) == 40
    # 1-step problems with values <= 3 have only a handful of keys.
    with pytest.raises(ValueError, match="unique"):
        generate_problems(ArithConfig(max_steps=1, max_value=3), 50, "train", unique=True)


def test_generator_bad_inputs():
    with pytest.raises(ValueError, match="split"):
        generate_problems(ArithConfig(), 1, split="dev")
    with pytest.raises(ValueError, match="n"):
        generate_problems(ArithConfig(), -1)
    with pytest.raises(TypeError, match="config"):
        generate_problems({"max_value": 5}, 1)
    with pytest.raises(TypeError, match="seed"):
        generate_problems(ArithConfig(), 1, seed="0")
    assert generate_problems(ArithConfig(), 0) == []


def test_parse_chain_rejects_malformed():
    with pytest.raises(ValueError):
        parse_chain("1 + 2 = 3\n#### 4")
    with pytest.raises(ValueError):
        parse_chain("one plus two\n#### 3")
    assert parse_chain("1 + 2 = 3\n3 * 4 = 12\n#### 12") == [(1, "+", 2, 3), (3, "*", 4, 12)]
    verbose = "Ann has 1 pen.\nShe finds 2 more. 1 + 2 = 3\nAnn has 3 pens.\n#### 3"
    assert parse_chain(verbose) == [(1, "+", 2, 3)]
    with pytest.raises(ValueError):
        parse_chain("Ann has 1 pen.\nShe finds 2 more 1 + 2 = 3\n#### 3")
    with pytest.raises(ValueError):
        parse_chain("Ann has 1 pen.\n#### 1")


@pytest.mark.parametrize("cot", COT_STYLES)
def test_reasoning_lines_agrees_with_parse_chain_and_flags_wrong_lines(cot):
    """On reference answers ``reasoning_lines`` reads exactly ``parse_chain``'s lines, all right; a
    generated answer with a wrong result, check lines and garbage is read leniently, line by line."""
    config = ArithConfig(min_steps=1, max_steps=3, max_value=20, ops=("+", "-", "*"), cot=cot)
    for p in generate_problems(config, 50, split="train", seed=3):
        assert reasoning_lines(p.answer) == [(*line, True) for line in parse_chain(p.answer)]
    generated = " 8 - 6 = 2\n(2 + 6 = 8)\n2 * 3 = 5\n= = 4\nShe finds 1 more. 5 + 1 = 6\n#### 6"
    assert reasoning_lines(generated) == [(8, "-", 6, 2, True), (2, "*", 3, 5, False), (5, "+", 1, 6, True)]
    assert reasoning_lines("#### 6") == [] and reasoning_lines("") == []
    with pytest.raises(TypeError, match="text"):
        reasoning_lines(None)


def test_problem_validation():
    with pytest.raises(TypeError, match="target"):
        Problem(id="x", question="q", answer="#### 1", target=1.0, split="train")
    with pytest.raises(ValueError, match="target"):
        Problem(id="x", question="q", answer="#### 1", target="1.50", split="train")
    assert Problem(id="x", question="q", answer="#### 2.5", target="2.5", split="t").target_str == "2.5"


def test_the_problem_streams_are_those_of_the_committed_results():
    """The committed samples' problems regenerate: the arith stream of each embedded model's task
    gives the same question and target under the same id (a changed stream salt or generator
    would silently pair new problems with old answers)."""
    import json
    from pathlib import Path

    from harness.evaluate import fingerprint
    from harness.results import arith_config_of
    from tasks import generate_problems

    repo = Path(__file__).resolve().parents[1]
    for folder, model in (("gsm8k_arith_256", "llada-arith"), ("gsm8k_chain_256", "llada-chain"),
                          ("gsm8k_dream_256", "dream-arith")):
        path = repo / "results" / folder / "fastdllm_dual.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()[:20]]
        problems = generate_problems(arith_config_of(repo / "results" / "checkpoints" / model), 20, split="test")
        for p, r in zip(problems, records, strict=True):  # older samples record the target, not a fingerprint
            assert (p.id, fingerprint(p) if "problem" in r else p.target_str) == \
                (r["id"], r.get("problem", r["target"])), folder
