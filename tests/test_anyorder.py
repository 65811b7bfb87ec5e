"""The any-order tasks: generators produce solvable puzzles their checkers accept, the checkers
reject what a brute-force reading rejects, the shared test sets load, and the harness runs."""

import json
import random

import pytest
import torch

from tasks import countdown, reversal, sudoku
from dlm.checkpoints import load_model
from tasks.pairs import Pair, PairBatches
from dlm.tokenizer import build_word_tokenizer
from experiments.eval import anyorder
from tasks import anyorder as anyorder_tasks
from harness.results import read_jsonl


def test_sudoku_generator_and_checker():
    pairs = sudoku.generate(200, seed=1, split="test")
    assert len({p.id for p in pairs}) == 200 and all(sudoku.check(p, p.answer) for p in pairs)
    assert sudoku.generate(3, 1, "test") == pairs[:3] and sudoku.generate(3, 1, "train") != pairs[:3]
    p = pairs[0]
    grid = [int(c) for c in p.answer if c.isdigit()]
    swapped = grid[:]
    swapped[0], swapped[1] = swapped[1], swapped[0]  # rows stay permutations, columns break
    assert not sudoku.check(p, "".join(map(str, swapped)))
    # another valid grid that contradicts a clue is rejected; a grid equal to the solution passes
    clue = next(j for j, ch in enumerate(p.meta[0]) if ch != "0")
    other = next(g for g in (sudoku.solved_grid(random.Random(s)) for s in range(100))
                 if sum(g, [])[clue] != grid[clue])
    assert not sudoku.check(p, "".join(str(v) for v in sum(other, [])))
    assert not sudoku.check(p, "1234")  # too short


def test_sudoku_brute_force_validity():
    """check() accepts exactly the grids a direct row / column / box test accepts (no clues)."""
    rng = random.Random(0)
    free = Pair("x", "", "", ("0" * 16,))
    for _ in range(300):
        g = [rng.randint(1, 4) for _ in range(16)] if rng.random() < 0.5 else sum(sudoku.solved_grid(rng), [])
        rows = [g[r * 4:r * 4 + 4] for r in range(4)]
        ok = all(sorted(r) == [1, 2, 3, 4] for r in rows) and all(sorted(c) == [1, 2, 3, 4] for c in zip(*rows)) \
            and all(sorted(rows[r][c] for r in (br, br + 1) for c in (bc, bc + 1)) == [1, 2, 3, 4]
                    for br in (0, 2) for bc in (0, 2))
        assert sudoku.check(free, "".join(map(str, g))) == ok


def test_countdown_generator_and_checker():
    pairs = countdown.generate(300, seed=2, numbers=(3, 4))
    assert all(countdown.check(p, p.answer) for p in pairs)
    p = Pair("t", "Countdown: 15,44,79,50", "", ("15,44,79,50",))
    assert countdown.check(p, "44-15=29,79-29=50")
    assert not countdown.check(p, "44-15=29,79-29=51")  # wrong target
    assert not countdown.check(p, "44-15=28,79-28=51")  # false equation
    assert not countdown.check(p, "44-15=29,79-15=64")  # 15 used twice
    assert not countdown.check(p, "79-29=50")  # 29 not available
    assert not countdown.check(p, "44+15=59,59+79=138,138-88=50")  # 88 not available
    assert not countdown.check(p, "")
    found = {"44-15=29,79-29=50": (), "44-15=29,79-29=51": ("false equation", "target missed"),
             "": ("malformed", "target missed"), "44-15=29,79-15=64": ("number not available", "target missed"),
             "44+15=59": ("target missed",), "44-15=29,x": ("malformed", "target missed"),
             "25-17=1,10-1=60": ("false equation", "number not available", "target missed"),
             "79-29=50": ("number not available", "target missed")}  # 15 and 44 unused
    assert {out: countdown.faults(p, out) for out in found} == found
    assert countdown.pair_of_prompt("x", p.prompt, "") == Pair("x", p.prompt, "", p.meta)  # read back from a record
    with pytest.raises(ValueError, match="not a Countdown prompt"):
        countdown.pair_of_prompt("x", "Sudoku: 1234", "")
    rng = random.Random(0)  # check agrees with a first-fault reference on answers of every kind
    outs = [q.answer for q in pairs[:50]] + [q.answer.replace(rng.choice("0123456789"), rng.choice("0123456789"))
                                             for q in pairs[:150]]
    outs += ["".join(rng.choice("0123456789+-*/=,") for _ in range(12)) for _ in range(150)]
    for q, out in zip(pairs * 2, outs):
        assert countdown.check(q, out) == _first_fault_check(q, out), (q, out)


