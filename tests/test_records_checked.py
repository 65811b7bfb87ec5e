"""Records are checked, not trusted (issue 50, cases 5 and 9).

The report and every resume read a per-sample file through one check (harness.records): an
edited record (``correct`` that its prediction does not score, a negative time, a token count
beyond the gen length, a missing field) is refused with one line naming the file, line, problem
id and field, and nothing is written. Rows over different problems are noted in the table, or
restricted to the common problems on request; a row sharing no problem with the reference is
refused. Every committed per-sample file passes, and every committed table is what the report
computes from its records.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from test_gsm8k_harness import ckpt  # noqa: F401  (the tiny harness checkpoint fixture)

from experiments.eval import gsm8k
from harness import chain_steps, noninferiority, report
from harness.cli import run_main
from harness.evaluate import evaluate, existing_records
from harness.records import (
    CORE,
    REPORT,
    Expected,
    check_records,
    expected_of,
    read_records,
)
from harness.results import JsonlLog, read_jsonl

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
FACTORS = {"kind": "baseline", "cache": "none", "parallel": "none", "stop_at_eos": False, "block_length": 8}


def record(i: int, name: str = "baseline_semiar", **over) -> dict:
    """A valid per-sample record of problem ``p{i}`` (right on even i)."""
    answer = "7" if i % 2 == 0 else "5"
    return {"id": f"p{i}", "index": i, "strategy": name, "config_hash": f"h-{name}", "seed": 0,
            "prompt_length": 20, "prediction": f" 3 + 4 = 7\n#### {answer}", "extracted": answer,
            "extracted_flexible": answer, "target": "7", "correct": i % 2 == 0, "correct_flexible": i % 2 == 0,
            "nfe": 16, "steps": 16, "positions_computed": 400, "flops": 10_000, "refreshes": 16,
            "tokens_committed": 16, "tokens_until_eos": 9, "first_eos_step": 8, "tail_before_answer": 0.0,
            "seconds": 0.5, "batch_rows": 4, "batch_width": 22, "cost_basis": "row", "factors": FACTORS,
            "git_sha": "g", "model_weights": "w", **over}


def write_run(out: Path, runs: dict[str, list[dict]], gen_length: int = 16) -> Path:
    """A harness folder: ``<name>.jsonl`` per row and a config.json naming each row's config."""
    out.mkdir(parents=True, exist_ok=True)
    for name, records in runs.items():
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    strategies = {name: {"config_hash": f"h-{name}", "config": {"strategy": {"name": name, "gen_length": gen_length}},
                         "model_weights": "w"} for name in runs}
    (out / "config.json").write_text(json.dumps({"baseline": "baseline_semiar", "strategies": strategies}))
    return out


def report_cli(out: Path, capsys, *extra) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        run_main(report.main, ["--out", str(out), "--resamples", "20", "--no-plot", *extra])
    return e.value.code, capsys.readouterr().err


# ------------------------------------------------------------------------- case 5: the report
TAMPERED = [  # (line 3 = problem p2 becomes, field named, words of the reason)
    ({"correct": 20, "seconds": -5}, "correct", "must be true or false, got 20"),
    ({"seconds": -5}, "seconds", "finite number > 0"),
    ({"seconds": float("nan")}, "seconds", "finite number > 0"),
    ({"correct": False}, "correct", "scores true"),
    ({"tokens_until_eos": 90}, "tokens_until_eos", "exceeds tokens_committed 16"),
    ({"tokens_committed": 160, "tokens_until_eos": 90}, "tokens_until_eos", "exceeds gen_length 16"),
    ({"tokens_committed": 160}, "tokens_committed", "exceeds gen_length 16 ("),
    ({"extracted": "8"}, "extracted", "'prediction' gives '7'"),
    ({"nfe": True}, "nfe", "integer >= 0"),
    ({"steps": -1}, "steps", "integer >= 0"),
    ({"refreshes": 17}, "refreshes", "exceeds steps 16"),
    ({"tokens_until_eos": 0}, "tokens_until_eos", "integer >= 1"),
    ({"target": "7.0"}, "target", "normalised number"),
    ({"strategy": "fastdllm_dual"}, "strategy", "in the file of 'baseline_semiar': it holds another row's"),
    ({"config_hash": "h-other"}, "config_hash", "holds another run's samples"),
    ({"prompt_length": 30}, "batch_width", "below prompt_length 30"),
    ({"tail_before_answer": 1.5}, "tail_before_answer", "[0, 1]"),
]


