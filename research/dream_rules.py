"""Which rules keep a Dream-style model's cached decoding closer to uncached recomputation:
Fast-dLLM's Dream rules or its LLaDA rules (:mod:`fastdllm.dream`)?

    python -m research.dream_rules --model results/checkpoints/dream-arith --n 128 --n-topk 48

For each rule set (``dream``, ``llada``) and mode (threshold 0.9; the scheduled top-k / entropy
mode, one token per step) the GSM8K-format test problems are decoded at gen 256, block 32,
without a cache and with the prefix and the dual cache. A cached run is *closer to uncached
recomputation* when more of its answers are identical to the uncached run of the same rules
(same text up to the first EOS). Per-sample results go to ``<out>/<rules>_<mode>_<cache>.jsonl``
(resumable); ``<out>/table.md`` / ``table.json`` are rebuilt from them with accuracy (Wilson
95% CI), agreement with uncached (Wilson 95% CI) and tokens/s.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dlm.io import stable_json
from dlm.checkpoints import load_model, weights_fingerprint
from tasks import generate_problems
from tasks.evaluate import wilson_ci
from harness.cli import check_out, markdown_table, run_main, set_threads
from harness.results import (JsonlLog, arith_config_of, atomic_write_text, config_hash, read_jsonl, repo_relative,
                                sample_shas)
from harness.evaluate import evaluate
from dlm.spec import Sampler

RULE_SETS = ("dream", "llada")
MODES = {"threshold": dict(rule="threshold", threshold=0.9), "topk": dict(rule="topk")}
CACHES = ("none", "prefix", "dual")


def strategies(gen_length: int = 256, block_length: int = 32) -> list[Sampler]:
    return [Sampler.of(f"{rules}_{mode}_{cache}", policy=cache, gen_length=gen_length, block_length=block_length,
                       family=rules, **kw)
            for rules in RULE_SETS for mode, kw in MODES.items() for cache in CACHES]


def run(args) -> None:
    set_threads(args.threads)
    out = Path(args.out)
    model, tok = load_model(args.model, dtype=torch.float32)
    model.eval()
    weights = weights_fingerprint(args.model)
    for s in strategies(args.gen_length, args.block_length):
        n = args.n_topk if s.rule == "topk" else args.n
        problems = generate_problems(arith_config_of(args.model), n, split="test", seed=args.seed)
        config = {"strategy": s.as_dict(), "sampler": s.resolved(s.family), "model": repo_relative(args.model), "n": n,
                  "seed": args.seed}
        log = JsonlLog(out / f"{s.name}.jsonl")
        evaluate(model, tok, problems, s, log, batch_size=args.batch_size, seed=args.seed,
                 config_hash=config_hash(config), weights=weights, tags={"rules": s.family})
        print(s.name, "done", flush=True)
    report(out)


def report(out: Path) -> None:
    rows, table = [], []
    for s in strategies():
        path = out / f"{s.name}.jsonl"
        if not path.exists():
            continue
        recs = {r["id"]: r for r in read_jsonl(path)}
        ref_path = out / f"{s.name.rsplit('_', 1)[0]}_none.jsonl"
        ref = {r["id"]: r for r in read_jsonl(ref_path)} if ref_path.exists() else {}
        both = [i for i in recs if i in ref]
        same = sum(recs[i]["prediction"] == ref[i]["prediction"] for i in both)
        k = sum(r["correct"] for r in recs.values())
        toks = sum(r["tokens_until_eos"] for r in recs.values())
        secs = sum(r["seconds"] for r in recs.values())
        row = {"strategy": s.name, "rules": s.family, "mode": s.rule, "cache": s.policy, "n": len(recs),
               "accuracy": k / len(recs), "accuracy_ci": wilson_ci(k, len(recs)),
               "same_as_uncached": same / max(len(both), 1), "same_ci": wilson_ci(same, len(both)),
               "tokens_per_s": toks / secs if secs else None}
        rows.append(row)
        table.append([s.name, row["n"], f"{100 * row['accuracy']:.1f} [{100 * row['accuracy_ci'][0]:.1f}, "
                      f"{100 * row['accuracy_ci'][1]:.1f}]",
                      "-" if s.policy == "none" else f"{100 * row['same_as_uncached']:.1f} "
                      f"[{100 * row['same_ci'][0]:.1f}, {100 * row['same_ci'][1]:.1f}]",
                      f"{row['tokens_per_s']:.1f}"])
    md = ("# Dream-style model: Fast-dLLM's Dream rules vs its LLaDA rules, cached vs uncached\n\n"
          "gen 256, block 32, greedy; 'same as uncached' = share of answers identical to the uncached run "
          f"of the same rules (Wilson 95% CI). Samples: {sample_shas(out)}.\n\n"
          + "\n".join(markdown_table(["strategy", "n", "accuracy % [95% CI]", "same as uncached % [95% CI]",
                                      "tokens/s"], table)) + "\n")
    atomic_write_text(out / "table.md", md)
    atomic_write_text(out / "table.json", stable_json(rows, indent=1))
    print(md)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="results/checkpoints/dream-arith")
    p.add_argument("--out", default="results/dream_rules")
    p.add_argument("--n", type=int, default=128, help="problems of the threshold rows")
    p.add_argument("--n-topk", type=int, default=48, help="problems of the scheduled (one token per step) rows")
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)
    check_out("--out", args.out)
    if args.report_only:
        report(Path(args.out))
    else:
        run(args)


if __name__ == "__main__":
    run_main(main)
