"""Tables, Pareto plot and factorial ablation of a GSM8K harness run, from its files only (no model).

    python -m harness.report --out results/gsm8k_arith [--baseline baseline_semiar]

Reads ``<out>/<strategy>.jsonl`` and ``config.json`` (never the per-rank logs), every record checked
(:mod:`harness.records`; rows over different problems noted, or with ``--common-problems``
restricted to the shared ones: :mod:`harness.problem_sets`), and writes

- ``table.md`` / ``table.csv`` / ``table.json``: Fast-dLLM Table 1 layout, one row per strategy:
  accuracy % with a seeded 95% bootstrap CI (1000 resamples), throughput (generated tokens up
  to and including the first EOS / wall-clock seconds of generation), speed-up vs the baseline
  row (when absent, the header and ``meta.speedup_note`` name the row used instead), NFE per
  sample and per generated token, tokens per step, positions computed per generated token, n,
  batch size (``batch_rows``; mixed sizes are flagged and named in every throughput cell);
  the accuracy change vs that row with its paired 95% CI and the verdict against the margin the run
  declared (:mod:`harness.noninferiority`); on the arithmetic task, chain-step accuracy (every
  intermediate result right, :mod:`harness.chain_steps`) with its own McNemar test.
  Below it, the Pareto front and the fastest row not significantly less accurate than the baseline;
- ``pareto.png``: accuracy vs throughput (log x), CI error bars, one line per cache, front highlighted;
- ``ablation.md`` / ``ablation.csv``: main effects of cache x parallel decoding x stop_at_eos x
  block size on log throughput (and on accuracy), from an additive least-squares fit over the
  factor cells of the baseline / fastdllm rows (rows with identical levels averaged into one
  cell; for a complete factorial, e.g. ``--strategies factorial``, these are the classical main
  effects, the differences of marginal means). ``exp(effect)`` is the speed-up attributed to the factor level.

Every file records the git SHA(s) and config hashes of the runs and the report's own git SHA.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from dlm.io import round_floats, stable_json
from harness.cli import parser, run_main
from harness.problem_sets import ProblemSets, align
from harness.records import strategy_files, REPORT, expected_of, read_records, run_config, timed_speedups
from harness.results import atomic_write_text
from tasks.evaluate import mcnemar_exact
from harness.frontier import _fmt, frontier, render_frontier
from harness.plots import pareto_front, plot_pareto  # noqa: F401  (pareto_front re-exported)
from harness.grids import sampler_names
from harness.ablation import FACTORS, Effect, factorial_effects, render_ablation  # noqa: F401  (re-exported)
from harness import noninferiority
from harness import chain_steps

def bootstrap_ci(values: Sequence[float], n_resamples: int = 1000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of ``values`` (deterministic for a given seed)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {x.shape}")
    if not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive int, got {n_resamples!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_resamples, x.size))].mean(axis=1)  # (n_resamples,)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def throughput(records: Sequence[dict]) -> float:
    """Generated tokens up to and including the first EOS / wall-clock seconds of generation."""
    seconds = sum(r["seconds"] for r in records)
    return sum(r["tokens_until_eos"] for r in records) / seconds if seconds > 0 else float("nan")


@dataclass(frozen=True)
class Row:
    strategy: str
    n: int
    accuracy: float
    ci_low: float
    ci_high: float
    tokens_per_second: float
    speedup: float
    nfe: float
    nfe_per_token: float
    tokens_per_step: float
    positions_per_token: float
    seconds: float
    factors: dict
    config_hashes: str
    git_shas: str
    batch_rows: str = "?"  # batch size(s) the samples were decoded at ("?": not recorded)
    flops_per_token: float = float("nan")  # model FLOPs per generated token (nan: not recorded)
    flop_ideal: float = float("nan")  # the reference's FLOPs/token over this row's: the speed-up FLOPs predict
    mcnemar_p: float = float("nan")  # exact McNemar p vs the speed-up reference on the shared problems
    discordant: str = "-"  # "b/c": reference right & row wrong / reference wrong & row right
    change_pp: float = float("nan")  # accuracy change vs the reference on the shared problems, points
    change_low_pp: float = float("nan")  # its paired 95% CI (harness.noninferiority)
    change_high_pp: float = float("nan")
    margin_pp: float = float("nan")  # the non-inferiority margin the run declared (nan: none)
    verdict: str = "-"  # harness.noninferiority.verdict ("-": the reference row)
    chain_accuracy: float = float("nan")  # every intermediate result right (nan: not the arithmetic task)
    chain_ci_low: float = float("nan")
    chain_ci_high: float = float("nan")
    chain_mcnemar_p: float = float("nan")
    chain_discordant: str = "-"


def batch_sizes(records: Sequence[dict]) -> str:
    """The batch size(s) of a strategy's records, space-separated ("?" when not recorded).

    A smaller ``batch_rows`` held by at most that many records is one final partial batch
    (n not a multiple of the batch size), not a second batch size."""
    counts = Counter(r.get("batch_rows") for r in records)
    if None in counts:
        return "?"
    top = max(counts)
    return " ".join(str(v) for v in sorted(counts) if v == top or counts[v] > v)


def summarize(name: str, records: Sequence[dict], n_resamples: int = 1000, seed: int = 0) -> Row:
    """One table row (speed-up left at nan; :func:`table_rows` fills it in)."""
    if not records:
        raise ValueError(f"strategy {name}: no records")
    tokens = sum(r["tokens_until_eos"] for r in records)
    lo, hi = bootstrap_ci([float(r["correct"]) for r in records], n_resamples, seed)
    steps = sum(r["steps"] for r in records)
    return Row(
        strategy=name, n=len(records), accuracy=sum(r["correct"] for r in records) / len(records),
        ci_low=lo, ci_high=hi, tokens_per_second=throughput(records), speedup=float("nan"),
        nfe=sum(r["nfe"] for r in records) / len(records), nfe_per_token=sum(r["nfe"] for r in records) / tokens,
        tokens_per_step=sum(r["tokens_committed"] for r in records) / max(steps, 1),
        positions_per_token=sum(r["positions_computed"] for r in records) / tokens,
        seconds=sum(r["seconds"] for r in records), factors=dict(records[0].get("factors") or {}),
        config_hashes=" ".join(sorted({str(r.get("config_hash")) for r in records})),
        git_shas=" ".join(sorted({str(r.get("git_sha")) for r in records})), batch_rows=batch_sizes(records),
        flops_per_token=(sum(r["flops"] for r in records) / tokens if all(r.get("flops") for r in records)
                         else float("nan")))


def load_runs(out: Path) -> dict[str, list[dict]]:
    """strategy -> records of ``<out>/<strategy>.jsonl`` (per-rank logs excluded), in table order."""
    out = Path(out)
    if not out.is_dir():
        raise ValueError(f"--out {out} is not a directory")
    runs = {}
    for path in strategy_files(out):
        records = read_records(path, expected_of(path, REPORT, strategy=path.stem))  # checked, not trusted
        if records:
            runs[path.stem] = sorted(records, key=lambda r: (r.get("index", 0), str(r["id"])))
    order = list(sampler_names())
    return dict(sorted(runs.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))


def speedup_reference(rows: Sequence[Row], baseline: str) -> tuple[Optional[Row], Optional[str]]:
    """The row speed-ups are relative to: ``baseline``'s, else the first row's, with a note
    saying so (None when the baseline row is there)."""
    base = next((r for r in rows if r.strategy == baseline), None)
    if base is not None or not rows:
        return base, None
    return rows[0], f"no {baseline} row: speed-ups relative to {rows[0].strategy} instead"


def paired_test(base: Sequence[dict], other: Sequence[dict]) -> tuple[float, str]:
    """Exact McNemar p and the discordant counts "b/c" of two strategies on their shared problems
    (b: ``base`` right, ``other`` wrong; c: the reverse)."""
    right = {r["id"]: bool(r["correct"]) for r in base}
    shared = [(right[r["id"]], bool(r["correct"])) for r in other if r["id"] in right]
    b = sum(x and not y for x, y in shared)
    c = sum(y and not x for x, y in shared)
    return mcnemar_exact(b, c), f"{b}/{c}"


def table_rows(runs: dict[str, list[dict]], baseline: str, n_resamples: int = 1000, seed: int = 0,
               margins: dict | None = None, chain: dict | None = None) -> list[Row]:
    """One row per strategy, speed-up, paired McNemar test and paired CI of the accuracy change
    (verdict against ``margins[strategy]``, points, when declared) relative to
    :func:`speedup_reference`; ``chain``: the runs scored on every chain step
    (:func:`harness.chain_steps.chain_runs`). Every float rounded (:func:`dlm.io.round_floats`), so
    the tables and the ablation fit built from the rows do not see the last bits in which machines' sums differ."""
    rows = [summarize(name, recs, n_resamples, seed) for name, recs in runs.items()]
    base, _ = speedup_reference(rows, baseline)
    out = []
    for r in rows:
        p, bc = paired_test(runs[base.strategy], runs[r.strategy]) if base else (r.mcnemar_p, r.discordant)
        extra = dict(speedup=r.tokens_per_second / base.tokens_per_second,
                     flop_ideal=base.flops_per_token / r.flops_per_token, mcnemar_p=p, discordant=bc) if base else {}
        if base and r is not base:
            change = noninferiority.paired_change(runs[base.strategy], runs[r.strategy])
            margin = (margins or {}).get(r.strategy)
            extra |= {**change, "margin_pp": float("nan") if margin is None else margin,
                      "verdict": noninferiority.verdict(change["change_low_pp"], change["change_high_pp"], margin)}
        if chain:
            c = summarize(r.strategy, chain[r.strategy], n_resamples, seed)
            cp, cbc = paired_test(chain[base.strategy], chain[r.strategy]) if base else (c.mcnemar_p, c.discordant)
            extra |= {"chain_accuracy": c.accuracy, "chain_ci_low": c.ci_low, "chain_ci_high": c.ci_high,
                      "chain_mcnemar_p": cp, "chain_discordant": cbc}
        out.append(Row(**round_floats({**asdict(r), **extra})))
    return out


