"""harness.report never states something its rows do not support: a missing baseline row is
named (speed-ups relative to another row, said in table.md / table.csv / table.json / ablation.md),
and throughputs from different batch sizes are flagged next to the throughput."""

from __future__ import annotations

import csv
import io
import json

from harness import report

FACTORS = {
    "baseline_semiar": {"kind": "baseline", "cache": "none", "parallel": "topk", "stop_at_eos": False,
                        "block_length": 32},
    "fastdllm_dual": {"kind": "fastdllm", "cache": "dual", "parallel": "topk", "stop_at_eos": False,
                      "block_length": 32},
    "fastdllm_threshold": {"kind": "fastdllm", "cache": "none", "parallel": "threshold", "stop_at_eos": False,
                           "block_length": 32},
}


def _records(name: str, n: int, seconds: float, batch_rows) -> list[dict]:
    """``n`` synthetic per-sample records; ``batch_rows`` is one size or a list, one per record."""
    sizes = batch_rows if isinstance(batch_rows, list) else [batch_rows] * n
    return [{"id": f"p{i}", "index": i, "strategy": name, "prediction": f"#### {i % 2}", "target": "0",
             "extracted": str(i % 2), "correct": i % 2 == 0, "tokens_until_eos": 10, "prompt_length": 12,
             "first_eos_step": 5, "seed": 0, "seconds": seconds, "nfe": 8, "steps": 8, "tokens_committed": 16,
             "positions_computed": 100, "batch_rows": sizes[i], "factors": FACTORS[name],
             "config_hash": f"h-{name}", "git_sha": "g"} for i in range(n)]


def _write(out, runs: dict[str, list[dict]]) -> None:
    out.mkdir(exist_ok=True)
    for name, records in runs.items():
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _build(out):
    rep = report.build_report(out, n_resamples=50, plot=False)
    return rep, json.loads((out / "table.json").read_text())["meta"]


def test_speedups_name_their_reference_row(tmp_path):
    _write(tmp_path, {"baseline_semiar": _records("baseline_semiar", 8, 1.0, 8),
                      "fastdllm_dual": _records("fastdllm_dual", 8, 0.25, 8)})
    rep, meta = _build(tmp_path)
    assert meta["speedup_reference"] == "baseline_semiar" and meta["speedup_note"] is None
    assert "speed-up vs `baseline_semiar`" in rep.table_md and "no baseline_semiar row" not in rep.table_md
    assert [r.speedup for r in rep.rows] == [1.0, 4.0]


def test_missing_baseline_row_is_said_not_silently_replaced(tmp_path):
    _write(tmp_path, {"fastdllm_dual": _records("fastdllm_dual", 8, 0.5, 8),
                      "fastdllm_threshold": _records("fastdllm_threshold", 8, 0.25, 8)})
    rep, meta = _build(tmp_path)
    note = "no baseline_semiar row: speed-ups relative to fastdllm_dual instead"
    assert meta["speedup_reference"] == "fastdllm_dual" and meta["speedup_note"] == note
    assert note in rep.table_md and "speed-up vs `baseline_semiar`" not in rep.table_md
    assert "| speed-up vs fastdllm_dual |" in rep.table_md
    table = list(csv.DictReader(io.StringIO(rep.table_csv)))
    assert {r["speedup_vs"] for r in table} == {"fastdllm_dual"}
    assert [float(r["speedup"]) for r in table] == [1.0, 2.0]
    assert "no baseline_semiar row: the fastdllm_dual row's instead" in rep.ablation_md


def test_mixed_batch_sizes_are_flagged_next_to_throughput(tmp_path):
    _write(tmp_path, {"baseline_semiar": _records("baseline_semiar", 8, 1.0, 8),
                      "fastdllm_dual": _records("fastdllm_dual", 8, 0.25, 1)})
    rep, meta = _build(tmp_path)
    assert meta["mixed_batch_rows"] is True and meta["batch_rows"] == {"baseline_semiar": "8", "fastdllm_dual": "1"}
    assert "**Mixed batch sizes**" in rep.table_md and "| tokens/s (batch size) |" in rep.table_md
    assert "| 10.0 (batch 8) |" in rep.table_md and "| 40.0 (batch 1) |" in rep.table_md
    assert [r["batch_rows"] for r in csv.DictReader(io.StringIO(rep.table_csv))] == ["8", "1"]


def test_uniform_batches_with_a_partial_last_batch_are_not_mixed(tmp_path):
    _write(tmp_path, {"baseline_semiar": _records("baseline_semiar", 10, 1.0, [4] * 8 + [2] * 2),
                      "fastdllm_dual": _records("fastdllm_dual", 12, 0.25, 4)})
    rep, meta = _build(tmp_path)
    assert meta["mixed_batch_rows"] is False and set(meta["batch_rows"].values()) == {"4"}
    assert "Mixed batch sizes" not in rep.table_md and "(batch " not in rep.table_md


