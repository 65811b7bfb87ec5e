"""Testbed bars for the embedded LLaDA-style model (issue: the embedded testbed).

    python -m research.testbed --n 500                   # all configs below, resumable
    python -m research.testbed --configs semiar32 pure --n 100 --fewshot 0

Configs (gen_length G, default 256; baseline sampler, low-confidence remasking, greedy):
  semiar32        blocks of 32, steps = G        (1 token / step)
  pure            block_length = G, steps = G    (pure diffusion, 1 token / step)
  semiar32_sD     blocks of 32, steps = G/D for D in 2, 4, 8, 16, 32 (D tokens / step; D = 32
                  decodes each block of 32 in one step)
  pure_sD         pure diffusion with G/D steps
  semiar16, semiar8  blocks of 16 / 8, steps = G (1 token / step; for answers shorter than 32
                  tokens, where one block of 32 holds the whole answer)

``--unique`` draws held-out problems that all differ in their arithmetic (canonical key); by
default problems may repeat a key with other names, objects and phrasing, and the table counts
the distinct ones. Per-sample results are appended to ``<out>/<config>_k<shots>.jsonl``
(resumable); the table ``<out>/testbed.md`` and ``testbed.json`` (accuracy, Wilson 95% CI,
distinct problems, mean step of the first EOS commit, tokens until EOS, share of answers exactly as
long as the reference, share of direct answers, share of the EOS tail committed before the
answer was complete where the samples record it, git SHA, config) are rebuilt from those files.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dlm.io import stable_json
from dlm.checkpoints import load_model, load_tokenizer, weights_fingerprint
from tasks import (extract_strict, fewshot_examples, generate_problems, parse_chain, problem_key,
                       reasoning_lines)
from tasks.evaluate import mcnemar_exact, wilson_ci
from tasks.sft_data import encode_answer
from harness.cli import check_out, run_main, set_threads
from harness.results import (JsonlLog, arith_config_of, atomic_write_text, config_hash, read_jsonl,
                                repo_relative, sample_shas)
from harness.evaluate import evaluate
from dlm.spec import Sampler

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "results" / "checkpoints" / "llada-arith"
CONFIGS = {
    "semiar32": dict(block=32, div=1), "pure": dict(block=None, div=1),
    "semiar32_s2": dict(block=32, div=2), "semiar32_s4": dict(block=32, div=4),
    "semiar32_s8": dict(block=32, div=8), "pure_s2": dict(block=None, div=2),
    "pure_s4": dict(block=None, div=4), "pure_s8": dict(block=None, div=8),
    "semiar32_s16": dict(block=32, div=16), "semiar32_s32": dict(block=32, div=32),
    "pure_s16": dict(block=None, div=16), "pure_s32": dict(block=None, div=32),
    "semiar16": dict(block=16, div=1), "semiar8": dict(block=8, div=1),
}
#: Semi-AR configs that the paired table sets against pure diffusion (1 token per step).
SEMIAR_VS_PURE = ("semiar32", "semiar16", "semiar8")
DIVS = (1, 2, 4, 8, 16, 32)


def sampler_kwargs(name: str, gen_length: int) -> dict:
    c = CONFIGS[name]
    return dict(gen_length=gen_length, block_length=c["block"] or gen_length, steps=gen_length // c["div"])


def strategy(name: str, gen_length: int) -> Sampler:
    """The config ``name`` as a sampler: LLaDA's baseline (no cache, top-k, greedy)."""
    return Sampler.of(name, **sampler_kwargs(name, gen_length))


def held_out_problems(args) -> list:
    """The first ``args.n`` held-out problems of the model's task; with ``args.unique`` no two share
    a canonical key (raises ``ValueError`` when the test split has fewer than n keys)."""
    return generate_problems(arith_config_of(args.model), args.n, split="test", seed=args.seed, unique=args.unique)


def run(args) -> None:
    set_threads(args.threads)
    model, tok = load_model(args.model, dtype=torch.float32)
    weights = weights_fingerprint(args.model)
    arith = arith_config_of(args.model)
    problems = held_out_problems(args)
    out = Path(args.out)
    for k in args.fewshot:
        shots = fewshot_examples(arith, k, seed=args.seed + 1) if k else ()
        for name in args.configs:
            kw = sampler_kwargs(name, args.gen_length)
            h = config_hash({"model": repo_relative(args.model), **kw, "shots": k, "seed": args.seed,
                             **({"unique": True} if args.unique else {})})
            with JsonlLog(out / f"{name}_k{k}.jsonl") as log:
                evaluate(model, tok, problems, strategy(name, args.gen_length), log, shots=shots,
                         batch_size=args.batch_size, seed=args.seed, config_hash=h, weights=weights,
                         tags={"shots": k}, progress=lambda t, name=name, k=k, log=log: print(
                             f"{name} k={k}: {len(log.records)}/{len(problems)} "
                             f"acc={sum(x['correct'] for x in log.records) / len(log.records):.3f}", flush=True))
    report(args)