def mixed_batches(rows: Sequence[Row]) -> bool:
    """Whether the rows' throughputs come from more than one batch size (or one is unknown)."""
    return len({size for r in rows for size in r.batch_rows.split()}) > 1


# -------------------------------------------------------------------------------------- writers
def _meta(out: Path, rows: Sequence[Row], baseline: str, n_resamples: int, seed: int,
          sets: ProblemSets | None = None, chain_note: str | None = None) -> dict:
    base, note = speedup_reference(rows, baseline)
    chain = any(math.isfinite(r.chain_accuracy) for r in rows)
    return {"run_git_shas": sorted({s for r in rows for s in r.git_shas.split()}),
            "baseline": baseline, "speedup_reference": base.strategy if base else None, "speedup_note": note,
            "batch_rows": {r.strategy: r.batch_rows for r in rows}, "mixed_batch_rows": mixed_batches(rows),
            "bootstrap": {"resamples": n_resamples, "seed": seed, "level": 0.95},
            "config_hashes": {r.strategy: r.config_hashes for r in rows},
            "run_config": run_config(out).get("strategies", {}), "frontier": frontier(rows, base.strategy if base else None),
            "noninferiority": {"interval": noninferiority.INTERVAL, "margins_pp": {
                r.strategy: r.margin_pp for r in rows if math.isfinite(r.margin_pp)}},
            **({"chain_steps": {"computed": chain, "note": chain_note}} if chain or chain_note else {}),
            "above_flop_ideal": above_ideal(rows),
            **({"problem_sets": asdict(sets)} if sets else {}),
            **({"timed": timed} if (timed := timed_speedups(out)) else {})}