def test_a_row_resumed_at_another_batch_size_is_mixed(tmp_path):
    _write(tmp_path, {"baseline_semiar": _records("baseline_semiar", 12, 1.0, [8] * 8 + [2] * 4)})
    rep, meta = _build(tmp_path)
    assert meta["batch_rows"] == {"baseline_semiar": "2 8"} and meta["mixed_batch_rows"] is True
    assert "| 10.0 (batch 2 8) |" in rep.table_md


def test_batch_sizes_of_records():
    assert report.batch_sizes([{"batch_rows": 32}] * 64 + [{"batch_rows": 20}] * 20) == "32"
    assert report.batch_sizes([{"batch_rows": 32}] * 32 + [{"batch_rows": 8}] * 16) == "8 32"
    assert report.batch_sizes([{"batch_rows": 32}, {}]) == "?"


def test_pareto_labels_do_not_overlap_in_a_crowded_small_run():
    """Close points get labels whose rendered boxes do not overlap each other, stay inside the axes
    and cover no marker (the old fixed offsets collided); every label finds a place."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.plot_labels import marker_boxes, overlapping_pairs, place_labels

    fig, ax = plt.subplots(figsize=(8, 5.5))
    pts = [(50 + i, 60 + (i % 3)) for i in range(8)] + [(3, 40), (3.1, 41)]
    ax.set_xscale("log")
    ax.set_xlim(1.5, 200)
    ax.set_ylim(30, 75)
    ax.plot(*zip(*pts), "o")
    markers = marker_boxes(ax, pts, 4.0)
    texts = place_labels(ax, pts, [f"strategy_name_{i}" for i in range(len(pts))], [dict(fontsize=8)] * len(pts),
                         obstacles=markers)
    renderer = fig.canvas.get_renderer()
    assert None not in texts and not overlapping_pairs(texts, renderer)
    frame = ax.get_window_extent(renderer)
    boxes = [t.get_window_extent(renderer) for t in texts]
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)
    assert not [(b, m) for b in boxes for m in markers
                if b.x0 < m[2] and m[0] < b.x1 and b.y0 < m[3] and m[1] < b.y1]  # room enough: no marker covered
    plt.close(fig)


def test_paired_mcnemar_against_the_baseline_counts_shared_problems():
    from tasks.evaluate import mcnemar_exact
    from harness.report import paired_test

    base = [{"id": i, "correct": c} for i, c in enumerate([1, 1, 1, 0, 0, 1, 0, 1])]
    other = [{"id": i, "correct": c} for i, c in enumerate([1, 0, 0, 1, 0, 1, 1, 0])] + [{"id": 99, "correct": 1}]
    p, bc = paired_test(base, other)
    assert bc == "3/2"  # ids 1, 2, 7 only the base solves; 3, 6 only the other; id 99 is not shared
    assert p == mcnemar_exact(3, 2)
    assert paired_test(base, base) == (1.0, "0/0")


def test_frontier_and_fastest_not_worse_match_brute_force():
    """The front: rows no other row beats on both throughput and accuracy; the fastest row not
    significantly worse: the fastest among the reference, rows at least as accurate, and p > 0.05."""
    import itertools
    import random

    from harness.report import Row, frontier

    rng = random.Random(0)
    for trial in range(200):
        rows = [Row(f"s{i}", 100, rng.choice([0.5, 0.6, 0.7, 0.8]), 0, 1, rng.choice([1.0, 2.0, 3.0, 5.0, 8.0]),
                    1.0, 1, 1, 1, 1, 1, {}, "", "", mcnemar_p=rng.choice([0.001, 0.04, 0.2, 1.0]))
                for i in range(rng.randint(1, 7))]
        got = frontier(rows, "s0")
        dominated = {a.strategy for a, b in itertools.permutations(rows, 2)
                     if b.tokens_per_second >= a.tokens_per_second and b.accuracy >= a.accuracy
                     and (b.tokens_per_second, b.accuracy) != (a.tokens_per_second, a.accuracy)}
        front = {r.strategy for r in rows} - dominated
        assert set(got["front"]) <= front and {(r.tokens_per_second, r.accuracy) for r in rows
                                               if r.strategy in got["front"]} == \
            {(r.tokens_per_second, r.accuracy) for r in rows if r.strategy in front}, trial
        speeds = [next(r for r in rows if r.strategy == n).tokens_per_second for n in got["front"]]
        assert speeds == sorted(speeds)
        ok = [r for r in rows if r.strategy == "s0" or r.accuracy >= rows[0].accuracy or r.mcnemar_p > 0.05]
        assert got["fastest_not_worse"] in {r.strategy for r in ok}
        assert next(r for r in rows if r.strategy == got["fastest_not_worse"]).tokens_per_second == \
            max(r.tokens_per_second for r in ok)
    assert frontier(rows, "absent")["fastest_not_worse"] is None


def test_flop_ideal_is_the_ratio_of_flops_per_token_and_absent_without_flops(tmp_path):
    import math

    base, dual = _records("baseline_semiar", 4, 1.0, 4), _records("fastdllm_dual", 4, 0.5, 4)
    for i, r in enumerate(base):
        r["flops"], r["tokens_until_eos"] = 1000 * (i + 1), 10
    for r in dual:
        r["flops"], r["tokens_until_eos"] = 125, 5  # 25 FLOPs/token vs the baseline's 10000 / 40 = 250
    _write(tmp_path, {"baseline_semiar": base, "fastdllm_dual": dual})
    rep, _ = _build(tmp_path)
    rows = {r.strategy: r for r in rep.rows}
    assert rows["baseline_semiar"].flops_per_token == 250.0 and rows["fastdllm_dual"].flops_per_token == 25.0
    assert rows["fastdllm_dual"].flop_ideal == 10.0 and rows["baseline_semiar"].flop_ideal == 1.0
    assert "| 10.00x |" in rep.table_md
    del dual[0]["flops"]  # one record without FLOPs: no ideal rather than a wrong one
    _write(tmp_path, {"fastdllm_dual": dual})
    rep, _ = _build(tmp_path)
    assert math.isnan({r.strategy: r for r in rep.rows}["fastdllm_dual"].flop_ideal)


def test_frontier_of_the_reference_model_leaves_out_bd3lm_rows():
    from harness.report import Row, frontier

    def row(name, kind, tps, acc):
        return Row(name, 100, acc, 0, 1, tps, 1.0, 1, 1, 1, 1, 1, {"kind": kind}, "", "", mcnemar_p=1.0)

    rows = [row("base", "baseline", 1.0, 0.8), row("dual", "fastdllm", 10.0, 0.8), row("bd3", "bd3lm", 100.0, 0.9)]
    got = frontier(rows, "base")
    assert got["front"] == ["bd3"] and got["fastest_not_worse"] == "bd3"
    assert got["same_model"] == {"front": ["dual"], "fastest_not_worse": "dual"}
    assert "same_model" not in frontier(rows[:2], "base")


def test_float_noise_in_the_inputs_moves_no_written_byte(tmp_path, monkeypatch):
    """A rebuild on another CPU / BLAS / numpy moves the last bits of the timings' sums and of the
    ablation's least-squares fit: with every input time perturbed by up to 1e-13 relative, every
    file the report writes keeps its bytes (floats rounded at write, dlm.io.round_floats)."""
    runs = {name: _records(name, 12, seconds, 4)
            for name, seconds in (("baseline_semiar", 1.0), ("fastdllm_dual", 0.31), ("fastdllm_threshold", 0.23))}
    both = {**FACTORS["fastdllm_dual"], "parallel": "threshold"}  # a fourth cell: the fit has a residual
    runs["dual_threshold"] = [{**r, "strategy": "dual_threshold", "config_hash": "h-dt", "factors": both}
                              for r in _records("fastdllm_dual", 12, 0.037, 4)]
    noisy = {n: [{**r, "seconds": r["seconds"] * (1 + 1e-13 * (1 + i % 3))} for i, r in enumerate(rs)]
             for n, rs in runs.items()}
    _write(tmp_path / "a", runs)
    _write(tmp_path / "b", noisy)
    raw = [[report.summarize(n, rs, 50, 0).tokens_per_second for n, rs in r.items()] for r in (runs, noisy)]
    assert raw[0] != raw[1]  # the noise reaches the summaries
    lstsq = report.np.linalg.lstsq

    def other_blas(X, y, rcond=None):  # another kernel: the solution's last bits move, an exact 0 becomes 1e-14
        sol, *rest = lstsq(X, y, rcond=rcond)
        return (sol * (1 + 3e-14) + 2e-14, *rest)

    report.build_report(tmp_path / "a", n_resamples=50, plot=False)
    monkeypatch.setattr(report.np.linalg, "lstsq", other_blas)
    report.build_report(tmp_path / "b", n_resamples=50, plot=False)
    effects = json.loads((tmp_path / "a" / "table.json").read_text())["ablation"]
    assert len(effects) == 2 and all(e["accuracy_pp"] == 0.0 for e in effects)  # equal accuracies: exact zeros
    for name in ("table.json", "table.md", "table.csv", "ablation.md", "ablation.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_a_speed_up_above_its_flop_ideal_is_flagged_not_believed():
    """Time cannot beat the FLOPs it follows: such rows are named in a note (their accuracy stands)."""
    from types import SimpleNamespace as Row_

    from harness.report import _ideal_words, above_ideal

    nan = float("nan")
    rows = [Row_(strategy="base", speedup=1.0, flop_ideal=1.0), Row_(strategy="fast", speedup=3.1, flop_ideal=3.0),
            Row_(strategy="fair", speedup=2.9, flop_ideal=3.0), Row_(strategy="untimed", speedup=nan, flop_ideal=2.0)]
    assert above_ideal(rows) == ["fast"]
    words = _ideal_words({"above_flop_ideal": ["fast"], "speedup_reference": "base"})
    assert words[0].startswith("**Speed-up above its FLOP ideal** (fast)") and "`base`" in words[0]
    assert _ideal_words({"above_flop_ideal": [], "speedup_reference": "base"}) == []