def _first_fault_check(pair, output) -> bool:
    """The checker as first written: stop at the first fault."""
    *given, target = [int(x) for x in pair.meta[0].split(",")]
    pool, result = list(given), None
    eqs = [e for e in output.replace(" ", "").strip().split(",") if e]
    for e in eqs:
        m = countdown.EQ.match(e)
        if not m or countdown._apply(int(m[1]), m[2], int(m[3])) != int(m[4]):
            return False
        for v in (int(m[1]), int(m[3])):
            if v not in pool:
                return False
            pool.remove(v)
        pool.append(int(m[4]))
        result = int(m[4])
    return bool(eqs) and result == target and len(pool) == 1


def test_reversal_corpus_split_and_checker():
    poems = reversal.corpus(n_poems=20)
    lines = [ln for poem in poems for ln in poem]
    assert len(set(lines)) == len(lines) == 80
    train = reversal.training_pairs(poems)
    drill, test = reversal.split(poems)
    assert not set(drill) & set(test)
    test_lines = {ln for p in test for ln in poems[p]}
    before_q = [t for t in train if t.id.startswith("reversal-before")]
    assert before_q and all(q.answer not in test_lines for q in before_q)  # reverse held out on test poems
    after_ids = {t.id for t in train if t.id.startswith("reversal-after")}
    assert {a.id for a in reversal.test_pairs(poems, "after")} <= after_ids  # forward relation trained
    before = reversal.test_pairs(poems, "before")
    assert len(before) == 30 and all(poems[int(b.id.split("-")[2])].index(b.answer) ==
                                     poems[int(b.id.split("-")[2])].index(b.prompt.split(": ")[1]) - 1 for b in before)
    assert reversal.check(before[0], before[0].answer + "\nmore") and not reversal.check(before[0], "zz zz")
    with pytest.raises(ValueError, match="direction"):
        reversal.test_pairs(poems, "sideways")
    drilled = reversal.drill_pairs(poems)  # the trained reverse questions, none about a test poem
    assert {d.id for d in drilled} == {t.id for t in before_q} and not {d.id for d in drilled} & {b.id for b in before}
    assert anyorder_tasks.test_set("reversal2_drill", 5) == reversal.drill_pairs(reversal.corpus())[:5]


def test_shared_test_sets_load_and_solve(shared_data):
    shared_data("reasoning/sudoku/d1_4x4_test_sudoku.csv"), shared_data("reasoning/countdown/cd3_test.jsonl")
    s = anyorder_tasks.test_set("sudoku", 50)
    c = anyorder_tasks.test_set("countdown", 50)
    assert len(s) == len(c) == 50
    assert all(sudoku.check(p, p.answer) for p in s) and all(countdown.check(p, p.answer) for p in c)


def test_pair_batches_layout():
    tok = build_word_tokenizer(sudoku.vocabulary())
    data = PairBatches(tok, sudoku.generate, 4, 24)
    b = data(0, torch.Generator().manual_seed(0))
    ids, starts = b["input_ids"], b["prompt_lengths"]
    assert ids.shape[0] == 4 and (ids[:, -1] == tok.eos_token_id).all()
    again = data(0, torch.Generator().manual_seed(0))
    assert torch.equal(again["input_ids"], ids)
    with pytest.raises(ValueError, match="response_len"):
        PairBatches(tok, sudoku.generate, 4, 8)(0, torch.Generator())
    with pytest.raises(ValueError, match="max_tail"):
        PairBatches(tok, sudoku.generate, 4, 24, max_tail=-1)
    jitter = PairBatches(tok, sudoku.generate, 4, 24, max_tail=8)
    widths = {jitter(s, torch.Generator().manual_seed(s))["input_ids"].shape[1] for s in range(40)}
    P = len(tok.encode(sudoku.generate(1)[0].prompt, add_special_tokens=False))
    assert widths == set(range(P + 24, P + 33))  # every tail length from 0 to max_tail extra columns


def test_harness_runs_and_reports(tmp_path, shared_data):
    shared_data("reasoning/countdown/cd3_test.jsonl")  # the harness scores the mirror's Countdown test set
    from experiments.train.train_anyorder import main as train

    small = ["--steps", "2", "--warmup", "1", "--batch-size", "4", "--d-model", "16", "--n-layers", "1",
             "--n-heads", "2", "--threads", "1"]
    for obj in ("ar", "diffusion"):
        train(["--task", "countdown", "--objective", obj, "--out", str(tmp_path / obj), *small])
    ar = tmp_path / "ar" / "model"
    train(["--task", "countdown", "--objective", "diffusion", "--init", str(ar), "--out", str(tmp_path / "adapted"),
           *small])
    adapted, _ = load_model(tmp_path / "adapted" / "model")
    assert adapted.config.shift_logits  # Dream's layout: the AR logits keep their meaning
    with pytest.raises(ValueError, match="tokenizer"):  # an AR model of another task cannot be adapted
        train(["--task", "sudoku", "--objective", "diffusion", "--init", str(ar), "--out", str(tmp_path / "x"), *small])
    anyorder.main(["--task", "countdown", "--ar", str(ar), "--mdm", str(tmp_path / "diffusion" / "model"),
                   "--adapted", str(tmp_path / "adapted" / "model"), "--arlong", str(ar), "--n", "4",
                   "--out", str(tmp_path / "res")])
    table = (tmp_path / "res" / "table.md").read_text()
    for row in ("ar", "pure", "semiar", "arlong", "dream", "dreamsa"):
        assert f"| countdown | {row} | 4 |" in table
    with pytest.raises(ValueError, match="required"):
        anyorder.main(["--task", "sudoku"])