def above_ideal(rows: Sequence[Row]) -> list[str]:
    """Rows whose speed-up exceeds their FLOP ideal: time cannot beat the FLOPs it follows, so
    such a row and its reference were not timed alike (another load, another invocation)."""
    return [r.strategy for r in rows if math.isfinite(r.speedup) and math.isfinite(r.flop_ideal)
            and r.speedup > r.flop_ideal]


def _ideal_words(meta: dict) -> list[str]:
    rows = meta["above_flop_ideal"]
    return [f"**Speed-up above its FLOP ideal** ({', '.join(rows)}): these rows and `{meta['speedup_reference']}` "
            "were not timed alike (another load or invocation), so their speed-ups are not evidence; their "
            "accuracies are.", ""] if rows else []


def _speedup_words(meta: dict) -> str:
    if meta["speedup_note"]:
        return f"**{meta['speedup_note']}**"
    return f"speed-up vs `{meta['speedup_reference']}`"


def _batch_words(meta: dict) -> str:
    if not meta["mixed_batch_rows"]:
        return ""
    sizes = ", ".join(f"{k} {v}" for k, v in meta["batch_rows"].items())
    return (f" **Mixed batch sizes** (batch_rows: {sizes}; ? = not recorded): throughput per row depends on "
            "the batch size, so compare tokens/s only between rows of the same batch size.")


