"""Tables and plot of an ``experiments.perplexity`` run, rebuilt from its JSONL file only.

    python -m experiments.perplexity report --run laptop      # or write_report(out_dir, run)

Reads ``<out>/perplexity_<run>.jsonl`` (never a model) and writes ``perplexity_<run>.md`` /
``.csv`` / ``.png``:

- BD3-LM Table 3 layout: test perplexity per block size, ``=`` exact AR NLL (L'=1), ``<=``
  NELBO bound (BD3-LM eq. 8, unclipped U[0,1], low-discrepancy t), with the paper's LM1B
  (Table 3) or OWT numbers beside; plus LLaDA's Monte-Carlo ELBO (eq. 6) of the MDLM model and
  its NELBO on the same chunks, as a cross-check of two bounds on one model;
- BD3-LM Table 2 layout: Var(NELBO) (mean over test batches of the variance of the
  per-(sequence, block) NELBO means; nats^2) and test PPL under U[0,1], U[.3,.8], U[.5,1] and the
  searched clipping;
- the issue's bars (ordering, share of the MDLM->AR gap closed by L'=4, variance reduction);
- a PPL-vs-block-size plot (log x). Every file carries the git SHA(s) of the records (the commits
  that computed them, not the one that rebuilt the tables), config hash and seeds.

Files whose content would not change are not rewritten (:func:`write_if_changed`), so rebuilding
the tables of unchanged records is a no-op.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Optional

from dlm.io import round_floats, stable_json
from harness.results import read_jsonl, write_if_changed

#: BD3-LM Table 3 (LM1B, L=128) and the OWT table (L=1024): test perplexity per model.
PAPER_PPL = {"lm1b": {"ar": 22.83, "bd4": 28.23, "bd8": 29.83, "bd16": 30.60, "mdlm": 31.78},
             "owt": {"ar": 17.54, "bd4": 20.73, "bd8": 21.68, "bd16": 22.27, "mdlm": 22.98}}
#: sequence length of the paper's MDLM point
PAPER_L = {"lm1b": 128, "owt": 1024}
#: BD3-LM Table 2 (LM1B): Var(NELBO) of L'=4 per training schedule.
PAPER_VAR = {"lm1b": {("bd4", "U[0,1]"): 23.65, ("bd4", "U[.3,.8]"): 10.39, ("bd4", "U[.5,1]"): 8.28}}
CSV_FIELDS = ("table", "model", "block_size", "schedule", "ppl", "nelbo", "var_nelbo", "tokens", "exact",
              "steps", "paper_ppl", "paper_var", "git_sha", "config_hash", "seed", "eval_seed")


def load_run(out: Path, run: str) -> tuple[dict, dict]:
    """(config record, {id: record}) of a run; the first record of an id wins."""
    path = Path(out) / f"perplexity_{run}.jsonl"
    records: dict = {}
    for r in read_jsonl(path):
        records.setdefault(r["id"], r)
    if "config" not in records:
        raise ValueError(f"--run {run}: no results in {path}")
    return records.pop("config"), records


def _label(model: str, block: int) -> str:
    return "AR" if block == 1 else ("MDLM" if model == "mdlm" else "BD3-LM")


def total_steps(records: dict, name: str) -> Optional[int]:
    """Optimizer steps behind a model, those of the job it was initialised from included."""
    tr = records.get(f"train/{name}")
    if tr is None:
        return None
    return tr["steps"] + ((total_steps(records, tr["init"]) or 0) if tr.get("init") else 0)


def table3(records: dict, paper: dict) -> list[dict]:
    """One row per evaluated model, ordered by block size (AR ... MDLM)."""
    rows = []
    for r in records.values():
        if r["kind"] != "ppl":
            continue
        rows.append({"table": "table3", "model": r["model"], "block_size": r["block_size"], "schedule": "U[0,1]",
                     "ppl": r["ppl"], "nelbo": r["nelbo"], "tokens": r["tokens"], "exact": r["exact"],
                     "steps": total_steps(records, r["model"]), "paper_ppl": paper.get(r["model"]), **_prov(r)})
    return sorted(rows, key=lambda x: x["block_size"])


def table2(records: dict, paper_var: dict) -> list[dict]:
    rows = []
    for r in records.values():
        if r["kind"] == "var":
            key = r["schedule"].split()[0]
            rows.append({"table": "table2", "model": r["model"], "block_size": r["block_size"],
                         "schedule": r["schedule"], "ppl": r["ppl"], "nelbo": r["nelbo"], "var_nelbo": r["var_nelbo"],
                         "clipped_nelbo": r["clipped_nelbo"], "evaluated": r["evaluated"],
                         "trained_under": r["trained_under"], "paper_var": paper_var.get((r["model"], key)),
                         **_prov(r)})
    order = {"U[0,1]": 0, "U[.3,.8]": 1, "U[.5,1]": 2}
    return sorted(rows, key=lambda x: (x["block_size"], order.get(x["schedule"], 3)))


def _prov(r: dict) -> dict:
    return {k: r.get(k) for k in ("git_sha", "config_hash", "seed", "eval_seed")}


def gap_share(ar: float, bd4: float, mdlm: float) -> Optional[float]:
    """``(mdlm - bd4) / (mdlm - ar)``: the share of the MDLM->AR gap L'4 closes; None when MDLM <= AR."""
    return (mdlm - bd4) / (mdlm - ar) if mdlm > ar else None