def test_the_first_recipe_ar_row(tmp_path, shared_data):
    """``--family llada`` trains an AR model in LLaDA's layout (unshifted logits); the harness decodes it
    as ``ar`` into its own row, ``arfirst``, paired with the diffusion row."""
    shared_data("reasoning/sudoku/d1_4x4_test_sudoku.csv")  # the harness scores the mirror's Sudoku test set
    from experiments.train.train_anyorder import main as train

    small = ["--steps", "2", "--warmup", "1", "--batch-size", "4", "--d-model", "16", "--n-layers", "1",
             "--n-heads", "2", "--threads", "1"]
    train(["--task", "sudoku", "--objective", "ar", "--family", "llada", "--max-tail", "0", "--out",
           str(tmp_path / "first"), *small])
    train(["--task", "sudoku", "--objective", "diffusion", "--out", str(tmp_path / "mdm"), *small])
    first, _ = load_model(tmp_path / "first" / "model")
    assert not first.config.shift_logits and not first.config.qkv_bias
    ckpt = str(tmp_path / "first" / "model")
    anyorder.main(["--task", "sudoku", "--ar", ckpt, "--mdm", str(tmp_path / "mdm" / "model"), "--ar-first", ckpt,
                   "--n", "4", "--out", str(tmp_path / "res")])
    rows = {r["row"]: r for r in json.loads((tmp_path / "res" / "table.json").read_text())}
    assert rows["arfirst"]["vs"] == "pure" and rows["arfirst"]["n"] == 4
    same = [(a["prediction"], a["nfe"]) for a in read_jsonl(tmp_path / "res" / "sudoku_ar.jsonl")]
    assert [(a["prediction"], a["nfe"]) for a in read_jsonl(tmp_path / "res" / "sudoku_arfirst.jsonl")] == same
    with pytest.raises(ValueError, match="--ar-first .*: not a checkpoint directory"):
        anyorder.main(["--task", "sudoku", "--ar", ckpt, "--mdm", ckpt, "--ar-first", str(tmp_path / "no"),
                       "--out", str(tmp_path / "x")])


def test_reversal_gap_pairs_the_two_questions_about_a_fact(tmp_path):
    """The gap is forward minus reverse accuracy over the facts asked both ways, its CI Newcombe's
    paired interval of the fact-level 2x2 table; a gated model has no gap."""
    from harness.noninferiority import newcombe_paired

    poems = reversal.corpus()
    rng = random.Random(3)
    fwd = {p.id: rng.random() < 0.99 for p in reversal.test_pairs(poems, "after")}
    rev = {p.id: rng.random() < 0.4 for p in reversal.test_pairs(poems, "before")}
    rev.pop(next(iter(rev)))  # one fact asked forward only: left out of the gap
    for direction, ok in (("after", fwd), ("before", rev)):
        for row, flip in (("ar", False), ("pure", True)):  # the diffusion model fails forward: gated
            lines = [{"id": i, "correct": v and not flip} for i, v in ok.items()]
            (tmp_path / f"reversal2_{direction}_{row}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = {(r["task"], r["row"]): r for r in anyorder.report(tmp_path)["rows"]}
    pairs = [(fwd[i], rev[i.replace("after", "before")]) for i in fwd if i.replace("after", "before") in rev]
    counts = [sum(f and r for f, r in pairs), sum(f and not r for f, r in pairs), sum(r and not f for f, r in pairs)]
    diff, lo, hi = newcombe_paired(*counts, len(pairs) - sum(counts))
    got = rows[("reversal2_before", "ar")]
    assert got["facts"] == len(pairs) == len(fwd) - 1 and got["gap_pp"] == pytest.approx(-100 * diff)
    assert got["gap_ci_pp"] == pytest.approx([-100 * hi, -100 * lo]) and got["gap_ci_pp"][0] > 0
    assert rows[("reversal2_before", "pure")]["gated"] and "gap_pp" not in rows[("reversal2_before", "pure")]
    assert "| reversal2 | ar | 299 |" in (tmp_path / "table.md").read_text()
