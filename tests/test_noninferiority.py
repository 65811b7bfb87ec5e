"""Non-inferiority and chain-step accuracy in the harness tables (issue 51).

Every row of a harness table carries its accuracy change against the reference row with a paired
95% CI (Newcombe's hybrid score interval) and a verdict against the margin declared before the run
(``--margin``, recorded per strategy in config.json): none declared, the verdict says so. On the
arithmetic task, chain-step accuracy (every intermediate result right) stands beside the final
answer's, with its own McNemar test, computed from the records.
"""

from __future__ import annotations

import json

import pytest
from test_gsm8k_harness import FakeClock, ckpt  # noqa: F401  (ckpt: fixture)
from test_records_checked import record, write_run

from experiments.eval import gsm8k
from harness import noninferiority, report
from harness.chain_steps import chain_runs
from harness.cli import run_main
from harness.evaluate import fingerprint
from harness.noninferiority import NO_MARGIN, newcombe_paired, paired_change, verdict
from tasks import (
    ArithConfig,
    chain_steps_right,
    extract_flexible,
    extract_strict,
    generate_problems,
    is_correct,
)


# ------------------------------------------------------------------------------------ the interval
def test_newcombe_interval_matches_the_published_example():
    """Fagerland, Lydersen & Laake (2017), ch. 8 (Cavo et al. 2012: 59, 6 / 16, 80): -0.0621
    [-0.1186, -0.0046]. Counts here: both right, reference only, row only, neither."""
    diff, lo, hi = newcombe_paired(59, 16, 6, 80)
    assert (round(diff, 4), round(lo, 4), round(hi, 4)) == (-0.0621, -0.1186, -0.0046)
    assert newcombe_paired(59, 6, 16, 80) == pytest.approx((-diff, -hi, -lo))  # row and reference swapped


def test_no_discordant_problem_still_leaves_an_interval_that_shrinks_with_n():
    widths = []
    for n in (10, 100, 1000):
        diff, lo, hi = newcombe_paired(n // 2, 0, 0, n - n // 2)
        assert diff == 0 and lo < 0 < hi
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2] > 0
    with pytest.raises(ValueError, match="paired counts must be integers >= 0 with a positive sum"):
        newcombe_paired(0, 0, 0, 0)


def test_paired_change_pairs_by_problem_id_in_points():
    ref = [record(i) for i in range(8)]  # right on even i
    row = [record(i, "r", prediction=" 3 + 4 = 7\n#### 7", extracted="7", extracted_flexible="7", correct=True,
                  correct_flexible=True) for i in range(1, 8, 2)] + [record(50, "r")]  # odd ids: now right
    change = paired_change(ref, row)
    assert change["change_pp"] == pytest.approx(100.0)  # the 4 shared problems: 0/4 -> 4/4 (p50 unpaired)
    assert change["change_low_pp"] < 100 and change["change_high_pp"] == pytest.approx(100.0)


@pytest.mark.parametrize("lo,hi,margin,words", [
    (-2.0, 1.5, 3, "non-inferior"), (-2.9, -0.5, 3, "non-inferior (worse)"), (1.0, 4.0, 3, "non-inferior"),
    (-3.0, 1.0, 3, "inconclusive"), (-4.3, 1.6, 3, "inconclusive"), (-9.0, -3.0, 3, "inconclusive"),
    (-9.0, -3.1, 3, "inferior"), (-2.0, 1.5, None, NO_MARGIN)])
def test_verdicts_against_the_margin(lo, hi, margin, words):
    assert verdict(lo, hi, margin) == words


