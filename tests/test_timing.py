"""Interleaved timing (harness.timing, experiments.eval.timing) on a tiny checkpoint with scripted clocks."""

from __future__ import annotations

import itertools
import json
import statistics

import numpy as np
import pytest
from test_gsm8k_harness import ckpt  # noqa: F401  (the tiny harness checkpoint fixture)

from experiments.eval import gsm8k, timing
from harness import cli, report
from harness.results import read_jsonl
from harness.timing import ABOVE_IDEAL, median_ci, order, ratios, schedule, timing_rows
from tasks import extract_flexible, extract_strict, is_correct

TWO = ["baseline_semiar", "fastdllm_dual_threshold"]


class ScriptedClock:
    """Read 2k and 2k+1 bracket call k: call k lasts ``durations[k % len(durations)]`` seconds."""

    def __init__(self, durations=(1.0,)) -> None:
        self.durations, self.calls, self.now = list(durations), 0, 0.0

    def __call__(self) -> float:
        if self.calls % 2:
            self.now += self.durations[(self.calls // 2) % len(self.durations)]
        self.calls += 1
        return self.now




def argv(ckpt, out, *extra) -> list[str]:
    return ["--model", str(ckpt), "--out", str(out), "--limit", "4", "--batch-size", "2", "--gen-length", "16",
            "--block-length", "8", "--dtype", "float64", "--threads", "1", "--baseline", TWO[0],
            "--strategies", TWO[1], *extra]


def run(ckpt, out, *extra, clock=None) -> str:
    return timing.run(timing.parse_config(argv(ckpt, out, *extra)), clock=clock or ScriptedClock())


def test_schedule_rotates_the_order_per_repeat():
    assert order(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert order(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert order(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert schedule(["a", "b"], 2, 2) == [(0, 0, "a"), (0, 0, "b"), (0, 1, "a"), (0, 1, "b"),
                                          (1, 0, "b"), (1, 0, "a"), (1, 1, "b"), (1, 1, "a")]


def test_cells_run_interleaved_in_the_declared_order_with_the_plain_runs_tokens(ckpt, tmp_path):
    out = tmp_path / "o"
    gsm8k.run(gsm8k.parse_config(argv(ckpt, out)[:-4] + ["--strategies", *TWO]))  # the plain run's samples
    text = run(ckpt, out)
    cells = read_jsonl(out / "timing.jsonl")
    assert [(c["repeat"], c["batch"], c["strategy"]) for c in cells] == schedule(TWO, 2, 3)
    assert [c["position"] for c in cells] == [0, 1] * 6  # the baseline first in repeats 0 and 2, second in 1
    assert [c["strategy"] for c in cells if c["position"] == 0] == [TWO[0]] * 2 + [TWO[1]] * 2 + [TWO[0]] * 2
    plain = {n: {r["id"]: r for r in read_jsonl(out / f"{n}.jsonl")} for n in TWO}
    for c in cells:
        assert c["checked"] == 2 and c["rows"] == 2  # every sample compared with the plain run's: equal
        ids = [f"test-0-{i}" for i in c["indices"]]
        assert c["tokens"] == sum(plain[c["strategy"]][i]["tokens_until_eos"] for i in ids)
        assert c["seconds"] == 1.0 and c["threads"] == 1 and len(c["load_before"]) == 3 and c["cpu"]
    assert len({c["outputs"] for c in cells if c["batch"] == 0 and c["strategy"] == TWO[1]}) == 1
    assert "| fastdllm_dual_threshold |" in text and (out / "timing.json").is_file()
    assert "torch threads 1" in text and "load average (1/5/15 min)" in text
    assert {r.strategy for r in report.build_report(out, plot=False).rows} == set(TWO)  # timing.jsonl is no row


def test_median_and_ci_match_a_brute_force_bootstrap():
    values = [1.0, 2.0, 3.5]  # three cells: every resample's median is one of them, min and max with p = 7/27
    assert median_ci(values) == (2.0, 1.0, 3.5)
    values = [3.0, 1.0, 4.0, 1.5, 5.0, 9.0]
    mid, lo, hi = median_ci(values)
    assert mid == statistics.median(values)
    # every one of the 6^6 equally likely resamples: the exact bootstrap distribution of the median
    exact = np.sort(np.median(np.array(list(itertools.product(values, repeat=6))), axis=1))
    cdf = np.arange(1, exact.size + 1) / exact.size
    assert lo == exact[np.searchsorted(cdf, 0.025)] and hi == exact[np.searchsorted(cdf, 0.975)]


def test_ratio_per_cell_and_the_table(ckpt, tmp_path):
    cells = [{"repeat": r, "batch": b, "position": 0, "strategy": s, "seconds": sec, "tokens": tok}
             for r, b, s, sec, tok in [(0, 0, "base", 10.0, 20), (0, 0, "row", 1.0, 10), (0, 1, "base", 8.0, 20),
                                       (0, 1, "row", 2.0, 10), (1, 0, "base", 12.0, 20), (1, 0, "row", 1.0, 10),
                                       (1, 1, "row", 1.0, 10)]]  # (1, 1) lacks its baseline: not a pair
    assert ratios(cells, "base", "row") == pytest.approx([5.0, 2.0, 6.0])
    (row,) = timing_rows(cells, "base", {"row": 1.5})
    assert (row.speedup, row.ci_low, row.ci_high, row.cells, row.repeats) == pytest.approx((5.0, 2.0, 6.0, 3, 2))
    assert row.flag == ABOVE_IDEAL  # CI low 2.0 > FLOP ideal 1.5
    assert timing_rows(cells, "base", {"row": 2.0})[0].flag == ""
    assert timing_rows(cells, "base")[0].flag == ""  # no FLOP ideal: nothing to compare with


def test_measured_speedup_and_flop_ideal_from_the_records(ckpt, tmp_path):
    out = tmp_path / "o"
    gsm8k.run(gsm8k.parse_config(argv(ckpt, out)[:-4] + ["--strategies", *TWO]))
    # baseline calls last 4 s, the row's 1 s (the order alternates, rotated per repeat)
    durations = [4.0, 1.0, 4.0, 1.0, 1.0, 4.0, 1.0, 4.0, 4.0, 1.0, 4.0, 1.0]
    run(ckpt, out, clock=ScriptedClock(durations))
    cells = read_jsonl(out / "timing.jsonl")
    assert all(c["seconds"] == (4.0 if c["strategy"] == TWO[0] else 1.0) for c in cells)
    got = json.loads((out / "timing.json").read_text())["rows"][0]
    pairs = [(c, d) for c in cells for d in cells if c["strategy"] == TWO[0] and d["strategy"] == TWO[1]
             and (c["repeat"], c["batch"]) == (d["repeat"], d["batch"])]
    brute = [(c["seconds"] / c["tokens"]) / (d["seconds"] / d["tokens"]) for c, d in pairs]
    assert len(brute) == 6 and got["speedup"] == pytest.approx(statistics.median(brute))
    recs = {n: read_jsonl(out / f"{n}.jsonl") for n in TWO}
    fpt = {n: sum(r["flops"] for r in v) / sum(r["tokens_until_eos"] for r in v) for n, v in recs.items()}
    assert got["flop_ideal"] == pytest.approx(fpt[TWO[0]] / fpt[TWO[1]], rel=1e-6)


def test_resumed_run_skips_done_cells_and_gives_the_same_table(ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr("harness.timing.load_average", lambda: [1.0, 1.0, 1.0])
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run(ckpt, full)
    run(ckpt, resumed, "--repeats", "3")
    lines = (resumed / "timing.jsonl").read_text().splitlines(keepends=True)
    (resumed / "timing.jsonl").write_text("".join(lines[:5]) + lines[5][:30])  # killed while writing cell 6
    clock = ScriptedClock()
    run(ckpt, resumed, clock=clock)
    assert clock.calls == 2 * 7  # the 7 cells not written, each one call
    for name in ("timing.md", "timing.json"):
        assert (resumed / name).read_text() == (full / name).read_text()
    key = [(c["id"], c["outputs"], c["tokens"]) for c in read_jsonl(full / "timing.jsonl")]
    assert [(c["id"], c["outputs"], c["tokens"]) for c in read_jsonl(resumed / "timing.jsonl")] == key
    clock = ScriptedClock()
    run(ckpt, resumed, clock=clock)
    assert clock.calls == 0  # everything done: nothing timed
    with pytest.raises(ValueError, match="--out: .*timing.jsonl holds cell r0/b0/baseline_semiar over problems"):
        run(ckpt, resumed, "--batch-size", "3")
    with pytest.raises(ValueError, match="timing.jsonl holds cell .* of config"):
        run(ckpt, resumed, "--threshold", "0.5")
    with pytest.raises(ValueError, match=r"of a run timing \['baseline_semiar', 'fastdllm_dual_threshold'\], this "
                                         r"run times \['baseline_semiar', 'fastdllm_dual_threshold', 'fastdllm_dual'\]"):
        run(ckpt, resumed, "fastdllm_dual")  # a row added later would not alternate with the baseline
    assert clock.calls == 0 and len(read_jsonl(resumed / "timing.jsonl")) == 12


def test_changed_tokens_are_refused(ckpt, tmp_path):
    out = tmp_path / "o"
    gsm8k.run(gsm8k.parse_config(argv(ckpt, out)[:-4] + ["--strategies", *TWO]))
    path = out / f"{TWO[1]}.jsonl"
    recs = read_jsonl(path)
    r = recs[0]
    r["prediction"] = r["prediction"] + " 7"
    r.update(extracted=extract_strict(r["prediction"]), extracted_flexible=extract_flexible(r["prediction"]),
             correct=is_correct(r["prediction"], r["target"]),
             correct_flexible=is_correct(r["prediction"], r["target"], mode="flexible"))
    path.write_text("".join(json.dumps(x) + "\n" for x in recs))
    with pytest.raises(ValueError, match=f"{TWO[1]}.jsonl: sample {r['id']} holds prediction .*timing changed"):
        run(ckpt, out)


def test_bad_flags_are_one_line(ckpt, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cases = [(["--repeats", "2"], "argument --repeats: must be an int >= 3, got '2'"),
             (argv(ckpt, tmp_path / "o")[:4], "the following arguments are required: --limit"),
             (argv(ckpt, tmp_path / "o", "--baseline", "nope"), "--baseline must be a known strategy, got 'nope'"),
             (argv(ckpt, tmp_path / "o", "--strategies", TWO[0]), "--strategies: only the baseline"),
             (argv(ckpt, tmp_path / "o", "--strategies", "nope"), "--strategies: unknown name 'nope'"),
             (argv(ckpt, tmp_path / "o", "--batch-size", "0"), "--batch-size must be >= 1"),
             (argv(tmp_path / "missing", tmp_path / "o"), f"--model {tmp_path / 'missing'}")]
    for args, words in cases:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            cli.run_main(timing.main, args)
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert exit_.value.code == 2 and len(lines) == 1, err
        assert lines[0].startswith("python -m experiments.eval.timing: error: ") and words in lines[0], lines[0]
    assert not (tmp_path / "o" / "timing.jsonl").exists()


def test_skip_times_the_held_out_problems_in_the_harness_batches(ckpt, tmp_path):
    """--skip 2 --limit 4: the cells cover problems 2-5 in the batches the harness ran them in, and
    every timed sample equals the held-out run's record of it."""
    out = tmp_path / "h"
    gsm8k.run(gsm8k.parse_config(argv(ckpt, out)[:-4] + ["--strategies", *TWO, "--skip", "2"]))
    run(ckpt, out, "--skip", "2")
    cells = read_jsonl(out / "timing.jsonl")
    assert sorted({i for c in cells for i in c["indices"]}) == [2, 3, 4, 5]
    assert all(c["checked"] == c["rows"] == 2 for c in cells)


def test_the_table_shows_the_timed_speedups_beside_the_single_run_ones(ckpt, tmp_path):
    """After a timing run the folder's table gets a timed column: each row's median [CI] from
    timing.json ("-" for rows not timed); a broken timing.json is refused naming it."""
    out = tmp_path / "t"
    gsm8k.run(gsm8k.parse_config(argv(ckpt, out)[:-4] + ["--strategies", *TWO]))
    assert "timed speed-up" not in (out / "table.md").read_text()  # no timing run: no column
    run(ckpt, out, clock=ScriptedClock((2.0, 1.0)))
    built = report.build_report(out, baseline=TWO[0], plot=False)
    doc = json.loads((out / "timing.json").read_text())
    row = next(r for r in doc["rows"] if r["strategy"] == TWO[1])
    line = next(x for x in built.table_md.splitlines() if x.startswith(f"| {TWO[1]} |"))
    assert f"| {row['speedup']:.2f}x [{row['ci_low']:.2f}, {row['ci_high']:.2f}] |" in line
    assert next(x for x in built.table_md.splitlines() if x.startswith(f"| {TWO[0]} |")).count("| - |") >= 1
    assert "3 repeats over 4 problems" in built.table_md
    header = next(x for x in built.table_md.splitlines() if x.startswith("| strategy |"))
    assert header.count("|") == line.count("|")
    (out / "timing.json").write_text('{"meta": {}}')
    with pytest.raises(ValueError, match="timing.json: not a timing record"):
        report.build_report(out, baseline=TWO[0], plot=False)
