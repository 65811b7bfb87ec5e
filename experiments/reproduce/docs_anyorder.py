"""The generated blocks of ``docs/anyorder.md`` (:mod:`experiments.reproduce.docblocks`): the
any-order table and its paired tests (``results/anyorder/table.json``) and the race under load
(``results/bench_load/*.json``)."""

from __future__ import annotations

from pathlib import Path

from experiments.bench.ratios import fmt
from experiments.eval.anyorder import ROWS, gap_table
from experiments.eval.curves import cpu_cell
from harness.cli import markdown_table
from harness.results import read_json

#: the table's decoders, in column order
DECODERS = ROWS
#: the level at which a paired difference decides an any-order claim (issue 52: p < 0.01)
ALPHA = 0.01


def _rows(results: Path) -> list[dict]:
    path = results / "anyorder" / "table.json"
    rows = read_json(path)
    if not isinstance(rows, list):
        raise ValueError(f"{path}: not a list of rows")
    for i, r in enumerate(rows):
        need = ("task", "row", "n") + (("forward_accuracy",) if r.get("gated") else ("accuracy", "ci"))
        missing = [f for f in need if f not in r]
        if missing:
            raise ValueError(f"{path}: row {i} lacks {missing}")
    return rows


def _cell(r: dict) -> str:
    if r.get("gated"):
        return f"gated (forward {100 * r['forward_accuracy']:.1f} < 95)"
    return f"{100 * r['accuracy']:.1f} [{100 * r['ci'][0]:.1f}, {100 * r['ci'][1]:.1f}]"


def anyorder_table(results: Path) -> str:
    """Accuracy per task and decoder, % with Wilson 95% intervals."""
    rows = _rows(results)
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    cols = [d for d in DECODERS if any(r["row"] == d for r in rows)]
    by = {(r["task"], r["row"]): r for r in rows}
    body = [[t, by[t, cols[0]]["n"] if (t, cols[0]) in by else "-",
             *[_cell(by[t, d]) if (t, d) in by else "-" for d in cols]] for t in tasks]
    return "\n".join(["From `results/anyorder/table.json` (accuracy %, Wilson 95% interval; n problems per row).", "",
                      *markdown_table(["task", "n", *cols], body)])


def anyorder_tests(results: Path) -> str:
    """Each paired comparison of the table (exact McNemar) and what it decides at :data:`ALPHA`."""
    rows = _rows(results)
    by = {(r["task"], r["row"]): r for r in rows}
    body, seen = [], set()
    for r in rows:
        vs = r.get("vs")
        if r.get("gated") or r.get("mcnemar_p") is None or (r["task"], vs) not in by:
            continue
        pair = (r["task"], frozenset((r["row"], vs)))
        if pair in seen:
            continue
        seen.add(pair)
        other = by[r["task"], vs]
        a, b = 100 * r["accuracy"], 100 * other["accuracy"]
        if r["mcnemar_p"] >= ALPHA:
            verdict = f"no difference at p < {ALPHA}"
        else:
            verdict = f"{r['row'] if a > b else vs} better"
        body.append([r["task"], f"{r['row']} vs {vs}", f"{a:.1f} vs {b:.1f}", f"{r['mcnemar_p']:.2g}",
                     r["discordant"], verdict])
    gated = [f"{r['task']} {r['row']}" for r in rows if r.get("gated")]
    lines = ["Exact McNemar on the same problems (b/c: right only in the second / only in the first row).", "",
             *markdown_table(["task", "pair", "accuracy %", "p", "b/c", f"at p < {ALPHA}"], body)]
    if gated:
        lines += ["", f"Not scored (forward accuracy on the trained questions below the 95% gate): {', '.join(gated)}."]
    return "\n".join(lines + gap_table(rows))


def load_race(results: Path) -> str:
    """Per shape and decoder: the throughput ratio to AR at batch 1 with its verdict, and the
    measured and roofline crossovers (``experiments.bench.bench_load``)."""
    body = []
    for name in ("embedded_g256", "mid_g64"):
        d = read_json(results / "bench_load" / f"{name}.json", "rows", "crossover", "git_sha", "shape")
        for strategy, cross in sorted(d["crossover"].items()):
            first = next((r for r in d["rows"] if r["strategy"] == strategy and r["batch"] == 1), None)
            if first is None or "vs_ar" not in first:
                raise ValueError(f"results/bench_load/{name}.json: no batch-1 ratio for {strategy}")
            body.append([d["shape"], strategy, f"{fmt(first['vs_ar'])} ({first['verdict']})", cross["measured"],
                         cross["roofline"], d["git_sha"][:7]])
    return "\n".join(["From `results/bench_load/*.json`: throughput (useful tokens) over AR + KV cache's at batch 1, "
                      "and the first batch from which every measured batch is slower than AR.", "",
                      *markdown_table(["shape", "decoder", "vs AR at batch 1", "measured crossover",
                                       "roofline crossover", "git"], body)])


def anyorder_curves(results: Path) -> str:
    """The learning-curve runs so far (``results/anyorder/curves/curves.json``): held-out accuracy at
    each evaluation, steps and CPU time, and the LR grid's picks."""
    path = results / "anyorder" / "curves" / "curves.json"
    d = read_json(path, "runs", "picks")
    body = [[r["task"], r["objective"], f"{r['lr']:g}", f"{r['steps']} / {r['cap']}",
             " ".join(f"{100 * a:.0f}" for _, a in r["evals"]) or "-",
             cpu_cell(r), r["run"]] for r in d["runs"]]
    picks = ", ".join(f"{k}: {v}" for k, v in sorted(d["picks"].items())) or "none yet"
    return "\n".join([f"From `{path.relative_to(results.parent)}` (held-out accuracy % on 100 items every 1000 steps; "
                      "the curves and the answer loss: [curves.md](../results/anyorder/curves/curves.md)).", "",
                      *markdown_table(["task", "objective", "LR", "steps", "held-out accuracy per evaluation",
                                       "CPU h", "run"], body), "", "The grid's picks among its finished runs (the plan's grid: "
                      f"5e-4, 1e-3, 2e-3 per task and objective; 2.5e-4 the Countdown diffusion edge check): {picks}."])


def countdown_faults(results: Path) -> str:
    """What is wrong with each Countdown row's answers (``countdown_failures.json``) and what the
    models learned of the answer tokens (``probe_countdown.json``)."""
    faults = read_json(results / "anyorder" / "countdown_failures.json")
    probe = read_json(results / "anyorder" / "probe_countdown.json", "results", "n")
    kinds = [k for k in next(iter(faults.values())) if k != "n"]
    body = [[row, c["n"], *(f"{100 * c[k] / max(c['n'], 1):.0f}" for k in kinds)] for row, c in faults.items()]
    tf = [[r["model"], "teacher-forced" if r["ratio"] is None else f"{r['ratio']:g}", f"{r['ce']:.2f}",
           f"{100 * r['accuracy']:.1f}"] for r in probe["results"]]
    return "\n".join(["From `results/anyorder/countdown_failures.json` (% of each row's answers with the fault; an "
                      "answer can have several):", "", *markdown_table(["row", "n", *kinds], body), "",
                      f"From `results/anyorder/probe_countdown.json` ({probe['n']} held-out puzzles; the answer "
                      "tokens scored against the reference, teacher-forced; diffusion: the masked ones at each mask "
                      "ratio):", "", *markdown_table(["model", "mask ratio", "CE nats/token", "accuracy %"], tf)])


BLOCKS = {fn.__name__: fn for fn in (anyorder_table, anyorder_tests, load_race, anyorder_curves, countdown_faults)}