# ------------------------------------------------------------------------------------- the report
def two_rows(out, margins: dict):
    """baseline_semiar right on even ids of 200; the rows lose the problems named, margins as declared."""
    wrong = {"fastdllm_dual": range(0, 20, 2), "fastdllm_threshold": range(0, 200, 2), "fastdllm_prefix": range(0)}
    runs = {"baseline_semiar": [record(i) for i in range(200)]}
    for name, lost in wrong.items():
        runs[name] = [record(i, name, prediction=" 3 + 4 = 7\n#### 5", extracted="5", extracted_flexible="5",
                             correct=False, correct_flexible=False) if i in lost else record(i, name)
                      for i in range(200)]
    write_run(out, runs)
    cfg = json.loads((out / "config.json").read_text())
    for name, points in margins.items():
        cfg["strategies"][name]["margin"] = {"points": points, "reference": "baseline_semiar"}
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_the_table_gives_each_row_its_paired_ci_and_its_declared_margins_verdict(tmp_path):
    out = two_rows(tmp_path / "run", {"fastdllm_dual": 10, "fastdllm_threshold": 3})
    rep = report.build_report(out, n_resamples=50, plot=False)
    by = {r.strategy: r for r in rep.rows}
    assert by["fastdllm_dual"].change_pp == pytest.approx(-5.0)  # 10 of 200 lost
    assert by["fastdllm_dual"].verdict == "non-inferior (worse)" and by["fastdllm_dual"].margin_pp == 10
    assert by["fastdllm_threshold"].verdict == "inferior"  # every right answer lost: -50 points
    assert by["fastdllm_prefix"].verdict == NO_MARGIN and by["baseline_semiar"].verdict == "-"
    md = rep.table_md
    assert ("| strategy | accuracy % [95% CI] | McNemar p (b/c) | change vs baseline_semiar, points [paired 95% CI] | "
            "non-inferiority at margin | tokens/s |") in md
    assert "| fastdllm_prefix | 50.0 [" in md and "| +0.0 [-1.0, +1.0] | no margin declared |" in md
    assert "| -5.0 [-8.1, -1.8] | non-inferior (worse) at -10 |" in md and "| inferior at -3 |" in md
    assert "Newcombe's hybrid score interval for paired proportions" in md and "chain-step" not in md
    table = json.loads((out / "table.json").read_text())
    assert table["meta"]["noninferiority"]["margins_pp"] == {"fastdllm_dual": 10, "fastdllm_threshold": 3}
    header = rep.table_csv.split("\n")[0].split(",")
    assert header[-5:] == list(noninferiority.FIELDS) and "chain_accuracy" not in header