def _timed_words(meta: dict) -> list[str]:
    t = meta.get("timed")
    if not t:
        return []
    return [f"Timed speed-up: the baseline `{t['baseline']}` and each row decoded alternately on the same batches "
            f"(`python -m experiments.eval.timing`, timing.md), {t['repeats']} repeats over {t['problems']} problems "
            "(a declared subset, named in timing.md), the median over (repeat, batch) cells with its 95% bootstrap "
            "CI: the speed-up to read; the single-run column beside it is one invocation per row.", ""]


def _timed_header(meta: dict) -> str:
    return f"timed speed-up vs {meta['timed']['baseline']} [95% CI] | " if "timed" in meta else ""


def _timed_cell(meta: dict, strategy: str) -> str:
    if "timed" not in meta:
        return ""
    t = meta["timed"]["rows"].get(strategy)
    return "- | " if t is None else f"{t[0]:.2f}x [{t[1]:.2f}, {t[2]:.2f}] | "


def render_table(rows: Sequence[Row], meta: dict) -> str:
    mixed, ref = meta["mixed_batch_rows"], meta["speedup_reference"]
    chain = meta.get("chain_steps", {}).get("computed", False)
    lines = ["# GSM8K: accuracy and throughput per strategy (Fast-dLLM Table 1 layout)", "",
             f"git {' '.join(meta['run_git_shas'])} (the commits that produced the samples); {_speedup_words(meta)}; "
             f"95% bootstrap CI ({meta['bootstrap']['resamples']} resamples, seed "
             f"{meta['bootstrap']['seed']}); throughput = tokens up to and including the first EOS / "
             f"wall-clock seconds of generation; McNemar: exact paired test against the same row on the "
             f"same problems (b/c: problems only it / only this row solves); FLOP ideal: its FLOPs per token "
             f"over this row's, the speed-up if time followed FLOPs.{_batch_words(meta)}", "",
             noninferiority.words(ref), "", *([chain_steps.words(meta), ""] if "chain_steps" in meta else []),
             *([meta["problem_sets"]["note"], ""] if "problem_sets" in meta else []), *_ideal_words(meta),
             *_timed_words(meta),
             f"| strategy | accuracy % [95% CI] | McNemar p (b/c) | {noninferiority.header(ref)}"
             f"{chain_steps.HEADER if chain else ''}tokens/s{' (batch size)' if mixed else ''} | "
             f"speed-up vs {ref} | {_timed_header(meta)}FLOP ideal | NFE | NFE/token | tokens/step | "
             "positions/token | n | config |", "|---" * (14 + 2 * chain + ("timed" in meta)) + "|"]
    for r in rows:
        batch = f" (batch {r.batch_rows})" if mixed else ""
        test = "-" if r.strategy == ref else f"{_fmt(r.mcnemar_p, '.2g')} ({r.discordant})"
        lines.append(f"| {r.strategy} | {100 * r.accuracy:.1f} [{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}] | "
                     f"{test} | {noninferiority.cells(r, r.strategy == ref)}"
                     f"{chain_steps.cells(r, r.strategy == ref, _fmt) if chain else ''}"
                     f"{_fmt(r.tokens_per_second, '.1f')}{batch} | {_fmt(r.speedup, '.2f')}x | "
                     f"{_timed_cell(meta, r.strategy)}{_fmt(r.flop_ideal, '.2f')}x | {r.nfe:.1f} | "
                     f"{r.nfe_per_token:.3f} | {r.tokens_per_step:.2f} | {r.positions_per_token:.1f} | {r.n} | "
                     f"{r.config_hashes} |")
    return "\n".join(lines) + "\n" + render_frontier(rows, meta)


