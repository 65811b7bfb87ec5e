"""The README's headline table and ``docs/results.md``, computed from the per-sample files in
``results/``: nothing in either is typed.

    python -m experiments.reproduce.headline                  # rewrite both (only what changed)
    python -m experiments.reproduce.headline --check          # exit 1 naming the file when either differs
    python -m experiments.reproduce.headline --results DIR    # a reproduction's DIR: DIR/headline.md, DIR/results.md

Every comparison is paired over the problems both rows solved (their common ids): the accuracy
change (row - reference, in points) with a 95% paired bootstrap interval and the exact McNemar p;
the speed-up (tokens up to the first EOS per second, the harness's throughput) with a 95% paired
bootstrap interval over problems, beside its FLOP ideal where the records carry FLOPs. Each timing
is one run under the load of its day (no repeats): the interval covers the problems, not the
machine's load. The verdict reads the McNemar p at 0.05 and flags a speed-up whose interval lies
above its FLOP ideal. The perplexity row pairs the ladder's seeds (Student t).
"""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from dlm.io import round_floats
from tasks.evaluate import mcnemar_exact
from experiments.reproduce.docblocks import between
from harness import noninferiority
from harness.methods import methods_table
from harness.cli import parser, run_main
from harness.records import read_records, strategy_files, timed_speedups
from harness.results import REPO, read_jsonl, write_if_changed
from experiments.perplexity.seeds import paired_ci

RESULTS = REPO / "results"
README = REPO / "README.md"
DOC = REPO / "docs" / "results.md"
START, END = "<!-- headline:start (python -m experiments.reproduce.headline) -->", "<!-- headline:end -->"
#: the README's methods table (:func:`harness.methods.methods_table`, from the registry)
METHODS = ("<!-- methods:start (python -m experiments.reproduce.headline) -->", "<!-- methods:end -->")
RESAMPLES, SEED = 2000, 0


@dataclass(frozen=True)
class Claim:
    """One headline row: ``row`` against ``reference``, two per-sample files of ``folder``."""
    claim: str
    folder: str
    reference: str
    row: str
    timed: bool = True  # False: an accuracy claim whose rows were not timed alike (no speed-up shown)
    heldout: Optional[str] = None  # the folder of the same rows on held-out problems: its numbers are the headline's


#: the headline, in reading order (a row's files: results/<folder>/<reference|row>.jsonl)
CLAIMS = (
    Claim("Fast-dLLM dual cache + threshold 0.9 vs LLaDA semi-AR, gen 256",
          "gsm8k_chain_256", "baseline_semiar", "fastdllm_dual_threshold", heldout="gsm8k_chain_256_heldout"),
    Claim("the same, gen 512", "gsm8k_chain_512", "baseline_semiar", "fastdllm_dual_threshold",
          heldout="gsm8k_chain_512_heldout"),
    Claim("the same, gen 1024, 4-shot", "gsm8k_chain_1024_4shot", "baseline_semiar",
          "fastdllm_dual_threshold"),
    Claim("Fast-dLLM dual + threshold (Dream rules) vs Dream semi-AR without a cache, gen 256", "gsm8k_dream_256",
          "baseline_semiar", "fastdllm_dual_threshold"),
    Claim("EB-Sampler (gamma 1) + dual cache vs LLaDA semi-AR, gen 256 (untimed: run apart, under load)",
          "gsm8k_chain_256", "baseline_semiar", "sw_dual_g1", timed=False),
    Claim("dLLM-Cache (K_p 20, K_r 4, rho 0.25) + threshold vs LLaDA semi-AR, gen 256 (untimed, as above)",
          "gsm8k_chain_256", "baseline_semiar", "cache_dllm_cache_threshold", timed=False),
    Claim("LLaDA semi-AR stopped at the first EOS block, gen 256", "gsm8k_chain_256",
          "baseline_semiar", "baseline_semiar_eos", heldout="gsm8k_chain_256_heldout"),
    Claim("BD3-LM (block-causal, exact cache) vs LLaDA semi-AR, gen 256", "gsm8k_chain_256",
          "baseline_semiar", "bd3lm", heldout="gsm8k_chain_256_heldout"),
    Claim("BD3-LM exact KV cache vs recomputing, L'=16", "bd3lm_blocks", "L16_k0_uncached",
          "L16_k0"),
    Claim("semi-AR blocks of 32 vs pure diffusion (the EOS gap)", "testbed_chain", "pure_k0",
          "semiar32_k0", timed=False),
    Claim("Sudoku 4x4: masked diffusion vs AR, same size and data", "anyorder", "sudoku_ar",
          "sudoku_pure"),
    Claim("Countdown-3: masked diffusion vs AR, same size and data", "anyorder", "countdown_ar",
          "countdown_pure"),
    Claim("Reversal, the reverse question on held-out poems: masked diffusion vs AR, both past the forward gate",
          "anyorder", "reversal2_before_ar", "reversal2_before_pure"),
)
#: the perplexity ladder's row: (file, reference model, model) of the per-seed CSV
LADDER = ("perplexity_char-long_seeds.csv", "mdlm", "bd4")


