"""Several training seeds of an ``experiments.perplexity`` run, and the report across them.

``--seeds 0 1 2`` runs each seed as its own run ``<run>-s<seed>`` (:func:`seed_configs`: its own
JSONL, exported checkpoints and trainer state, so no seed overwrites another) and then writes
``perplexity_<run>_seeds.md`` / ``.csv`` from those JSONL files alone (:func:`write_seed_report`):

- per model: test PPL and NELBO (nats/token), mean +- sample std (ddof 1) over seeds;
- per adjacent pair of the ladder AR < L'4 < L'8 < L'16 < MDLM, on the NELBO: ordered (mean_a <
  mean_b); the one-sided Welch test of mean_a < mean_b (:func:`welch`, the ladder's test: a mean
  difference against the standard error of the means, which more seeds shrink; the old rule
  ``|mean_a - mean_b| > 2 max(std)`` compared it with the per-seed spread, which they do not); the
  seeds per model that test needs for 80% power at the observed difference and spreads
  (:func:`seeds_for_power`, the count a confirmation run fixes before it starts); and paired by
  seed (the models of one seed share their initialisation and batches): the per-seed differences
  b - a with a 95% t interval (:func:`paired_ci`), which takes out the noise the two rungs share;
- the share of the MDLM->AR gap that L'4 closes, ``(MDLM - L'4) / (MDLM - AR)``, of the seed
  means and per seed, on the NELBO and on the PPL, next to the paper's on the same scale;
- MC-ELBO cross-check of the MDLM model: the per-chunk paired difference LLaDA MC ELBO - BD3-LM
  NELBO (both unbiased for the same ELBO) with a 95% t interval (:func:`paired_ci`), per seed and
  pooled over seeds;
- Table 2 summary: Var(NELBO) under U[0,1] over that of the best clipped schedule, per seed.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from dlm.io import round_floats
from harness.results import write_if_changed
from experiments.perplexity.report import GAP_SCALES, gap_share, load_run, paper_gap_shares, table2, table3

#: the ladder's test of two rungs a < b (:func:`welch`) and the power a seed count is planned for
ALPHA, POWER = 0.05, 0.8
LADDER = ("ar", "bd4", "bd8", "bd16", "mdlm")


def seed_configs(cfg) -> list:
    """One :class:`RunConfig` per seed of ``cfg.seeds``: run ``<run>-s<seed>``, trainer state
    under ``<work>/s<seed>``, ``train.seed`` = the seed."""
    return [replace(cfg, run=f"{cfg.run}-s{s}", train=replace(cfg.train, seed=s), work=str(Path(cfg.work) / f"s{s}"),
                    seeds=()) for s in cfg.seeds]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1; 0 for one value). Empty: ValueError."""
    if not values:
        raise ValueError("values: need at least one value")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def welch(a: Sequence[float], b: Sequence[float]) -> dict | None:
    """One-sided Welch t-test of mean(a) < mean(b) (Welch 1947): t = (mean_b - mean_a) / sqrt(s_a^2/n_a
    + s_b^2/n_b), Welch-Satterthwaite df, p = P(T_df >= t). None with fewer than 2 values each or
    no spread."""
    if len(a) < 2 or len(b) < 2:
        return None
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    va, vb = sa * sa / len(a), sb * sb / len(b)
    if va + vb == 0:
        return None
    t = (mb - ma) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    return {"t": t, "df": df, "p": 1.0 - t_cdf(t, df)}


def seeds_for_power(diff: float, sa: float, sb: float, alpha: float = ALPHA, power: float = POWER,
                    most: int = 100) -> int | None:
    """Seeds per model for :func:`welch` at one-sided level ``alpha`` to reach ``power`` when the
    means differ by ``diff`` > 0 with per-seed spreads ``sa``, ``sb``: the smallest n >= 2 with
    ``t_{1-alpha, df} + t_{power, df} <= diff / sqrt((sa^2 + sb^2) / n)`` (the usual t-approximation
    of the noncentral-t power; Welch df at n each). None if ``diff`` <= 0 or above ``most``."""
    if diff <= 0:
        return None
    var = sa * sa + sb * sb
    if var == 0:
        return 2
    for n in range(2, most + 1):
        df = var * var * (n - 1) / (sa ** 4 + sb ** 4)
        if t_quantile(1 - alpha, df) + t_quantile(power, df) <= diff / math.sqrt(var / n):
            return n
    return None


