"""The any-order training to convergence (issue 52): one tokenisation of a poem line in every
reversal format, the infilling probe, the fixed Countdown-3 set held out from the test set, the
answer-token loss without EOS padding, held-out curves with the flattening stop (resumable), and
the gate on the reverse direction."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dlm.attention import causal_mask
from dlm.objectives import ARSFTLoss, LLaDASFTLoss
from dlm.tokenizer import build_word_tokenizer
from experiments.eval import anyorder, curves, infill
from tasks import anyorder as anyorder_tasks
from harness import run_records as runs
from experiments.train import train_anyorder
from harness.results import read_jsonl
from tasks import countdown, reversal
from tasks.pairs import Epochs, Pair, PairBatches
from tests.tiny import tiny_dream

TOK = build_word_tokenizer(reversal.vocabulary())
SMALL = ["--batch-size", "4", "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--threads", "1",
         "--warmup", "1", "--eval-n", "4"]


def enc(text: str) -> tuple:
    return tuple(TOK.encode(text, add_special_tokens=False))


def line_tokens(version: str) -> dict[str, set]:
    """Every token sequence each poem line takes in the training formats of ``version``."""
    poems = reversal.corpus()
    seen: dict[str, set] = {}
    nl = TOK.convert_tokens_to_ids("\n")
    for pair in reversal.training_pairs(poems, version):
        answer = enc(" " + pair.answer)  # as PairBatches encodes it
        if pair.id.startswith("reversal-recite"):
            p = int(pair.id.split("-")[2])
            cuts = [-1, *[i for i, t in enumerate(answer) if t == nl], len(answer)]
            for line, a, b in zip(poems[p], cuts, cuts[1:]):
                seen.setdefault(line, set()).add(answer[a + 1:b])
        else:
            prompt = enc(pair.prompt)
            given = pair.prompt.split(": ", 1)[1]
            seen.setdefault(given, set()).add(prompt[len(enc(pair.prompt.split(":")[0] + ":")):])
            seen.setdefault(pair.answer, set()).add(answer)
    return seen


def test_reversal2_one_tokenisation_of_every_line():
    seen = line_tokens("v2")
    assert len(seen) == 800 and all(len(forms) == 1 for forms in seen.values())
    old = line_tokens("v1")  # the committed format: a line after "\n" starts unspaced
    assert sum(len(forms) > 1 for forms in old.values()) == 600
    assert TOK.convert_ids_to_tokens(list(next(iter(old["fe do no le"] - seen["fe do no le"]))))[0] == "fe"
    assert reversal.training_pairs(reversal.corpus(), "v1") == reversal.training_pairs(reversal.corpus())
    with pytest.raises(ValueError, match="format version"):
        reversal.recitation(["a"], "v3")


class Oracle(torch.nn.Module):
    """A model that knows row ``b`` of every batch is ``rows[b]``: its logits put all mass on that
    row's token at every position (the probe's rows of one length go through in order)."""

    def __init__(self, rows: list[list[int]], mask_id: int) -> None:
        super().__init__()
        self.rows, self.config = rows, SimpleNamespace(mask_token_id=mask_id, shift_logits=True)

    def forward(self, x, attn_mask=None):
        out = torch.zeros(*x.shape, len(TOK))
        for b in range(x.shape[0]):
            out[b, torch.arange(x.shape[1]), torch.tensor(self.rows[b])] = 30.0
        return out


def test_infill_probe_scores_a_known_fill():
    poems = reversal.corpus()
    pairs = reversal.infill_pairs(poems)[:8]
    assert [p.meta for p in pairs[:4]] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    rows = [infill.infill_row(TOK, p, poems, "v2", 40)[0] for p in pairs]
    assert len({len(r) for r in rows}) == 1  # one batch, in order
    for causal in (False, True):
        filled = infill.fill(Oracle(rows, TOK.mask_token_id), TOK, pairs, poems, "v2", causal, 40)
        assert [f["prediction"] for f in filled] == [p.answer for p in pairs]
        assert all(reversal.check(p, f["prediction"]) and f["nll"] < 1e-6 for p, f in zip(pairs, filled))
    # a model that learned another line there fills that line, scored wrong
    wrong = [list(r) for r in rows]
    ids, a, _ = infill.infill_row(TOK, pairs[1], poems, "v2", 40)
    wrong[1][a] = TOK.convert_tokens_to_ids("▁ba" if ids[a] != TOK.convert_tokens_to_ids("▁ba") else "▁be")
    filled = infill.fill(Oracle(wrong, TOK.mask_token_id), TOK, pairs, poems, "v2", False, 40)
    assert [reversal.check(p, f["prediction"]) for p, f in zip(pairs, filled)] == [True, False] + [True] * 6
    assert filled[1]["nll"] == pytest.approx(30 / 4, abs=1e-3)  # 30 nats on the first of the 4 words


def test_countdown_fixed_set_held_out_and_disjoint():
    drawn = countdown.fixed_set(2000, 0, "train")
    test = drawn[100:150]  # problems the training draw would otherwise hold
    train, valid = countdown.fixed_sets(2000, 0, test, valid_size=100)
    keys = [countdown.problem_key(p) for p in train]
    assert len(train) == len(set(keys)) == 2000 and len(valid) == 100
    assert not set(keys) & {countdown.problem_key(p) for p in test + valid}
    assert {countdown.problem_key(p) for p in test} <= {countdown.problem_key(p) for p in drawn}
    assert all(countdown.check(p, p.answer) and len(p.meta[0].split(",")) == 4 and int(p.meta[0].split(",")[-1]) <= 99
               for p in train)
    assert countdown.fixed_sets(2000, 0, test)[0] == train and countdown.fixed_sets(2000, 1, test)[0] != train


def test_countdown_fixed_set_disjoint_from_shared_test(shared_data):
    shared_data("reasoning/countdown/cd3_test.jsonl")
    test = anyorder_tasks.test_set("countdown", 10**9)
    train, valid = anyorder_tasks.countdown_sets(20000, 0, 100)
    assert len(test) == 1000 and len(train) == 20000
    assert not {countdown.problem_key(p) for p in train} & {countdown.problem_key(p) for p in test + valid}


def test_epochs_cover_the_set_once_per_epoch():
    pairs = tuple(Pair(str(i), "p", "a") for i in range(10))
    e = Epochs(pairs, seed=3)
    first = [p.id for s in range(5) for p in e.batch(s, 4)]  # 20 rows: two epochs exactly
    assert sorted(first[:10]) == sorted(first[10:]) == sorted(p.id for p in pairs)
    assert first[:10] != first[10:] and e.batch(2, 4) == e.batch(2, 4) and e.epoch(5, 4) == 2.0
    data = PairBatches(TOK, Epochs(tuple(reversal.training_pairs(reversal.corpus(), "v2")[:20])), 4, 32)
    assert torch.equal(data(7, torch.Generator().manual_seed(1))["input_ids"],
                       data(7, torch.Generator().manual_seed(1))["input_ids"])


def _batch():
    model = tiny_dream()  # EOS = 2, [MASK] = 39
    ids = torch.tensor([[5, 6, 7, 8, 9, 2, 2, 2], [5, 6, 10, 11, 2, 2, 2, 2]])
    return model, {"input_ids": ids, "prompt_lengths": torch.tensor([2, 2])}


@torch.no_grad()
def test_answer_loss_leaves_out_the_eos_padding():
    model, batch = _batch()
    ids = batch["input_ids"]
    answer = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    logits = model(ids, attn_mask=causal_mask(torch.arange(8), 8))
    ce = F.cross_entropy(logits.transpose(1, 2), ids, reduction="none")
    loss, metrics = ARSFTLoss()(model, batch)
    assert float(metrics["answer_loss"]) == pytest.approx(float(ce[answer].mean()))
    assert float(metrics["answer_loss"]) != pytest.approx(float(loss))  # the loss keeps the EOS columns
    noise = {"noise_t": torch.ones(2), "noise_u": torch.zeros(2, 8)}  # every answer column masked
    loss, metrics = LLaDASFTLoss(weighting="uniform")(model, {**batch, **noise}, torch.Generator())
    noisy = torch.where(torch.arange(8) >= 2, 39, ids)
    ce = F.cross_entropy(model(noisy).transpose(1, 2), ids, reduction="none")
    assert float(metrics["answer_loss"]) == pytest.approx(float(ce[answer].mean()))
    assert float(loss) == pytest.approx(float(ce[:, 2:].mean(1).mean()))  # the loss itself unchanged


def test_flat_criterion():
    assert not runs.flat([0.1, 0.5, 0.9], 2, 1.0)
    assert runs.flat([0.1, 0.5, 0.5, 0.505], 2, 1.0)  # 0.5 points in the last two evaluations
    assert not runs.flat([0.1, 0.5, 0.5, 0.52], 2, 1.0)
    assert not runs.flat([0.5, 0.5], 2, 0.0)  # too few evaluations
    assert runs.flat([0.5, 0.4, 0.3], 2, 0.0)
    assert not runs.flat([0.0, 0.0, 0.0, 0.0], 3, 2.0)  # still at the floor: not started, not flat
    assert runs.flat([0.0, 0.03, 0.03, 0.04, 0.03], 3, 2.0)
    assert runs.flat([0.72, 0.79, 0.81, 0.81, 0.80], 3, 2.0)  # exactly 2 points in float arithmetic
    assert not runs.flat([0.72, 0.79, 0.81, 0.82, 0.80], 3, 2.0)


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_curves_logged_stop_when_flat_and_resume(tmp_path, capsys, monkeypatch):
    base = ["--task", "reversal2", "--objective", "diffusion", "--steps", "6", "--eval-every", "2",
            "--save-every", "2", *SMALL]
    # a tiny model scores 0, and a curve at 0 never flattens: the held-out accuracy is a fixed 50%
    real = train_anyorder.eval_fn
    monkeypatch.setattr(train_anyorder, "eval_fn", lambda *a: lambda model: {**real(*a)(model), "accuracy": 0.5})
    train_anyorder.main([*base, "--out", str(tmp_path / "full")])
    recs = _records(tmp_path / "full")
    evals = [r for r in recs if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [2, 4, 6]
    assert all({"eval/accuracy", "eval/before", "eval/infill"} <= set(r) for r in evals)
    assert all("answer_loss" in r for r in recs if "loss" in r)
    # stopped when flat: any change within 100 points counts as flat, so it stops at the 2nd eval
    part = tmp_path / "part"
    train_anyorder.main([*base, "--out", str(part), "--stop-patience", "1", "--stop-delta", "100"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 4
    assert torch.load(part / "trainer_state.pt", weights_only=True)["step"] == 4
    train_anyorder.main([*base, "--out", str(part), "--stop-patience", "1", "--stop-delta", "100"])  # stays stopped
    assert torch.load(part / "trainer_state.pt", weights_only=True)["step"] == 4
    assert [r["step"] for r in _records(part) if "eval/accuracy" in r] == [2, 4]
    # resumed without the stop it ends where the uninterrupted run did
    train_anyorder.main([*base, "--out", str(part)])
    a = torch.load(tmp_path / "full" / "trainer_state.pt", weights_only=True)["model"]
    b = torch.load(part / "trainer_state.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r for r in _records(part) if "eval/accuracy" in r] == evals


def test_countdown_fixed_set_trains_in_epochs(tmp_path, capsys, shared_data):
    shared_data("reasoning/countdown/cd3_test.jsonl")
    train_anyorder.main(["--task", "countdown", "--objective", "ar", "--steps", "4", "--train-size", "8",
                         "--eval-every", "4", "--out", str(tmp_path / "cd"), *SMALL])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["epochs"] == 2.0 and out["steps"] == 4
    assert [r["step"] for r in _records(tmp_path / "cd") if "eval/accuracy" in r] == [4]


@pytest.mark.parametrize("args, message", [
    (["--task", "sudoku", "--train-size", "100"], "--train-size: only --task countdown has a fixed training set"),
    (["--task", "sudoku", "--stop-patience", "3"], "--stop-patience reads the held-out curve: it needs --eval-every"),
    (["--task", "sudoku", "--eval-n", "0"], "--eval-n must be >= 1, got 0"),
    (["--task", "sudoku", "--stop-delta", "-1"], "--stop-delta must be >= 0"),
])
def test_curve_flags_refused_before_anything(tmp_path, args, message):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        train_anyorder.main([*args, "--objective", "ar", "--out", str(out)])
    assert not out.exists()


def _write(path, oks):
    path.write_text("".join(json.dumps({"id": f"reversal-{path.stem.split('_')[1]}-{i}-0", "correct": ok}) + "\n"
                            for i, ok in enumerate(oks)))  # real ids: a fact's two questions share poem and line


def test_reverse_row_gated_on_forward_accuracy(tmp_path):
    _write(tmp_path / "reversal2_after_ar.jsonl", [True] * 20)
    _write(tmp_path / "reversal2_after_pure.jsonl", [True] * 18 + [False] * 2)  # 90%: below the gate
    _write(tmp_path / "reversal2_after_semiar.jsonl", [True] * 19 + [False])  # 95%: passes
    _write(tmp_path / "reversal2_before_ar.jsonl", [True] * 2 + [False] * 18)
    _write(tmp_path / "reversal2_before_pure.jsonl", [True] * 15 + [False] * 5)
    _write(tmp_path / "reversal2_before_semiar.jsonl", [True] * 10 + [False] * 10)
    _write(tmp_path / "reversal2_infill_pure.jsonl", [True] * 20)
    anyorder.report(tmp_path)
    table = (tmp_path / "table.md").read_text()
    assert "| reversal2_before | pure | 20 | did not learn the format (forward 90.0 < 95) | - | - |" in table
    assert "| reversal2_before | ar | 20 | 10.0 [2.8, 30.1] | - | - |" in table  # its pair is gated: no test
    assert "| reversal2_before | semiar | 20 | 50.0 [29.9, 70.1] | - | - |" in table
    assert "| reversal2_after | pure | 20 | 90.0" in table and "| reversal2_infill | pure | 20 | 100.0" in table
    rows = {(r["task"], r["row"]): r for r in json.loads((tmp_path / "table.json").read_text())}
    assert rows[("reversal2_before", "pure")] == {"task": "reversal2_before", "row": "pure", "n": 20, "gated": True,
                                                 "forward_accuracy": 0.9}
    assert "accuracy" in rows[("reversal2_before", "semiar")]
    _write(tmp_path / "reversal2_after_ar.jsonl", [True] * 18 + [False] * 2)
    anyorder.report(tmp_path)
    assert "| reversal2_before | ar | 20 | did not learn the format (forward 90.0 < 95) |" in (tmp_path / "table.md").read_text()
    assert read_jsonl(tmp_path / "reversal2_before_ar.jsonl")  # the samples are untouched


def test_infill_cli_rows(tmp_path):
    small = ["--steps", "2", *SMALL]
    for obj in ("ar", "diffusion"):
        train_anyorder.main(["--task", "reversal2", "--objective", obj, "--out", str(tmp_path / obj), *small])
    anyorder.main(["--task", "reversal2", "--infill", "--ar", str(tmp_path / "ar" / "model"), "--mdm",
                   str(tmp_path / "diffusion" / "model"), "--n", "4", "--out", str(tmp_path / "res")])
    table = (tmp_path / "res" / "table.md").read_text()
    for row in ("ar", "pure"):
        recs = read_jsonl(tmp_path / "res" / f"reversal2_infill_{row}.jsonl")
        assert len(recs) == 4 and all({"prediction", "nll", "correct"} <= set(r) for r in recs)
        assert f"| reversal2_infill | {row} | 4 |" in table
    assert not (tmp_path / "res" / "reversal2_infill_semiar.jsonl").exists()
    with pytest.raises(ValueError, match="--infill probes the reversal tasks only, not --task sudoku"):
        anyorder.main(["--task", "sudoku", "--infill", "--ar", str(tmp_path / "ar" / "model"), "--mdm",
                       str(tmp_path / "ar" / "model"), "--out", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()


def test_grid_pick_is_accuracy_then_tail_loss_then_lr():
    """The pick, against a brute-force reading of the rule on hand-made records: the best final
    accuracy; among ties the lower mean loss after the second-to-last evaluation; then the smaller LR.
    Unfinished runs, continuations and runs of another cap are not in the grid."""
    from experiments.eval.curves import picks

    def rec(name, lr, final, tail, **kw):
        r = {"run": name, "task": "countdown", "objective": "diffusion", "lr": lr, "cap": 30, "init": None,
             "finished": True, "evals": [[10, 0.0], [20, 0.1], [30, final]],
             "losses": [[10, 9.0], [20, 9.0], [25, tail - 0.1], [30, tail + 0.1]]}
        return {**r, **kw}

    runs = [rec("a", 0.002, 0.0, 1.3), rec("b", 0.001, 0.0, 1.2), rec("c", 0.0005, 0.0, 1.2),
            rec("d", 0.004, 0.5, 2.0, finished=False), rec("e", 0.003, 0.5, 2.0, init="ar"),
            rec("f", 0.002, 0.2, 5.0, cap=60)]
    got = {k: r["run"] for k, r in picks(runs).items()}
    assert got == {"countdown diffusion, cap 30": "c"}  # f is alone at its cap: no grid
    runs.append(rec("g", 0.001, 0.01, 4.0))  # one item more right beats any loss
    assert picks(runs)["countdown diffusion, cap 30"]["run"] == "g"


def test_countdown_fixed_set_refused_without_the_test_set(tmp_path):
    """Disjointness cannot be checked without the shared CD3 test set: the run stops naming the file."""
    out = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match="reasoning/countdown/cd3_test.jsonl"):
        train_anyorder.main(["--task", "countdown", "--objective", "ar", "--train-size", "5", "--out", str(out)])
    assert not out.exists()


def test_curves_report_reads_each_run_and_picks_the_grid_lr(tmp_path):
    """Two finished runs of an LR grid and one still training: the report's curves are the runs'
    metrics, the stop column their run.json, and the pick the LR with the best final accuracy."""
    from experiments.eval import curves as report

    base = ["--task", "reversal2", "--objective", "ar", "--eval-every", "2", "--save-every", "2", *SMALL]
    for lr, steps in (("0.002", "4"), ("0.0005", "4")):
        train_anyorder.main([*base, "--lr", lr, "--steps", steps, "--out", str(tmp_path / f"ar-{lr}")])
    running = tmp_path / "ar-busy"
    train_anyorder.main([*base, "--lr", "0.001", "--steps", "4", "--init", str(tmp_path / "ar-0.002" / "model"),
                         "--out", str(running)])
    (running / "run.json").unlink()  # as if still training
    got = report.main(["--runs", *(str(p) for p in sorted(tmp_path.glob("ar-*"))), "--out", str(tmp_path / "c")])
    by = {r["run"]: r for r in got["runs"]}
    for name, r in by.items():
        evals = [(m["step"], m["eval/accuracy"]) for m in _records(tmp_path / name) if "eval/accuracy" in m]
        assert [tuple(e) for e in r["evals"]] == evals and r["steps"] == 4
    assert not by["ar-busy"]["finished"] and by["ar-0.002"]["finished"] and not by["ar-0.002"]["stopped_flat"]
    assert len(by["ar-0.002"]["git_sha"]) >= 40 and by["ar-busy"]["init"] == "ar-0.002" and not by["ar-0.002"]["init"]
    finals = {lr: by[f"ar-{lr}"]["evals"][-1][1] for lr in ("0.002", "0.0005")}
    best = max(finals.values())
    tied = [by[f"ar-{lr}"] for lr, a in finals.items() if a == best]
    tail = {r["lr"]: np.mean([v for s, v in r["losses"] if s > 2]) for r in tied}  # the steps after eval 2 of 4
    assert got["picks"]["reversal2 ar, cap 4"]["lr"] == min(tail, key=lambda lr: (tail[lr], lr))
    md = (tmp_path / "c" / "curves.md").read_text()
    assert "| reversal2 | ar | 0.001 | 4 / 4 | training |" in md and (tmp_path / "c" / "curves.png").stat().st_size
    with pytest.raises(ValueError, match="not an experiments.train.train_anyorder run"):
        report.main(["--runs", str(tmp_path / "c"), "--out", str(tmp_path / "d")])
    # the finished runs' records, as the plan commits them, give the same report as their dirs
    records = tmp_path / "records"
    records.mkdir()
    for lr in ("0.002", "0.0005"):
        (records / f"ar-{lr}.json").write_bytes((tmp_path / f"ar-{lr}" / "record.json").read_bytes())
    report.main(["--runs", *(str(tmp_path / f"ar-{lr}") for lr in ("0.002", "0.0005")), "--out", str(tmp_path / "e")])
    report.main(["--records", str(records), "--out", str(tmp_path / "f")])
    assert (tmp_path / "f" / "curves.md").read_text() == (tmp_path / "e" / "curves.md").read_text()
    assert str(tmp_path) not in (records / "ar-0.002.json").read_text()  # no machine path in a record
    assert str(tmp_path) not in (tmp_path / "ar-0.002" / "model" / "config.json").read_text()  # nor in the model
    with pytest.raises(ValueError, match="runs named twice"):
        report.main(["--records", str(records), "--runs", str(tmp_path / "ar-0.002"), "--out", str(tmp_path / "g")])


def test_run_json_sums_the_invocations_and_a_rerun_adds_none(tmp_path):
    """Each invocation that trains appends its steps and seconds; a killed one keeps its commit and
    steps, its seconds unknown; a finished run rerun (no step trained) leaves the sums as they were."""
    base = ["--task", "reversal2", "--objective", "ar", "--steps", "2", "--out", str(tmp_path / "r"), *SMALL]
    train_anyorder.main(base)
    first = json.loads((tmp_path / "r" / "run.json").read_text())
    assert [(i["from_step"], i["to_step"]) for i in first["invocations"]] == [(0, 2)] and first["cpu_steps"] == 2
    train_anyorder.main(base)
    assert json.loads((tmp_path / "r" / "run.json").read_text())["invocations"] == first["invocations"]
    summary = {"steps": 5, "stopped_flat": False}
    runs.begin_invocation(tmp_path / "r", 2, "c" * 40)  # killed at step 3: its commit and steps stay
    runs.begin_invocation(tmp_path / "r", 3, "b" * 40)
    got = runs.add_invocation(tmp_path / "r", summary, {"from_step": 3, "to_step": 5, "cpu_seconds": 1.5,
                                                          "wall_seconds": 2.0, "git_sha": "b" * 40})
    assert [(i["from_step"], i["to_step"], i["cpu_seconds"]) for i in got["invocations"][1:]] == [(2, 3, None),
                                                                                                (3, 5, 1.5)]
    assert got["cpu_seconds"] == first["cpu_seconds"] + 1.5 and got["cpu_steps"] == 4  # step 2-3's seconds unknown
    record = runs.run_record(tmp_path / "r")
    assert record["git_sha"] == f"{first['invocations'][0]['git_sha']} {'c' * 40} {'b' * 40}" and record["steps"] == 5
    assert curves.cpu_cell(record).endswith("(4 of 5 steps)") and curves.cpu_cell({**record, "cpu_steps": 0}) == "unknown"
    (tmp_path / "r" / "run.json").unlink()  # a killed run resumed only to be stopped: that invocation counts
    runs.begin_invocation(tmp_path / "r", 5, "d" * 40)
    got = runs.add_invocation(tmp_path / "r", summary, {"from_step": 5, "to_step": 5, "cpu_seconds": 0.5,
                                                          "wall_seconds": 0.6, "git_sha": "d" * 40})
    assert got["invocations"][-1]["git_sha"] == "d" * 40 and got["cpu_steps"] == 4
    (tmp_path / "r" / "invocations.jsonl").write_text("")  # an end whose start was never logged still counts
    got = runs.add_invocation(tmp_path / "r", summary, {"from_step": 0, "to_step": 5, "cpu_seconds": 2.0,
                                                          "wall_seconds": 2.0, "git_sha": "e" * 40})
    assert [i["git_sha"] for i in got["invocations"]] == ["e" * 40] and got["cpu_steps"] == 5


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.pop("evals"), "missing evals"),
    (lambda r: r.update(evals=[[1000, 1.5]]), "accuracy in"),
    (lambda r: r.update(evals=[[2000, 0.1], [1000, 0.2]]), "rising steps"),
    (lambda r: r.update(run="other"), "the file's name"),
])
def test_a_tampered_record_is_refused_naming_the_file(tmp_path, edit, message):
    train_anyorder.main(["--task", "reversal2", "--objective", "ar", "--steps", "2", "--eval-every", "2",
                         "--out", str(tmp_path / "r"), *SMALL])
    record = json.loads((tmp_path / "r" / "record.json").read_text())
    path = tmp_path / "r.json"
    path.write_text(json.dumps(record))
    assert runs.read_record(path) == record  # as written, it reads
    edit(record)
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=f"{path}: .*{message}"):
        runs.read_record(path)


def test_the_committed_curves_are_what_their_records_give(tmp_path):
    """Every committed run record passes the check, and the committed curves.md / curves.json are
    what the report renders from those records."""
    from experiments.eval import curves as report
    from harness.results import REPO

    committed = REPO / "results" / "anyorder" / "curves"
    assert sorted(committed.glob("runs/*.json"))  # the grid's finished runs
    report.main(["--records", str(committed / "runs"), "--out", str(tmp_path)])
    for name in ("curves.md", "curves.json"):
        assert (tmp_path / name).read_text() == (committed / name).read_text(), name