GAP_SCALES = ("nelbo", "ppl")  # the share is not scale-free: PPL = exp(NELBO) stretches the upper rungs


def paper_gap_shares(style: str = "lm1b") -> dict:
    """The share L'4 closes in the paper's Table 3 (:data:`PAPER_PPL`), on each of :data:`GAP_SCALES`:
    on LM1B 39.7% of the PPL gap (22.83 / 28.23 / 31.78), 35.8% of the NELBO gap (their logs)."""
    ppl = PAPER_PPL[style]
    return {"ppl": gap_share(ppl["ar"], ppl["bd4"], ppl["mdlm"]),
            "nelbo": gap_share(*(math.log(ppl[m]) for m in ("ar", "bd4", "mdlm")))}


def bars(t3: list[dict], t2: list[dict], style: str = "lm1b") -> list[tuple[str, str, bool]]:
    """(bar, measured, passed) for the issue's three bars (absent models: not evaluated); the gap share
    is set beside the paper's on ``style``'s Table 3 (LM1B for styles the paper did not run)."""
    out = []
    ppl = {r["model"]: r["ppl"] for r in t3}
    seq = [r["ppl"] for r in t3]
    names = ", ".join(f"{r['model']} {r['ppl']:.2f}" for r in t3)
    out.append(("ordering AR < L'4 < L'8 < L'16 < MDLM", names or "no models",
                len(seq) > 1 and all(a < b for a, b in zip(seq, seq[1:]))))
    if {"ar", "bd4", "mdlm"} <= set(ppl):
        share = gap_share(ppl["ar"], ppl["bd4"], ppl["mdlm"])  # on the PPL, as the paper's 39.7%
        measured = "n/a: MDLM <= AR" if share is None else f"{100 * share:.1f}%"
        ok = share is not None and share >= 0.4
        ref = style if style in PAPER_PPL else "lm1b"
        paper = f"paper {ref.upper()} {100 * paper_gap_shares(ref)['ppl']:.1f}%"
        out.append((f"L'=4 closes >= 40% of the MDLM->AR PPL gap ({paper})", measured, ok))
    v4 = {r["schedule"].split()[0]: r["var_nelbo"] for r in t2 if r["model"] == "bd4"}
    if "U[0,1]" in v4 and len(v4) > 1:
        best = min(v for k, v in v4.items() if k != "U[0,1]")
        ratio = v4["U[0,1]"] / best if best else float("inf")
        out.append(("clipping cuts Var(NELBO) of L'=4 by >= 2x", f"{ratio:.2f}x (best clipped)", ratio >= 2))
    return out


def _f(x, nd: int = 2, prefix: str = "") -> str:
    return "—" if x is None else f"{prefix}{x:.{nd}f}"