CSV_FIELDS = ("strategy", "n", "accuracy", "ci_low", "ci_high", "mcnemar_p", "discordant", "tokens_per_second",
              "batch_rows", "speedup", "speedup_vs", "flops_per_token", "flop_ideal", "nfe", "nfe_per_token",
              "tokens_per_step", "positions_per_token", "seconds", "config_hashes", "git_shas")


def render_csv(rows: Sequence[Row], speedup_vs: Optional[str] = None) -> str:
    """``table.csv``: one line per row; ``speedup_vs`` names the row speed-ups are relative to."""
    buf = io.StringIO()
    fields = CSV_FIELDS + noninferiority.FIELDS + (chain_steps.FIELDS if any(
        math.isfinite(r.chain_accuracy) for r in rows) else ())
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for r in rows:
        d = {**asdict(r), "speedup_vs": speedup_vs}
        w.writerow({k: d[k] for k in fields})
    return buf.getvalue()


@dataclass(frozen=True)
class Report:
    rows: list
    effects: list
    table_md: str
    table_csv: str
    ablation_md: str


def build_report(out: Path, baseline: str = "baseline_semiar", n_resamples: int = 1000, seed: int = 0,
                 plot: bool = True, common: bool = False) -> Report:
    """Rebuild every report file of ``out`` from its JSONL files; ``common``: every row over the
    problems all rows share (:func:`harness.problem_sets.align`; else each over its own, noted)."""
    out = Path(out)
    runs = load_runs(out)
    if not runs:
        raise ValueError(f"--out {out}: no <strategy>.jsonl results to report")
    try:
        runs, sets = align(runs, baseline if baseline in runs else next(iter(runs)), common)
    except ValueError as e:
        raise ValueError(f"--out {out}: {e}") from None
    chain, chain_note = chain_steps.chain_runs(out, runs)
    margins = noninferiority.margins(out, runs, baseline if baseline in runs else next(iter(runs)))
    rows = table_rows(runs, baseline, n_resamples, seed, margins, chain)
    meta = _meta(out, rows, baseline, n_resamples, seed, sets, chain_note)
    effects, info = factorial_effects(rows, baseline)
    md, csv_text = render_table(rows, meta), render_csv(rows, meta["speedup_reference"])
    abl_md, abl_csv = render_ablation(effects, info, meta)
    atomic_write_text(out / "table.md", md)
    atomic_write_text(out / "table.csv", csv_text)
    atomic_write_text(out / "table.json", stable_json({"meta": meta, "rows": [asdict(r) for r in rows],
                                                      "ablation": [asdict(e) for e in effects],
                                                      "ablation_fit": info}, indent=2) + "\n")
    atomic_write_text(out / "ablation.md", abl_md)
    atomic_write_text(out / "ablation.csv", abl_csv)
    if plot:
        plot_pareto(rows, out / "pareto.png", meta)
    return Report(rows, effects, md, csv_text, abl_md)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = parser("harness.report", __doc__)
    p.add_argument("--out", required=True, help="results directory of python -m experiments.eval.gsm8k")
    p.add_argument("--baseline", default="baseline_semiar",
                   help="row the speed-up is relative to (default baseline_semiar; when absent, the first row, "
                        "and the table says so)")
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--no-plot", action="store_true", help="skip pareto.png")
    p.add_argument("--common-problems", action="store_true",
                   help="report every row over the problems all rows share (default: each row over its own, "
                        "with a note when they differ)")
    a = p.parse_args(argv)
    print(build_report(Path(a.out), a.baseline, a.resamples, a.seed, plot=not a.no_plot,
                       common=a.common_problems).table_md)


if __name__ == "__main__":
    run_main(main)