# ----------------------------------------------------------------------------------- statistics
def paired(reference: Sequence[dict], row: Sequence[dict], resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """Accuracy change and speed-up of ``row`` over ``reference`` on their common problem ids,
    each with a 95% paired bootstrap interval (the same resampled problems for both), the exact
    McNemar p and its discordant counts, and the FLOP ideal when both rows record FLOPs."""
    ref = {r["id"]: r for r in reference}
    ids = [r["id"] for r in row if r["id"] in ref]
    if not ids:
        raise ValueError("no common problem ids between the two rows")
    by_id = {r["id"]: r for r in row}
    a = np.array([bool(ref[i]["correct"]) for i in ids], dtype=float)  # (n,)
    b = np.array([bool(by_id[i]["correct"]) for i in ids], dtype=float)
    n = len(ids)
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))  # (R, n)
    d = 100 * (b[idx].mean(1) - a[idx].mean(1))
    out = {"n": n, "ref_accuracy": 100 * a.mean(), "accuracy": 100 * b.mean(), "d_acc": 100 * (b.mean() - a.mean()),
           "d_acc_ci": list(np.percentile(d, [2.5, 97.5])), "b": int((a > b).sum()), "c": int((b > a).sum())}
    out["p"] = mcnemar_exact(out["b"], out["c"])
    if all("seconds" in r and "tokens_until_eos" in r for r in (*(ref[i] for i in ids), *(by_id[i] for i in ids))):
        tok = [np.array([float(x[i]["tokens_until_eos"]) for i in ids]) for x in (ref, by_id)]
        sec = [np.array([float(x[i]["seconds"]) for i in ids]) for x in (ref, by_id)]
        out["speedup"] = (tok[1].sum() / sec[1].sum()) / (tok[0].sum() / sec[0].sum())
        boot = (tok[1][idx].sum(1) / sec[1][idx].sum(1)) / (tok[0][idx].sum(1) / sec[0][idx].sum(1))
        out["speedup_ci"] = list(np.percentile(boot, [2.5, 97.5]))
        if all(x[i].get("flops") for x in (ref, by_id) for i in ids):
            fpt = [sum(x[i]["flops"] for i in ids) / t.sum() for x, t in zip((ref, by_id), tok)]
            out["flop_ideal"] = fpt[0] / fpt[1]
    return round_floats(out)


def verdict(ev: dict) -> str:
    """Significance of the accuracy change at 0.05 (exact McNemar), and a speed-up flag."""
    words = "no significant change" if ev["p"] >= 0.05 else ("better" if ev["d_acc"] > 0 else "worse")
    words += f" (p = {_p(ev['p'])})"
    if "noninferiority" in ev:
        words += f"; {ev['noninferiority']} (declared margin)"
    low = ev["timed"][1] if "timed" in ev else ev.get("speedup_ci", [0.0])[0]
    if "flop_ideal" in ev and low > ev["flop_ideal"]:
        words += f"; speed-up above its FLOP ideal {ev['flop_ideal']:.2f}x"
    return words


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-3 else f"{p:.0e}"


def _speed(ev: dict) -> str:
    if "timed" in ev:
        s, lo, hi = ev["timed"]
        return f"**{s:.2f}x** [{lo:.2f}, {hi:.2f}] (timed, {ev['timed_repeats']} repeats)"
    if "speedup" not in ev:
        return "-"
    lo, hi = ev["speedup_ci"]
    return f"**{ev['speedup']:.2f}x** [{lo:.2f}, {hi:.2f}]"


def _dacc(ev: dict) -> str:
    lo, hi = ev["d_acc_ci"]
    return f"{ev['d_acc']:+.1f} [{lo:+.1f}, {hi:+.1f}] ({ev['accuracy']:.1f} vs {ev['ref_accuracy']:.1f})"