def test_a_malformed_margin_is_refused_naming_the_file_and_key(tmp_path, capsys):
    out = two_rows(tmp_path / "run", {"fastdllm_dual": "3"})
    with pytest.raises(SystemExit) as e:
        run_main(report.main, ["--out", str(out), "--resamples", "20", "--no-plot"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err == [
        (f"python -m harness.report: error: {out / 'config.json'}: strategies.fastdllm_dual.margin: expected "
         "{\"points\": P in (0, 100), \"reference\": STRATEGY}, got {'points': '3', 'reference': 'baseline_semiar'}")]
    assert not (out / "table.md").exists()


def test_a_margin_against_another_reference_is_not_this_tables(tmp_path, capsys):
    out = two_rows(tmp_path / "run", {"fastdllm_dual": 10})
    with pytest.raises(SystemExit) as e:
        run_main(report.main, ["--out", str(out), "--resamples", "20", "--no-plot", "--baseline", "fastdllm_prefix"])
    assert e.value.code == 0
    rows = {r["strategy"]: r for r in json.loads((out / "table.json").read_text())["rows"]}
    assert rows["fastdllm_dual"]["verdict"] == NO_MARGIN and rows["fastdllm_prefix"]["verdict"] == "-"


# ---------------------------------------------------------------------------------- chain steps
def test_chain_steps_right_needs_every_intermediate_result():
    p = generate_problems(ArithConfig(min_steps=3, max_steps=3), 1, split="test")[0]
    assert chain_steps_right(" " + p.answer, p)
    lines = p.answer.split("\n")
    a, op, b, _, c = lines[0].split(" ")
    wrong_first = " ".join([str(int(a) + 1), op, b, "=", str(int(c) + 1)])  # a different first step, same total
    assert not chain_steps_right("\n".join([wrong_first, *lines[1:]]), p)
    assert not chain_steps_right("\n".join(lines[:-1] + ["#### 999"]), p)  # every step right, final wrong
    assert not chain_steps_right(lines[-1], p)  # the final answer alone: right by the final answer only
    assert is_correct(lines[-1], p.target)
    checked = "\n".join([lines[0], f"({c} {'-' if op == '+' else '+'} {b} = {a})", *lines[1:]])
    assert chain_steps_right(checked, p)  # a check line is not a step


def arith_records(name: str, problems, predictions) -> list[dict]:
    """Records of ``problems`` (their fingerprints) with these predictions, scored as the harness does."""
    out = []
    for i, (p, pred) in enumerate(zip(problems, predictions)):
        ok = is_correct(pred, p.target)
        out.append(record(i, name, id=p.id, problem=fingerprint(p), target=p.target_str, prediction=pred,
                          extracted=extract_strict(pred), extracted_flexible=extract_flexible(pred), correct=ok,
                          correct_flexible=is_correct(pred, p.target, mode="flexible")))
    return out


def test_the_table_of_an_arith_run_has_chain_step_accuracy_with_its_own_test(tmp_path):
    problems = generate_problems(ArithConfig(), 30, split="test", seed=0)
    gold = [" " + p.answer for p in problems]

    def skewed(p):  # first line off by one, the rest as written: the final answer still right
        first, *rest = p.answer.split("\n")
        a, op, b, _, c = first.split(" ")
        return " " + "\n".join([f"{a} {op} {b} = {int(c) + 1}", *rest])

    runs = {"baseline_semiar": arith_records("baseline_semiar", problems, gold),
            "fastdllm_dual": arith_records("fastdllm_dual", problems, [skewed(p) for p in problems[:12]] + gold[12:])}
    out = write_run(tmp_path / "run", runs)
    cfg = json.loads((out / "config.json").read_text())
    for entry in cfg["strategies"].values():
        entry["config"].update(data="arith", model=str(tmp_path / "no-model"), seed=0)  # the default task
    (out / "config.json").write_text(json.dumps(cfg))
    rep = report.build_report(out, n_resamples=50, plot=False)
    dual = rep.rows[1]
    assert dual.accuracy == 1.0 and dual.chain_accuracy == pytest.approx(18 / 30) and dual.chain_discordant == "12/0"
    assert dual.mcnemar_p == 1.0 and dual.chain_mcnemar_p == pytest.approx(2 / 2 ** 12)
    assert "| chain-step % [95% CI] | chain-step McNemar p (b/c) |" in rep.table_md
    assert "| 60.0 [" in rep.table_md and "| 0.00049 (12/0) |" in rep.table_md
    assert rep.table_csv.split("\n")[0].endswith(",chain_mcnemar_p,chain_discordant")
    # a record of another problem than the regenerated one: no column, a note saying why
    assert chain_runs(out, runs)[1] is None
    bad = {**runs, "fastdllm_dual": runs["fastdllm_dual"][:3] + [{**runs["fastdllm_dual"][3], "problem": "0" * 12}]}
    chain, note = chain_runs(out, bad)
    assert chain is None and note == (f"chain-step accuracy not computed: fastdllm_dual.jsonl problem "
                                      f"{problems[3].id!r} is not the arithmetic problem regenerated from "
                                      f"{tmp_path / 'no-model'} (seed 0)")


# ----------------------------------------------------------------------------- --margin, declared
def harness_argv(model, out, *extra):
    return ["--model", str(model), "--out", str(out), "--limit", "4", "--batch-size", "2", "--gen-length", "16",
            "--block-length", "8", "--dtype", "float64", "--strategies", "baseline_semiar", "fastdllm_dual", *extra]


def test_the_margin_is_recorded_before_the_run_and_fixed_once_a_row_has_samples(ckpt, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    gsm8k.run(gsm8k.parse_config(harness_argv(ckpt, out, "--margin", "3")), clock=FakeClock())
    entries = json.loads((out / "config.json").read_text())["strategies"]
    assert entries["fastdllm_dual"]["margin"] == {"points": 3.0, "reference": "baseline_semiar"}
    assert "margin" not in entries["baseline_semiar"]  # no margin against itself
    table = json.loads((out / "table.json").read_text())
    dual = next(r for r in table["rows"] if r["strategy"] == "fastdllm_dual")
    assert dual["margin_pp"] == 3.0 and dual["verdict"] in ("non-inferior", "non-inferior (worse)", "inconclusive",
                                                            "inferior")
    assert table["meta"]["chain_steps"] == {"computed": True, "note": None}  # the embedded arith task
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    for extra, now in ((["--margin", "5"], "5.0 points against baseline_semiar"), ([], "none")):
        with pytest.raises(SystemExit) as e:
            run_main(gsm8k.main, harness_argv(ckpt, out, *extra))
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1, err
        assert err[0] == (f"python -m experiments.eval.gsm8k: error: --margin: {out / 'config.json'} declares 3.0 "
                          f"points against baseline_semiar for fastdllm_dual, whose samples exist; this run declares "
                          f"{now}. A margin is fixed before a row's first sample: pass the declared one, or run into "
                          "a new --out")
        clock = FakeClock()
        with pytest.raises(ValueError, match="--margin: "):
            gsm8k.run(gsm8k.parse_config(harness_argv(ckpt, out, *extra)), clock=clock)
        assert clock.calls == 0 and {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing written
    gsm8k.run(gsm8k.parse_config(harness_argv(ckpt, out, "--margin", "3")), clock=FakeClock())  # the same: resumes
    for bad in ("0", "-3", "100", "nan"):
        with pytest.raises(ValueError, match=r"--margin must be a number of accuracy points in \(0, 100\)"):
            gsm8k.parse_config(harness_argv(ckpt, out, "--margin", bad))