def is_direct_answer(prediction: str) -> bool:
    """Whether a generated answer skips the chain of thought: it has its ``#### N`` line but no
    ``a op b = c`` line before it (the short answer an EOS tail committed first leaves room for)."""
    return extract_strict(prediction) is not None and "=" not in prediction.split("####")[0]


def chain_stats(recs: list[dict]) -> dict:
    """Does the chain of thought carry the computation?  Over the answers that go straight to
    ``#### N`` (direct, :func:`is_direct_answer`) and the others that write at least one
    ``a op b = c`` line (chains): how many and how many right; the chains' lines and how many have
    right arithmetic; and the chains with a ``####`` line and how many end on their last line's
    result.  A model that works the answer out in one pass and writes lines to match it has right
    answers under wrong lines."""
    direct, chains = [], []  # chains: (record, its reasoning lines, its '####' answer or None)
    for r in recs:
        if is_direct_answer(r["prediction"]):
            direct.append(r)
        elif lines := reasoning_lines(r["prediction"]):
            chains.append((r, lines, extract_strict(r["prediction"])))
    lines = [line for _, ls, _ in chains for line in ls]
    ended = [(final, ls[-1][3]) for _, ls, final in chains if final is not None]
    return {"chain_answers": len(chains), "chain_right": sum(bool(r["correct"]) for r, _, _ in chains),
            "direct_answers_n": len(direct), "direct_right": sum(bool(r["correct"]) for r in direct),
            "reasoning_lines": len(lines), "lines_arithmetic_right": sum(line[4] for line in lines),
            "chains_with_final_line": len(ended),
            "final_is_last_result": sum(final == str(last) for final, last in ended)}


def per_key_accuracy(recs: list[dict], key_of: dict) -> tuple[int, float]:
    """(distinct arithmetic problems, mean over them of each one's accuracy): problems that share
    a canonical key differ only in names, objects and phrasing, so they are not independent."""
    by_key: dict[str, list[bool]] = {}
    for r in recs:
        by_key.setdefault(key_of[r["id"]], []).append(bool(r["correct"]))
    return len(by_key), sum(sum(v) / len(v) for v in by_key.values()) / max(len(by_key), 1)