@pytest.mark.parametrize("change,field,why", TAMPERED)
def test_an_edited_record_is_refused_naming_file_line_problem_and_field(tmp_path, capsys, change, field, why):
    runs = {"baseline_semiar": [record(i) for i in range(6)]}
    runs["baseline_semiar"][2] = {**runs["baseline_semiar"][2], **change}
    out = write_run(tmp_path / "run", runs)
    code, err = report_cli(out, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"python -m harness.report: error: {out / 'baseline_semiar.jsonl'}: line 3, "
                               f"problem 'p2', field '{field}': ")
    assert why in lines[0]
    assert sorted(p.name for p in out.iterdir()) == ["baseline_semiar.jsonl", "config.json"]  # nothing written


def test_the_issue_case_correct_true_and_tokens_times_ten_are_refused(tmp_path):
    """100% and 157.56x from a flipped ``correct`` and tokens_until_eos x 10: both refused."""
    recs = [record(i) for i in range(6)]
    flipped = [{**r, "correct": True} for r in recs]
    with pytest.raises(ValueError, match=r"line 2, problem 'p1', field 'correct': is true but the strict answer "
                                         r"of 'prediction' \('5'\) against target '7' scores false"):
        report.build_report(write_run(tmp_path / "a", {"baseline_semiar": flipped}), n_resamples=20, plot=False)
    inflated = [{**r, "tokens_until_eos": 10 * r["tokens_until_eos"]} for r in recs]
    with pytest.raises(ValueError, match="line 1, problem 'p0', field 'tokens_until_eos': 90 exceeds"):
        report.build_report(write_run(tmp_path / "b", {"baseline_semiar": inflated}), n_resamples=20, plot=False)


def test_a_missing_field_is_named_and_the_report_needs_its_own(tmp_path):
    recs = [record(i) for i in range(4)]
    del recs[1]["steps"]
    with pytest.raises(ValueError, match="line 2, problem 'p1', field 'steps': missing"):
        report.build_report(write_run(tmp_path / "a", {"baseline_semiar": recs}), n_resamples=20, plot=False)
    assert set(CORE) < set(REPORT) and "steps" not in CORE  # older files (testbed) resume without it