# ------------------------------------------------------------------------------------- the rows
def records(folder: str, name: str, results: Path) -> list[dict]:
    path = Path(results) / folder / f"{name}.jsonl"
    if not path.is_file():
        raise ValueError(f"{path}: missing (a headline row needs it; rerun its job: python -m experiments.reproduce)")
    # a harness folder's records are checked, not trusted (harness.records); the any-order rows have their own schema
    return read_records(path) if (path.parent / "config.json").is_file() else read_jsonl(path)


def model_of(folder: str, row: str, results: Path = RESULTS) -> str:
    """The checkpoint a row ran, as its files record it: the records' ``model``, the harness's
    ``config.json``, the testbed's meta, or the BD3-LM block table's model of the row's block size."""
    first, base = records(folder, row, results)[0], Path(results) / folder
    if "model" in first:
        return Path(first["model"]).name
    if (cfg := base / "config.json").is_file():
        return Path(json.loads(cfg.read_text())["strategies"][row]["config"]["model"]).name
    meta = json.loads(next(base.glob("*.json")).read_text())["meta"]
    if "model" in meta:
        return Path(meta["model"]).name
    return next(Path(m).name for m in meta["models"] if m.endswith(f"-{first['block_size']}"))


def table_of(folder: str, results: Path = RESULTS) -> str:
    """The table a row links: ``<folder>/table.md``, else the folder's one markdown file."""
    base = Path(results) / folder
    md = base / "table.md" if (base / "table.md").is_file() else next(iter(sorted(base.glob("*.md"))), base)
    return md.relative_to(results).as_posix()


def evidence(c: Claim, results: Path = RESULTS) -> dict:
    """The claim's paired comparison: on its held-out folder once both rows are there (``heldout``
    set in the result), else on the folder the rows were picked on; the speed-up from the
    folder's interleaved timing (``timed``: median, CI low, high) when it timed this row against
    this reference (harness.records.timed_speedups)."""
    held = c.heldout is not None and all((Path(results) / c.heldout / f"{n}.jsonl").is_file()
                                         for n in (c.reference, c.row))
    folder = c.heldout if held else c.folder
    ref, row = records(folder, c.reference, results), records(folder, c.row, results)
    ev = {**paired(ref, row), "folder": folder, "heldout": held}
    margin = noninferiority.margins(Path(results) / folder, [c.row], c.reference).get(c.row)
    if margin is not None:  # declared before the run: the verdict on the Newcombe interval (harness.noninferiority)
        ch = noninferiority.paired_change(ref, row)
        ev["noninferiority"] = f"{noninferiority.verdict(ch['change_low_pp'], ch['change_high_pp'], margin)} at -{margin:g}"
    timing = timed_speedups(Path(results) / c.folder)
    if timing and timing["baseline"] == c.reference and c.row in timing["rows"]:
        ev.update(timed=timing["rows"][c.row], timed_repeats=timing["repeats"])
    return ev


def claim_rows(results: Path = RESULTS) -> list[tuple[Claim, dict]]:
    return [(c, evidence(c, results)) for c in CLAIMS]


def ladder_row(results: Path = RESULTS) -> Optional[list[str]]:
    """The perplexity ladder's cells: L'=4 against MDLM, test PPL paired by seed (t interval)."""
    path = Path(results) / LADDER[0]
    if not path.is_file():
        return None
    with open(path, newline="") as f:
        per = {r["model"]: [float(v) for v in r["values"].split()] for r in csv.DictReader(f) if r["table"] == "ppl"}
    ref, row = per[LADDER[1]], per[LADDER[2]]
    ci = round_floats(paired_ci(row, ref))
    words = "lower" if ci["hi"] < 0 else "no significant change"
    return ["BD3-LM L'=4 vs MDLM perplexity (Table 3's ladder, tinyshakespeare chars)", "perplexity-char-long",
            "-", f"PPL {ci['mean']:+.2f} [{ci['lo']:+.2f}, {ci['hi']:+.2f}] ({np.mean(row):.2f} vs {np.mean(ref):.2f}"
            f", {ci['n']} seeds)", f"{words} (paired t)", f"[csv](results/{LADDER[0]})"]


HEADER = ["claim", "model", "speed-up [95% CI]", "accuracy change, points [95% CI]", "verdict", "files"]


def _table(lines: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)] + ["| " + " | ".join(x) + " |" for x in lines]