def paired_ci(x: Sequence[float], y: Sequence[float], level: float = 0.95) -> dict:
    """Mean of the paired differences ``x_i - y_i`` with a Student-t ``level`` interval
    (needs >= 2 pairs): ``{"mean", "lo", "hi", "sd", "n"}``."""
    if len(x) != len(y):
        raise ValueError(f"x, y: need as many values each, got {len(x)} and {len(y)}")
    if len(x) < 2:
        raise ValueError(f"x, y: need >= 2 pairs for an interval, got {len(x)}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    d = [a - b for a, b in zip(x, y)]
    m, sd = mean_std(d)
    half = t_quantile(0.5 + level / 2, len(d) - 1) * sd / math.sqrt(len(d))
    return {"mean": m, "lo": m - half, "hi": m + half, "sd": sd, "n": len(d)}


def _t_pdf(df: float):
    c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return lambda t: math.exp(c - (df + 1) / 2 * math.log1p(t * t / df))


def t_cdf(x: float, df: float, n: int = 2000) -> float:
    """CDF of Student's t with ``df`` > 0 (not necessarily whole) degrees of freedom at ``x``:
    ``1/2 + int_0^x pdf`` by Simpson's rule over ``n`` panels."""
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    pdf = _t_pdf(df)
    h = x / n
    odd, even = sum(pdf((2 * i - 1) * h) for i in range(1, n // 2 + 1)), sum(pdf(2 * i * h) for i in range(1, n // 2))
    return 0.5 + h / 3 * (pdf(0.0) + 4 * odd + 2 * even + pdf(x))


def t_quantile(p: float, df: float) -> float:
    """Quantile ``p`` in (0.5, 1) of Student's t with ``df`` > 0 degrees of freedom: Newton's
    method on :func:`t_cdf` from the normal quantile."""
    if not 0.5 < p < 1 or not df > 0:
        raise ValueError(f"p must lie in (0.5, 1) and df be > 0, got p={p}, df={df}")
    pdf = _t_pdf(df)
    x = statistics.NormalDist().inv_cdf(p)
    for _ in range(50):
        step = (t_cdf(x, df) - p) / pdf(x)
        x -= step
        if abs(step) < 1e-12 * max(1.0, x):
            break
    return x


def _per_token(ci: dict, L: int) -> dict:
    return {**ci, **{k: ci[k] / L for k in ("mean", "lo", "hi", "sd")}}


def collect(out: Path, run: str, seeds: Sequence[int]) -> tuple[dict, dict]:
    """(config of the first seed, {seed: {id: record}}) of the seeds with results; the configs
    must agree but for ``train.seed`` (ValueError naming the seed otherwise)."""
    found, first = {}, None
    for s in seeds:
        path = Path(out) / f"perplexity_{run}-s{s}.jsonl"
        if not path.is_file():
            continue
        cfg, records = load_run(out, f"{run}-s{s}")
        ident = {**cfg["config"], "train": {**cfg["config"]["train"], "seed": None}}
        if first is None:
            first = (cfg, ident)
        elif ident != first[1]:
            raise ValueError(f"--seeds: run {run}-s{s} has another config than {first[0]['run']}: rerun it")
        found[s] = records
    if not found:
        raise ValueError(f"--run {run}: no results of seeds {list(seeds)} in {out}")
    return first[0], found


def summarize(per_seed: dict, L: int) -> dict:
    """Numbers of the across-seed report from ``{seed: {id: record}}``."""
    ppl: dict = {}
    for s, recs in per_seed.items():
        for r in table3(recs, {}):
            sem = recs.get(f"ppl/{r['model']}", {}).get("nelbo_sem")  # None: one pass, or exact
            ppl.setdefault((r["block_size"], r["model"]), {})[s] = (r["ppl"], r["nelbo"], r["exact"], sem)
    models = []
    for (block, name), vals in sorted(ppl.items()):
        seeds = sorted(vals)
        models.append({"model": name, "block_size": block, "seeds": seeds, "exact": vals[seeds[0]][2],
                       "ppl": [vals[s][0] for s in seeds], "nelbo": [vals[s][1] for s in seeds],
                       "sem": [vals[s][3] for s in seeds]})
    by = {m["model"]: m for m in models}
    pairs = []
    rungs = [m for m in LADDER if m in by]
    for a, b in zip(rungs, rungs[1:]):
        xa, xb = by[a]["nelbo"], by[b]["nelbo"]
        common = sorted(set(by[a]["seeds"]) & set(by[b]["seeds"]))
        ya = [xa[by[a]["seeds"].index(s)] for s in common]
        yb = [xb[by[b]["seeds"].index(s)] for s in common]
        diff = statistics.fmean(xb) - statistics.fmean(xa)
        test = welch(xa, xb)
        pairs.append({"a": a, "b": b, "diff": diff, "ordered": diff > 0, "welch": test,
                      "separated": test is not None and test["p"] < ALPHA,
                      "seeds_for_power": seeds_for_power(diff, mean_std(xa)[1], mean_std(xb)[1]) if test else None,
                      "seed_diffs": [y - x for x, y in zip(ya, yb)],
                      "paired": paired_ci(yb, ya) if len(common) > 1 else None})
    gap = None
    if {"ar", "bd4", "mdlm"} <= set(by):
        common = sorted(set(by["ar"]["seeds"]) & set(by["bd4"]["seeds"]) & set(by["mdlm"]["seeds"]))
        gap = {}
        for scale in GAP_SCALES:  # the same share on the NELBO and on the PPL (the scale of the paper's table)
            at = {n: dict(zip(by[n]["seeds"], by[n][scale])) for n in ("ar", "bd4", "mdlm")}  # {model: {seed: x}}
            means = [statistics.fmean(by[n][scale]) for n in ("ar", "bd4", "mdlm")]
            gap[scale] = {"of_means": gap_share(*means),
                          "per_seed": {s: gap_share(at["ar"][s], at["bd4"][s], at["mdlm"][s]) for s in common}}
    mc, pooled_x, pooled_y = {}, [], []
    for s, recs in per_seed.items():
        r = recs.get("mc/mdlm")
        if r and "chunk_mc_nats" in r:
            mc[s] = {"ci": _per_token(paired_ci(r["chunk_mc_nats"], r["chunk_nelbo_nats"]), L), "mc": r["nelbo"],
                     "nelbo": r["nelbo_same"], "mc_num": r["mc_num"], "chunks": len(r["chunk_mc_nats"])}
            pooled_x += r["chunk_mc_nats"]
            pooled_y += r["chunk_nelbo_nats"]
    pooled = _per_token(paired_ci(pooled_x, pooled_y), L) if len(pooled_x) > 1 else None
    clip: dict = {}
    for s, recs in per_seed.items():
        for name in sorted({r["model"] for r in table2(recs, {})}):
            v = {r["schedule"].split()[0]: r["var_nelbo"] for r in table2(recs, {}) if r["model"] == name}
            clipped = [x for k, x in v.items() if k != "U[0,1]"]
            if "U[0,1]" in v and clipped:
                best = min(clipped)
                clip.setdefault(name, {})[s] = {"ratio": v["U[0,1]"] / best if best else math.inf,
                                                "unclipped": v["U[0,1]"], "best": best}
    return {"models": models, "pairs": pairs, "gap": gap, "mc": mc, "mc_pooled": pooled, "clip": clip}


def _ms(values: Sequence[float], nd: int = 3) -> str:
    m, s = mean_std(values)
    return f"{m:.{nd}f} ± {s:.{nd}f}"


def render(cfg: dict, seeds: Sequence[int], got: Sequence[int], summ: dict) -> str:
    ident, run = cfg["config"], cfg["run"].rsplit("-s", 1)[0]
    L = ident["data"]["seq_len"]
    lines = [f"# BD3-LM perplexity ladder across seeds: run `{run}` (preset `{ident['preset']}`)", "",
             f"Training seeds with results: {list(got)} of {list(seeds)} (runs `{run}-s<seed>`); eval seed "
             f"{ident['eval']['seed']}. Data: train `{ident['data']['train']}`, test `{ident['data']['test']}`, "
             f"tokenizer `{ident['data']['tokenizer']}`, L={L}, spans {ident['data'].get('spans', [])}.", "",
             "## Test perplexity, mean ± std over seeds (sample std, ddof 1)", "",
             f"Eval s.e.: the Monte Carlo standard error of one seed's NELBO over the "
             f"{ident['eval'].get('passes', 1)} passes averaged (largest over seeds; exact for AR), to set "
             "against the seed std.", "",
             "| Model | L' | seeds | test PPL | NELBO (nats/token) | eval s.e. | PPL per seed |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for m in summ["models"]:
        bound = "=" if m["exact"] else "≤"
        sems = [x for x in m["sem"] if x is not None]
        sem = "exact" if m["exact"] else f"{max(sems):.4f}" if sems else "n/a (1 pass)"
        lines.append(f"| {m['model']} | {m['block_size']} | {len(m['seeds'])} | {bound}{_ms(m['ppl'], 2)} | "
                     f"{_ms(m['nelbo'], 4)} | {sem} | {', '.join(f'{p:.2f}' for p in m['ppl'])} |")
    lines += ["", "## Ladder order: one-sided Welch test of mean_a < mean_b on the NELBO", "",
              f"Separated: p < {ALPHA}. Seeds for {POWER:.0%} power: the seeds per model the test needs to "
              f"separate the pair at level {ALPHA} with probability {POWER:.0%} if the true difference and "
              "spreads are the ones observed here (a confirmation run fixes its seed count from this before it "
              "starts, and is tested on its own seeds only).", "", *_welch_table(summ["pairs"])]
    if summ.get("raw"):
        lines += _raw_section(summ)
    if any(p["paired"] for p in summ["pairs"]):
        lines += ["", "Paired by seed (a seed's models share their initialisation and batches): the per-seed "
                  "differences b − a, their mean ± std and 95% t interval; above 0: b is worse than a beyond the "
                  "noise the two share.", "",
                  "| pair a < b | per seed b − a | mean ± std | 95% t interval | above 0 |", "|---|---|---:|---|---|"]
        for p in summ["pairs"]:
            c = p["paired"]
            if c:
                lines.append(f"| {p['a']} < {p['b']} | {', '.join(f'{d:+.4f}' for d in p['seed_diffs'])} | "
                             f"{c['mean']:+.4f} ± {c['sd']:.4f} | [{c['lo']:+.4f}, {c['hi']:+.4f}] | "
                             f"{'yes' if c['lo'] > 0 else 'NO'} |")
    if summ["gap"]:
        paper = paper_gap_shares()
        lines += ["", "Share of the MDLM→AR gap closed by L'=4, (MDLM − L'4)/(MDLM − AR), on each scale (the share "
                  "depends on it: PPL = exp(NELBO)); the paper's is computed the same way from its LM1B Table 3.",
                  "", "| scale | of the seed means | per seed, mean ± std | paper, LM1B |", "|---|---:|---:|---:|"]
        for scale in GAP_SCALES:
            g = summ["gap"][scale]
            per = [x for x in g["per_seed"].values() if x is not None]
            share = "n/a (MDLM ≤ AR)" if g["of_means"] is None else f"**{100 * g['of_means']:.1f}%**"
            spread = f"{100 * mean_std(per)[0]:.1f}% ± {100 * mean_std(per)[1]:.1f}%" if per else "n/a"
            lines.append(f"| {'NELBO (nats/token)' if scale == 'nelbo' else 'test PPL'} | {share} | {spread} | "
                         f"{100 * paper[scale]:.1f}% |")
    if summ["mc"]:
        lines += ["", "## Cross-check: LLaDA MC ELBO − BD3-LM NELBO of the MDLM model (paired per test chunk)", "",
                  "Both estimate the same ELBO (linear schedule), so the difference should be 0 within its interval.",
                  "", "| seed | chunks | samples / chunk (each) | MC ELBO | NELBO | mean diff (nats/token) | "
                  "95% t interval | contains 0 |", "|---:|---:|---:|---:|---:|---:|---|---|"]
        rows = sorted(summ["mc"].items()) + ([("pooled", {"ci": summ["mc_pooled"], "chunks": summ["mc_pooled"]["n"],
                                                          "mc_num": "", "mc": None, "nelbo": None})]
                                             if summ["mc_pooled"] and len(summ["mc"]) > 1 else [])
        for s, r in rows:
            ci = r["ci"]
            mc_s = "" if r["mc"] is None else f"{r['mc']:.4f}"
            ne_s = "" if r["nelbo"] is None else f"{r['nelbo']:.4f}"
            lines.append(f"| {s} | {r['chunks']} | {r['mc_num']} | {mc_s} | {ne_s} | {ci['mean']:+.4f} | "
                         f"[{ci['lo']:+.4f}, {ci['hi']:+.4f}] | {'yes' if ci['lo'] <= 0 <= ci['hi'] else 'NO'} |")
    if summ["clip"]:
        lines += ["", "## Clipping (Table 2): Var(NELBO) under U[0,1] / under the best clipped schedule", "",
                  "| model | ratio, mean ± std over seeds | per seed |", "|---|---:|---|"]
        for name, per in sorted(summ["clip"].items(), key=lambda kv: int(kv[0][2:])):
            ratios = [v["ratio"] for _, v in sorted(per.items())]
            lines.append(f"| {name} | {_ms(ratios, 2)}x | {', '.join(f'{x:.2f}' for x in ratios)} |")
    lines += ["", "Per-seed tables: `perplexity_<run>-s<seed>.md`.", ""]
    return "\n".join(lines)


def _welch_table(pairs: Sequence[dict]) -> list[str]:
    lines = ["| pair a < b | mean_b - mean_a | Welch t (df) | one-sided p | ordered | separated | seeds for "
             f"{POWER:.0%} power |", "|---|---:|---:|---:|---|---|---:|"]
    for p in pairs:
        w = p["welch"]
        test = "n/a" if w is None else f"{w['t']:.2f} ({w['df']:.1f})"
        pv = "n/a" if w is None else f"{w['p']:.2g}"
        need = p["seeds_for_power"] if p["seeds_for_power"] is not None else "n/a"
        lines.append(f"| {p['a']} < {p['b']} | {p['diff']:.4f} | {test} | {pv} | {'yes' if p['ordered'] else 'NO'} | "
                     f"{'yes' if p['separated'] else 'NO'} | {need} |")
    return lines


def _raw_section(summ: dict) -> list[str]:
    """The runs' raw weights beside their EMA (the tables above): the variance reduction tried."""
    raw = {m["model"]: m for m in summ["raw"]["models"]}
    lines = ["", "## The same runs without their EMA (raw weights)", "",
             "The runs trained with an EMA of their weights (`--ema`); the tables above evaluate the EMA weights, "
             "these the raw weights of the same runs (same seeds, same batches), so the std ratio is the seed "
             "spread the EMA removes.", "",
             "| model | seeds | NELBO, raw | NELBO, EMA | std EMA / raw |", "|---|---:|---:|---:|---:|"]
    for m in summ["models"]:
        r = raw.get(m["model"])
        if r is None:
            continue
        sd_raw, sd_ema = mean_std(r["nelbo"])[1], mean_std(m["nelbo"])[1]
        ratio = f"{sd_ema / sd_raw:.2f}" if sd_raw > 0 else "n/a"
        lines.append(f"| {m['model']} | {len(r['seeds'])} | {_ms(r['nelbo'], 4)} | {_ms(m['nelbo'], 4)} | {ratio} |")
    return lines + ["", "One-sided Welch test on the raw weights:", "", *_welch_table(summ["raw"]["pairs"])]


def render_csv(summ: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["table", "model", "block_size", "seeds", "mean", "std", "values"])
    for m in summ["models"]:
        for key in ("ppl", "nelbo"):
            w.writerow([key, m["model"], m["block_size"], len(m["seeds"]), *round_floats(mean_std(m[key])),
                        " ".join(f"{x:.6g}" for x in m[key])])
    for name, per in sorted(summ["clip"].items()):
        ratios = [v["ratio"] for _, v in sorted(per.items())]
        w.writerow(["var_ratio", name, int(name[2:]), len(ratios), *round_floats(mean_std(ratios)),
                    " ".join(f"{x:.6g}" for x in ratios)])
    for scale, g in (summ["gap"] or {}).items():  # per seed; the of-means share is in the md
        per = [x for _, x in sorted(g["per_seed"].items()) if x is not None]
        if per:
            w.writerow([f"gap_share_{scale}", "bd4", 4, len(per), *round_floats(mean_std(per)), " ".join(f"{x:.6g}" for x in per)])
    return buf.getvalue()


def write_seed_report(out: Path, run: str, seeds: Sequence[int]) -> Path:
    """``perplexity_<run>_seeds.md`` / ``.csv`` from the seeds' JSONL files; returns the md path."""
    cfg, per_seed = collect(out, run, seeds)
    summ = summarize(per_seed, cfg["config"]["data"]["seq_len"])
    raw = {s: {rid.replace("ppl_raw/", "ppl/"): {**r, "kind": "ppl"} for rid, r in recs.items() if r["kind"] == "ppl_raw"}
           for s, recs in per_seed.items()}
    if any(raw.values()):  # the runs' raw weights, evaluated beside their EMA
        summ["raw"] = summarize({s: recs for s, recs in raw.items() if recs}, cfg["config"]["data"]["seq_len"])
    base = Path(out) / f"perplexity_{run}_seeds"
    write_if_changed(base.with_suffix(".md"), render(cfg, seeds, sorted(per_seed), summ))
    write_if_changed(base.with_suffix(".csv"), render_csv(summ))
    return base.with_suffix(".md")