def report(args) -> None:
    out = Path(args.out)
    problems = held_out_problems(args)
    key_of = {p.id: problem_key(p) for p in problems}
    target_of = {p.id: p.target_str for p in problems}
    tok = load_tokenizer(args.model)
    # the reference answer's length as the sampler counts it: answer tokens + the first EOS
    ref_len = {p.id: len(encode_answer(tok, p.answer)) + 1 for p in problems}
    rows = []
    for k in args.fewshot:
        for name in CONFIGS:
            f = out / f"{name}_k{k}.jsonl"
            if not f.exists():
                continue
            recs = read_jsonl(f)[: args.n]
            if any(target_of.get(r["id"]) != r["target"] for r in recs):
                raise ValueError(f"{f} holds other held-out problems than --n/--seed/--unique and the "
                                 f"model's task give; report it with the arguments it was run with")
            n, c = len(recs), sum(r["correct"] for r in recs)
            eos_steps = [r["first_eos_step"] for r in recs if r["first_eos_step"] >= 0]
            lo, hi = wilson_ci(c, n)
            distinct, acc_distinct = per_key_accuracy(recs, key_of)
            chains = chain_stats(recs)
            rows.append({"config": name, "shots": k, "n": n, "accuracy": c / max(n, 1), "ci95": [lo, hi],
                         "mean_first_eos_step": sum(eos_steps) / max(len(eos_steps), 1),
                         "mean_tokens_until_eos": sum(r["tokens_until_eos"] for r in recs) / max(n, 1),
                         "mean_prompt_length": sum(r["prompt_length"] for r in recs) / max(n, 1),
                         "length_as_reference": sum(r["tokens_until_eos"] == ref_len[r["id"]] for r in recs)
                         / max(n, 1),
                         "no_final_line": sum(extract_strict(r["prediction"]) is None for r in recs) / max(n, 1),
                         "direct_answers": chains["direct_answers_n"] / max(n, 1),
                         "distinct_problems": distinct, "accuracy_per_distinct_problem": acc_distinct,
                         **tail_stats(recs),
                         **chains,
                         **sampler_kwargs(name, args.gen_length)})
    meta = {"git_sha": sample_shas(out), "model": repo_relative(args.model), "seed": args.seed,
            "gen_length": args.gen_length, "unique": args.unique}
    atomic_write_text(out / "testbed.json", stable_json({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [f"# Testbed: embedded LLaDA-style model, gen_length {args.gen_length}", "",
             f"git {meta['git_sha']}, seed {args.seed}, greedy, low-confidence remasking"
             + (", held-out problems with distinct arithmetic (`--unique`)." if args.unique else "."), "",
             "`distinct`: how many different arithmetic problems (canonical keys: numbers and operators) the n",
             "problems hold; `per distinct`: the mean over those of each one's accuracy. `length = ref`: the",
             "share of samples whose answer (tokens until the first EOS) is exactly as long as the reference",
             "answer; an EOS tail committed before the answer is worked out (pure diffusion commits it first)",
             "shows up as answers of the wrong length. `direct`: the share of answers that give `#### N` with no",
             "reasoning line before it.", "",
             "| config | shots | block | steps | tokens/step | n | accuracy | 95% CI | distinct | per distinct | "
             "mean step of 1st EOS commit | tokens until EOS | length = ref | no `####` line | direct | prompt len |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['shots']} | {r['block_length']} | {r['steps']} | "
                     f"{r['gen_length'] // r['steps']} | {r['n']} | {100 * r['accuracy']:.1f} | "
                     f"[{100 * r['ci95'][0]:.1f}, {100 * r['ci95'][1]:.1f}] | {r['distinct_problems']} | "
                     f"{100 * r['accuracy_per_distinct_problem']:.1f} | {r['mean_first_eos_step']:.1f} | "
                     f"{r['mean_tokens_until_eos']:.1f} | {100 * r['length_as_reference']:.1f}% | "
                     f"{100 * r['no_final_line']:.1f}% | {100 * r['direct_answers']:.1f}% | "
                     f"{r['mean_prompt_length']:.0f} |")
    lines += paired_table(out, args.n, args.fewshot, {p.id: len(parse_chain(p.answer)) for p in problems})
    lines += chain_table(rows)
    lines += tail_table(rows)
    lines += tokens_per_step_table(out, args.n, args.gen_length)
    atomic_write_text(out / "testbed.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def discordant(a: dict, b: dict, ids) -> tuple[int, int]:
    """(solved only in ``a``, solved only in ``b``) over ``ids``; ``a``/``b`` map id -> correct."""
    return sum(a[i] and not b[i] for i in ids), sum(b[i] and not a[i] for i in ids)


def paired_table(out: Path, n: int, shots: list[int], steps_of: dict | None = None) -> list[str]:
    """Semi-AR (each block of :data:`SEMIAR_VS_PURE` whose file exists) vs pure diffusion on the
    problems both files hold: accuracies, the discordant
    pairs and the exact McNemar p-value of the gap; with ``steps_of`` (id -> reasoning steps of
    the reference answer) also one row per number of steps, where answer length is decided."""
    lines = []
    for k in shots:
        for semi_name in SEMIAR_VS_PURE:
            files = [out / f"{m}_k{k}.jsonl" for m in (semi_name, "pure")]
            if not all(f.exists() for f in files):
                continue
            semi, pure = ({r["id"]: r["correct"] for r in read_jsonl(f)[:n]} for f in files)
            common = sorted(set(semi) & set(pure))
            groups = [("all", common)]
            if steps_of:
                groups += [(str(s), [i for i in common if steps_of.get(i) == s])
                           for s in sorted({steps_of[i] for i in common if i in steps_of})]
            if not lines:
                lines = ["", "Semi-AR vs pure diffusion on the same problems, 1 token/step:", "",
                         "| shots | semi-AR block | reasoning steps | problems | semi-AR | pure | gap (points) | "
                         "only semi-AR | only pure | McNemar p |",
                         "|---|---|---|---|---|---|---|---|---|---|"]
            for label, ids in groups:
                b, c = discordant(semi, pure, ids)
                acc_s, acc_p = (100 * sum(d[i] for i in ids) / max(len(ids), 1) for d in (semi, pure))
                lines.append(f"| {k} | {CONFIGS[semi_name]['block']} | {label} | {len(ids)} | {acc_s:.1f} | "
                             f"{acc_p:.1f} | {acc_s - acc_p:+.1f} | {b} | {c} | {mcnemar_exact(b, c):.2g} |")
    return lines


def chain_table(rows: list[dict]) -> list[str]:
    """Direct answers against chains of thought, per config (see :func:`chain_stats`)."""
    def share(k: int, n: int) -> str:
        return f"{k} ({100 * k / n:.0f}%)" if n else "0 (-)"

    lines = ["", "Direct answers vs chains of thought (right: share of that kind right; lines: reasoning",
             "lines `a op b = c` in the chains, and those with right arithmetic; `####` = last: chains",
             "whose final answer is their last line's result):", "",
             "| config | shots | n | direct answers | right | chains | right | lines | arithmetic right | "
             "`####` = last |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['shots']} | {r['n']} | {r['direct_answers_n']} | "
                     f"{share(r['direct_right'], r['direct_answers_n'])} | {r['chain_answers']} | "
                     f"{share(r['chain_right'], r['chain_answers'])} | {r['reasoning_lines']} | "
                     f"{share(r['lines_arithmetic_right'], r['reasoning_lines'])} | "
                     f"{share(r['final_is_last_result'], r['chains_with_final_line'])} |")
    return lines


def tail_stats(recs: list[dict]) -> dict:
    """Mean of the records' ``tail_before_answer`` (:func:`dlm.stats.tail_before_answer`) over
    those with an EOS tail, and the share of records whose whole tail came first; None when the
    records predate the field."""
    vals = [r["tail_before_answer"] for r in recs if r.get("tail_before_answer") is not None]
    if not vals:
        return {"tail_before_answer": None, "tail_all_before_answer": None, "tail_rows": 0}
    return {"tail_before_answer": sum(vals) / len(vals),
            "tail_all_before_answer": sum(v == 1.0 for v in vals) / len(vals), "tail_rows": len(vals)}


def tail_table(rows: list[dict]) -> list[str]:
    """Per config: how much of the EOS tail was committed before the answer was complete (only
    for sample files that record it)."""
    rows = [r for r in rows if r["tail_before_answer"] is not None]
    if not rows:
        return []
    lines = ["", "EOS tail committed first (`tail`: the first EOS and everything after it; mean share of",
             "it committed before the answer's last token, and the share of samples whose whole tail",
             "came first):", "",
             "| config | shots | samples with a tail | tail before answer done | whole tail first |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['shots']} | {r['tail_rows']} | {100 * r['tail_before_answer']:.1f}% | "
                     f"{100 * r['tail_all_before_answer']:.1f}% |")
    return lines


def tokens_per_step_table(out: Path, n: int, gen_length: int = 256) -> list[str]:
    """Zero-shot accuracy at 1, 2, 4, ... tokens/step on the *same* problems (the ids every file
    of that sampler has), so the rows differ only by the number of steps."""
    lines = []
    for base in ("semiar32", "pure"):
        names = [base] + [f"{base}_s{d}" for d in DIVS[1:]]
        recs = {m: {r["id"]: r for r in read_jsonl(out / f"{m}_k0.jsonl")[:n]}
                for m in names if (out / f"{m}_k0.jsonl").exists()}
        if len(recs) < 2:
            continue
        ids = set.intersection(*(set(r) for r in recs.values()))
        if not lines:
            lines = ["", f"Tokens per step on the same problems (zero-shot, gen {gen_length}):", "",
                     "| sampler | problems | " + " | ".join(f"{d} tok/step" for d in DIVS) + " |",
                     "|---|---|" + "---|" * len(DIVS)]
        cells = [f"{100 * sum(recs[m][i]['correct'] for i in ids) / max(len(ids), 1):.1f}" if m in recs else "-"
                 for m in names]
        lines.append(f"| {base} | {len(ids)} | " + " | ".join(cells) + " |")
        if base in recs:  # exact McNemar p of each row against 1 token/step on the same problems
            ok = {m: {i: r["correct"] for i, r in recs[m].items()} for m in recs}
            p_cells = [f"{mcnemar_exact(*discordant(ok[base], ok[m], ids)):.2g}" if m in recs and m != base else "-"
                       for m in names]
            lines.append(f"| {base}: McNemar p vs 1 tok/step | {len(ids)} | " + " | ".join(p_cells) + " |")
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--fewshot", type=int, nargs="+", default=[0, 4], help="numbers of worked examples")
    p.add_argument("--n", type=int, default=500, help="held-out problems")
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--unique", action="store_true",
                   help="held-out problems with distinct arithmetic (no two share numbers and operators)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: OMP_NUM_THREADS if set, else the free cores)")
    p.add_argument("--out", default="results/testbed")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)
    check_out("--out", args.out)
    report(args) if args.report_only else run(args)


if __name__ == "__main__":
    run_main(main)