def render_md(cfg: dict, t3: list[dict], t2: list[dict], mc: Optional[dict], shas: list[str]) -> str:
    ident, style = cfg["config"], cfg["config"]["data"]["style"]
    L = cfg["config"]["data"]["seq_len"]
    lines = [f"# BD3-LM perplexity ladder: run `{cfg['run']}` (preset `{ident['preset']}`)", "",
             f"git SHA of the results: {', '.join(shas)}; config hash "
             f"`{cfg['config_hash']}`; training seed {ident['train']['seed']}, eval seed {ident['eval']['seed']}.",
             f"Data: train `{ident['data']['train']}`, test `{ident['data']['test']}`, tokenizer "
             f"`{ident['data']['tokenizer']}`, L={L}.", "",
             "## Test perplexity (BD3-LM Table 3 layout)", "",
             f"| Model | L' | test PPL (ours) | NELBO (nats/token) | tokens | train steps | "
             f"paper PPL ({style.upper()}) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in t3:
        bound = "=" if r["exact"] else "≤"
        paper = _f(r["paper_ppl"], prefix="" if r["block_size"] == 1 else "≤")
        lines.append(f"| {_label(r['model'], r['block_size'])} | {r['block_size']} | {bound}{r['ppl']:.2f} | "
                     f"{r['nelbo']:.4f} | {r['tokens']} | {r['steps'] or '—'} | {paper} |")
    lines += ["", "AR: exact NLL (every token masked, t = 1). Others: NELBO of BD3-LM eq. 8 under the "
              "unclipped U[0,1] schedule with low-discrepancy t, an upper bound on the perplexity."]
    if mc:
        lines += ["", "### Cross-check: LLaDA Monte-Carlo ELBO of the MDLM model", "",
                  "| estimator | test chunks | tokens | PPL |", "|---|---:|---:|---:|",
                  f"| BD3-LM NELBO (L'=L, continuous t) | {mc['tokens'] // L} | {mc['tokens']} | "
                  f"≤{mc['ppl_same']:.2f} |",
                  f"| LLaDA MC ELBO (eq. 6, {mc['mc_num']} samples / chunk, l ~ U{{1..L}}) | {mc['tokens'] // L} | "
                  f"{mc['tokens']} | ≤{mc['ppl']:.2f} |",
                  "", "Both bound the same model's perplexity; they should agree up to Monte-Carlo noise."]
    if t2:
        lines += ["", "## Clipped noise schedules (BD3-LM Table 2 layout)", "",
                  "| L' | noise schedule | model scored (trained under) | test PPL | Var. NELBO | clipped estimate "
                  "(nats/token) | paper Var. NELBO |", "|---:|---|---|---:|---:|---:|---:|"]
        for r in t2:
            tu = "U[{:g},{:g}]".format(*r["trained_under"])
            lines.append(f"| {r['block_size']} | {r['schedule']} | {r['evaluated']} ({tu}) | ≤{r['ppl']:.2f} | "
                         f"{r['var_nelbo']:.2f} | {r['clipped_nelbo']:.4f} | {_f(r['paper_var'])} |")
        lines += ["", "Var. NELBO: variance of the per-(sequence, block) NELBO means under the row's schedule, "
                  "averaged over test batches, common random numbers across rows. Test PPL: unclipped NELBO of the "
                  "model scored (one model per L' unless `var_finetune_steps` > 0). Clipped estimate: the NELBO "
                  "estimator under the row's schedule (biased unless U[0,1])."]
    lines += ["", "## Bars", "", "| bar | measured | met |", "|---|---|---|"]
    lines += [f"| {b} | {m} | {'yes' if ok else 'NO'} |" for b, m, ok in bars(t3, t2, style)]
    lines += ["", "## Config", "", "```json", stable_json(ident, indent=2), "```", ""]
    return "\n".join(lines)


def render_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(round_floats({k: r.get(k) for k in CSV_FIELDS}))
    return buf.getvalue()


def plot(t3: list[dict], paper: dict, paper_len: int, path: Path, meta: dict) -> None:
    """Test PPL vs block size L' (log x; log y too when the values span > 5x): ours and the paper's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    if t3:
        ax.plot([r["block_size"] for r in t3], [r["ppl"] for r in t3], "o-", color="tab:blue", label="ours")
        for r in t3:
            ax.annotate(r["model"], (r["block_size"], r["ppl"]), textcoords="offset points", xytext=(4, 4),
                        fontsize=8)
    pts = sorted((paper_len if m == "mdlm" else (1 if m == "ar" else int(m[2:])), v) for m, v in paper.items())
    if pts:
        ax.plot(*zip(*pts), "s--", color="tab:gray", alpha=0.8, label=f"BD3-LM paper (L={paper_len})")
    ys = [r["ppl"] for r in t3] + [v for _, v in pts]
    if ys and max(ys) > 5 * min(ys):
        ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    xs = sorted({r["block_size"] for r in t3} | {x for x, _ in pts})
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.minorticks_off()
    ax.set_xlabel("block size L' (AR = 1, MDLM = L)")
    ax.set_ylabel("test perplexity (NELBO bound; exact for AR)")
    ax.set_title(f"BD3-LM ladder, run {meta['run']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.005, f"git {' '.join(meta['git_shas'])} · config {meta['config_hash']} · seeds "
             f"{meta['seed']}/{meta['eval_seed']}", fontsize=6, color="gray")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, metadata={"Description": stable_json(meta)})
    plt.close(fig)
    write_if_changed(path, buf.getvalue())


def write_report(out: Path, run: str) -> Path:
    """Write ``perplexity_<run>.md/.csv/.png`` from the JSONL; returns the markdown path."""
    out = Path(out)
    cfg, records = load_run(out, run)
    style = cfg["config"]["data"]["style"]
    paper, paper_var = PAPER_PPL.get(style, {}), PAPER_VAR.get(style, {})
    t3, t2 = table3(records, paper), table2(records, paper_var)
    mc = records.get("mc/mdlm")
    shas = sorted({r["git_sha"] for r in records.values()} or {cfg["git_sha"]})
    rows = t3 + ([{"table": "mc_elbo", "model": "mdlm", "block_size": mc["block_size"], "schedule": "LLaDA eq. 6",
                   "ppl": mc["ppl"], "nelbo": mc["nelbo"], "tokens": mc["tokens"], "exact": False, **_prov(mc)}]
                 if mc else []) + t2
    base = out / f"perplexity_{run}"
    write_if_changed(base.with_suffix(".md"), render_md(cfg, t3, t2, mc, shas))
    write_if_changed(base.with_suffix(".csv"), render_csv(rows))
    meta = {"run": run, "git_shas": shas, "config_hash": cfg["config_hash"], "seed": cfg["seed"],
            "eval_seed": cfg["eval_seed"], "config": cfg["config"]}
    plot(t3, paper, PAPER_L.get(style, cfg["config"]["data"]["seq_len"]), base.with_suffix(".png"), meta)
    return base.with_suffix(".md")