def headline(results: Path = RESULTS, link_prefix: str = "") -> str:
    """The README block: one line per claim, then the ladder's."""
    rows = claim_rows(results)
    lines = [[c.claim + (" (held-out problems)" if ev["heldout"] else ""), f"`{model_of(c.folder, c.row, results)}`",
              _speed(ev) if c.timed else "-", _dacc(ev), verdict(ev),
              f"[{ev['folder']}]({link_prefix}results/{table_of(ev['folder'], results)})"
              + (f" · [timing]({link_prefix}results/{c.folder}/timing.md)" if "timed" in ev else "")] for c, ev in rows]
    if (ladder := ladder_row(results)) is not None:
        ladder[-1] = ladder[-1].replace("(results/", f"({link_prefix}results/")
        lines.append(ladder)
    n = sorted({ev["n"] for _, ev in rows})
    note = (f"Paired over each row's common problems (n = {n[0]}-{n[-1]}); 95% paired bootstrap intervals "
            f"({RESAMPLES} resamples); exact McNemar p. A row marked held-out is scored on problems its picks were "
            "not chosen on (the `_heldout` folder). A speed-up marked timed is the median of interleaved repeats "
            "with its CI (the folder's timing.md); any other is one run per row (its interval covers problems, not "
            "load). Generated by `python -m experiments.reproduce.headline` from `results/`.")
    return "\n".join(_table(lines) + ["", note])


# ------------------------------------------------------------------------------ docs/results.md
def table_folders(results: Path) -> list[Path]:
    """The GSM8K-format harness tables: folders with a table.json holding per-strategy rows."""
    return sorted(p.parent for p in Path(results).glob("*/table.json")
                  if isinstance(json.loads(p.read_text()), dict) and "speedup_reference" in
                  json.loads(p.read_text()).get("meta", {}))


def results_doc(results: Path = RESULTS) -> str:
    out = ["# Results, every comparison", "", "Generated by `python -m experiments.reproduce.headline` from the "
           "per-sample files in `results/` (do not edit). Method: " + " ".join(__doc__.split("\n\n")[2].split()), "",
           "## Headline", "", headline(results, "../"), ""]
    for folder in table_folders(results):
        ref = json.loads((folder / "table.json").read_text())["meta"]["speedup_reference"]
        if ref is None:
            continue
        base = records(folder.name, ref, results)
        lines = []
        for path in strategy_files(folder):
            if path.stem == ref:
                continue
            ev = paired(base, read_jsonl(path))
            ideal = f"{ev['flop_ideal']:.2f}x" if "flop_ideal" in ev else "-"
            lines.append([f"`{path.stem}`", str(ev["n"]), _speed(ev), ideal, _dacc(ev), verdict(ev)])
        out += [f"## [{folder.name}](../results/{folder.name}/table.md): against `{ref}`", "",
                "| row | n | speed-up [95% CI] | FLOP ideal | accuracy change, points [95% CI] | verdict |",
                "|---|---|---|---|---|---|", *("| " + " | ".join(x) + " |" for x in lines), ""]
    return "\n".join(out)


# -------------------------------------------------------------------------------------- writing
def readme_with(text: str, block: str, start: str = START, end: str = END) -> str:
    """``text`` (the README) with ``block`` between its ``start`` and ``end`` marker lines."""
    return between(text, block, start, end, str(README))


def readme(text: str) -> str:
    """The README with its generated blocks: the headline and the registered methods."""
    return readme_with(readme_with(text, headline()), "\n".join(methods_table()), *METHODS)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = parser("experiments.reproduce.headline", __doc__, paragraphs=2)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when README.md or docs/results.md "
                   "differs from what results/ gives")
    p.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default results/); another "
                   "folder (a reproduction's --out) gets DIR/headline.md and DIR/results.md instead")
    a = p.parse_args(argv)
    if not a.results.is_dir():
        p.error(f"--results {a.results}: not a directory")
    if a.results.resolve() == RESULTS.resolve():
        want = {README: readme(README.read_text()), DOC: results_doc() + "\n"}
    else:
        want = {a.results / "headline.md": headline(a.results) + "\n", a.results / "results.md": results_doc(a.results) + "\n"}
    stale = [path for path, text in want.items() if not path.is_file() or path.read_text() != text]
    if a.check:
        for path in stale:
            print(f"{path}: differs from {a.results} (run python -m experiments.reproduce.headline)", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        write_if_changed(path, want[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_main(main)