def test_bounds_come_from_config_json_only_for_its_own_strategy(tmp_path):
    out = write_run(tmp_path / "run", {"baseline_semiar": [record(0)]}, gen_length=32)
    exp = expected_of(out / "baseline_semiar.jsonl")
    assert (exp.gen_length, exp.config_hash) == (32, "h-baseline_semiar")
    assert "config.json (strategies.baseline_semiar)" in exp.source
    assert expected_of(out / "baseline_semiar.rank1.jsonl").gen_length == 32  # a rank log of the strategy
    assert expected_of(out / "other.jsonl") == Expected()  # not in config.json: the record's own bounds only
    (out / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config.json: not a readable JSON file .*delete it"):
        expected_of(out / "baseline_semiar.jsonl")


def test_a_valid_run_reports_as_before(tmp_path):
    out = write_run(tmp_path / "run", {"baseline_semiar": [record(i) for i in range(6)]})
    rep = report.build_report(out, n_resamples=20, plot=False)
    assert rep.rows[0].n == 6 and rep.rows[0].accuracy == 0.5
    assert "Rows over different problems" not in rep.table_md
    assert "problem_sets" not in json.loads((out / "table.json").read_text())["meta"]


# ---------------------------------------------------------------------- case 5: the resume path


class Clock:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return float(self.calls)


def harness(ckpt: Path, out: Path, clock: Clock) -> list[str]:
    argv = ["--model", str(ckpt), "--out", str(out), "--limit", "4", "--batch-size", "2", "--gen-length", "16",
            "--block-length", "8", "--dtype", "float64", "--strategies", "baseline_semiar"]
    return gsm8k.run(gsm8k.parse_config(argv), clock=clock)


def test_a_harness_rerun_refuses_an_edited_file_before_any_compute(ckpt, tmp_path):
    out = tmp_path / "run"
    harness(ckpt, out, Clock())
    path = out / "baseline_semiar.jsonl"
    recs = read_records(path)  # the harness's own records pass
    assert len(recs) == 4 and len(existing_records(path)) == 4
    recs[2] = {**recs[2], "correct": not recs[2]["correct"], "tokens_until_eos": 10 * recs[2]["tokens_until_eos"]}
    path.write_text("".join(json.dumps(r) + "\n" for r in recs[:3]))  # line 3 edited, problem 4 left to run
    before, clock = path.read_bytes(), Clock()
    with pytest.raises(ValueError, match=rf"{path}: line 3, problem '{recs[2]['id']}', field '"):
        harness(ckpt, out, clock)
    assert clock.calls == 0 and path.read_bytes() == before  # refused before any compute, nothing appended


def test_evaluate_refuses_an_edited_log_it_would_extend(ckpt, tmp_path):
    """The research scripts resume through evaluate(log=JsonlLog(...)): the same check, with the
    strategy's own gen length as the bound."""
    from dlm import load_model

    cfg = gsm8k.parse_config(["--model", str(ckpt), "--out", str(tmp_path), "--limit", "4", "--gen-length", "16",
                              "--block-length", "8", "--strategies", "baseline_semiar"])
    model, tok = load_model(ckpt, dtype=torch.float64)
    problems, strategy = gsm8k.load_problems(cfg), cfg.strategies[0]
    path = tmp_path / "log.jsonl"
    with JsonlLog(path) as log:
        evaluate(model, tok, problems[:2], strategy, log, batch_size=2, config_hash="h")
    recs = read_jsonl(path)
    recs[1]["tokens_committed"] = recs[1]["tokens_until_eos"] = 17
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with JsonlLog(path) as log, pytest.raises(ValueError, match=r"line 2, problem .*, field 'tokens_until_eos': "
                                                                 r"17 exceeds gen_length 16 \(strategy baseline_semiar\)"):
        evaluate(model, tok, problems, strategy, log, batch_size=2, config_hash="h")
    assert len(read_jsonl(path)) == 2


# ------------------------------------------------------------------ case 9: different problems
def test_rows_over_different_problems_are_noted_in_the_table(tmp_path, capsys):
    runs = {"baseline_semiar": [record(i) for i in range(24)],
            "fastdllm_dual": [record(i, "fastdllm_dual", seconds=0.25) for i in range(8)]}
    out = write_run(tmp_path / "run", runs)
    rep = report.build_report(out, n_resamples=20, plot=False)
    assert [r.n for r in rep.rows] == [24, 8]  # each row over its own problems, as the committed tables
    note = ("**Rows over different problems** (n: 24 for 1 row; 8 for 1 row; 8 common to all rows): accuracy and "
            "tokens/s of rows with different problems compare different problems; each McNemar test pairs its row "
            "with baseline_semiar on the problems both ran")
    assert note in rep.table_md
    meta = json.loads((out / "table.json").read_text())["meta"]
    assert meta["problem_sets"]["common"] == 8 and meta["problem_sets"]["rows"] == {"baseline_semiar": 24,
                                                                                     "fastdllm_dual": 8}
    assert not meta["problem_sets"]["restricted"]
    assert rep.rows[1].discordant == "0/0"  # paired on the 8 shared problems (same answers on them)


def test_common_problems_restricts_every_row_and_names_what_each_lost(tmp_path, capsys):
    runs = {"baseline_semiar": [record(i) for i in range(24)],
            "fastdllm_dual": [record(i, "fastdllm_dual", seconds=0.25) for i in range(8)],
            "fastdllm_threshold": [record(i, "fastdllm_threshold") for i in range(2, 12)]}
    out = write_run(tmp_path / "run", runs)
    code, _ = report_cli(out, capsys, "--common-problems")
    assert code == 0
    table = (out / "table.md").read_text()
    assert ("**Restricted to the 6 problems common to all rows** (--common-problems): dropped 18 from "
            "baseline_semiar; 4 from fastdllm_threshold; 2 from fastdllm_dual.") in table
    rows = json.loads((out / "table.json").read_text())["rows"]
    assert [r["n"] for r in rows] == [6, 6, 6]
    assert json.loads((out / "table.json").read_text())["meta"]["problem_sets"]["restricted"]


def test_a_row_sharing_no_problem_with_the_reference_is_refused(tmp_path, capsys):
    runs = {"baseline_semiar": [record(i) for i in range(8)],
            "fastdllm_dual": [record(i, "fastdllm_dual") for i in range(8, 16)]}
    out = write_run(tmp_path / "run", runs)
    code, err = report_cli(out, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert (f"error: --out {out}: fastdllm_dual.jsonl shares no problem with the reference row baseline_semiar "
            "(8 and 8 problems)") in err
    assert not (out / "table.md").exists()


# --------------------------------------------------------------------------- committed results
def per_sample_files() -> list[Path]:
    """Every committed per-sample file of harness.evaluate (the schema with a prediction and a target)."""
    out = []
    for path in sorted(RESULTS.glob("**/*.jsonl")):
        with path.open(encoding="utf-8") as f:
            first = json.loads(f.readline() or "{}")
        if "prediction" in first and "target" in first:
            out.append(path)
    return out


def report_folders() -> list[Path]:
    return sorted(p.parent for p in RESULTS.glob("*/table.csv"))


@pytest.mark.skipif(not RESULTS.is_dir(), reason="no results/ in this checkout")
def test_every_committed_per_sample_file_passes_the_checks():
    files, folders = per_sample_files(), report_folders()
    assert len(files) > 200 and len(folders) >= 18
    for folder in folders:
        assert report.load_runs(folder)  # the report's reading: its fields, its row, config.json's bounds
    for path in files:
        if path.parent not in folders:  # the testbed's, the block study's, dream_rules' (resumed by evaluate)
            read_records(path)


#: what issue 51 added to the tables (the paired CI and verdict; chain-step accuracy): a committed
#: table written before them holds every other number unchanged
NEW_FIELDS = set(noninferiority.FIELDS) | set(chain_steps.FIELDS)
NEW_META = {"noninferiority", "chain_steps"}
NEW_COLUMNS = ("change vs ", "non-inferiority at margin", "chain-step % [95% CI]", "chain-step McNemar p (b/c)")
NEW_LINES = ("Change vs ", "Chain-step accuracy: ", "chain-step accuracy not computed: ")


def without_new_md(md: str) -> str:
    """``md`` without the new paragraphs (each with its blank line) and the new table columns."""
    lines, out, drop = md.split("\n"), [], []
    for i, line in enumerate(lines):
        if line.startswith(NEW_LINES) or (i and lines[i - 1].startswith(NEW_LINES) and not line):
            continue
        if not line.startswith("|"):
            drop = []
        elif not drop and not (i and lines[i - 1].startswith("|")):  # a table's header
            drop = [k for k, cell in enumerate(line.split(" | ")) if cell.startswith(NEW_COLUMNS)] or [-1]
        if line.startswith("|---"):
            line = "|" + "---|" * (line.count("---") - sum(k >= 0 for k in drop))
        elif line.startswith("|"):
            line = " | ".join(c for k, c in enumerate(line.split(" | ")) if k not in drop)
        out.append(line)
    return "\n".join(out)


def without_new_csv(text: str, committed: str) -> str:
    """``text`` (a table.csv) without the new columns ``committed`` lacks."""
    rows = list(csv.reader(io.StringIO(text)))
    keep = [k for k, name in enumerate(rows[0]) if name not in NEW_FIELDS or name in committed.split("\n")[0]]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([[row[k] for k in keep] for row in rows])
    return buf.getvalue()


def test_the_old_view_of_a_new_table_drops_exactly_the_new_parts(tmp_path):
    runs = {"baseline_semiar": [record(i) for i in range(6)],
            "fastdllm_dual": [record(i, "fastdllm_dual", seconds=0.25) for i in range(6)]}
    rep = report.build_report(write_run(tmp_path / "run", runs), n_resamples=20, plot=False)
    old = without_new_md(rep.table_md)
    assert "Change vs" not in old and "change vs" not in old and "non-inferiority" not in old
    header = next(line for line in old.split("\n") if line.startswith("| strategy | accuracy % [95% CI]"))
    assert header.startswith("| strategy | accuracy % [95% CI] | McNemar p (b/c) | tokens/s | speed-up vs")
    table = [line for line in old.split("\n") if line.startswith("|")][:4]
    assert len({line.count("|") for line in table}) == 1  # header, separator and rows keep one column count
    assert without_new_csv(rep.table_csv, "strategy,n\n").split("\n")[0] == ",".join(report.CSV_FIELDS)


@pytest.mark.slow
@pytest.mark.skipif(not RESULTS.is_dir(), reason="no results/ in this checkout")
def test_every_committed_table_is_what_the_report_computes(tmp_path):
    """Rebuilt from a copy of its records, each committed table holds the same numbers: table.csv
    and ablation.* byte for byte, table.md / table.json but for the problem-sets note and, in a table
    written before them, the columns and lines issue 51 added (NEW_*)."""
    folders = report_folders()
    assert len(folders) >= 18
    for folder in folders:
        copy = tmp_path / folder.name
        copy.mkdir()
        for f in [*folder.glob("*.jsonl"), folder / "config.json", *folder.glob("timing.json")]:
            shutil.copy(f, copy / f.name)  # timing.json: the interleaved timing a table shows beside its own
        baseline = json.loads((folder / "config.json").read_text()).get("baseline") or "baseline_semiar"
        report.build_report(copy, baseline, plot=False)
        for name in ("ablation.md", "ablation.csv"):
            assert (copy / name).read_bytes() == (folder / name).read_bytes(), f"{folder.name}/{name}"
        committed_csv = (folder / "table.csv").read_text()
        assert without_new_csv((copy / "table.csv").read_text(), committed_csv) == committed_csv, folder.name
        built = json.loads((copy / "table.json").read_text())
        sets = built["meta"].pop("problem_sets", None)
        committed = json.loads((folder / "table.json").read_text())
        committed["meta"].pop("problem_sets", None)
        for key in NEW_META - set(committed["meta"]):
            built["meta"].pop(key, None)
        for row, old in zip(built["rows"], committed["rows"]):
            for key in NEW_FIELDS - set(old):
                row.pop(key)
        assert built == committed, f"{folder.name}/table.json"
        md, committed_md = (copy / "table.md").read_text(), (folder / "table.md").read_text()
        assert (sets is not None) == ("**Rows over different problems**" in md)
        if sets is not None:  # the note is the only difference (committed before or after it existed)
            md, committed_md = (t.replace(sets["note"] + "\n\n", "") for t in (md, committed_md))
        if "Change vs " not in committed_md:
            md = without_new_md(md)
        assert md == committed_md, f"{folder.name}/table.md"


def test_check_records_is_the_one_check_of_both_readers():
    """The report (load_runs) and the resume path (existing_records, evaluate) read through it."""
    import inspect

    from harness import evaluate as ev

    assert "read_records(" in inspect.getsource(report.load_runs)
    assert "read_records(" in inspect.getsource(ev.existing_records)
    assert "check_records(" in inspect.getsource(ev.evaluate)
    with pytest.raises(ValueError, match=r"x.jsonl: line 7, problem 'p0', field 'seconds'"):
        check_records(Path("x.jsonl"), [(7, record(0, seconds=0))])
