"""Embedded BD3-LM models by block size on the GSM8K-format testbed task (BD3-LM, Arriola et al. 2025).

    python -m research.bd3_blocks --n 500                 # every model below, 0- and 4-shot
    python -m research.bd3_blocks --report-only

Each checkpoint (default ``results/checkpoints/bd3lm-arith-{4,8,16}``) decodes block by block
with the exact KV cache of :func:`bd3lm.sample`: ``steps_per_block = L'`` (one token per step,
low-confidence top-k, greedy), stopping a row at the first block that holds EOS, up to
``--gen-length`` tokens. The first ``--uncached`` problems are decoded a second time without the
cache (the whole prefix recomputed at every step): the outputs must be token-for-token equal
(the cache is exact), and the wall-time ratio is the measured speed-up of the cache.

Per-sample results go to ``<out>/L<L'>_k<shots>.jsonl`` (resumable, with config hash and weights
fingerprint); ``<out>/table.md`` and ``table.json`` are rebuilt from those files.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dlm.io import stable_json
from bd3lm import BD3LM
from dlm.checkpoints import weights_fingerprint
from tasks import fewshot_examples, generate_problems
from tasks.evaluate import wilson_ci
from harness.cli import check_out, run_main, set_threads
from harness.results import (REPO, JsonlLog, arith_config_of, atomic_write_text, config_hash, read_jsonl,
                                repo_relative, sample_shas)
from harness.evaluate import evaluate
from dlm.spec import Sampler

DEFAULT_MODELS = [str(REPO / "results" / "checkpoints" / f"bd3lm-arith-{b}") for b in (4, 8, 16)]


def sampler_kwargs(block_size: int, gen_length: int, use_cache: bool = True) -> dict:
    """The recorded config (its hash keys the resumable files; names of ``bd3lm.sample``)."""
    return dict(block_size=block_size, gen_length=gen_length, steps_per_block=block_size, align="prompt",
                use_cache=use_cache)


def strategy(block_size: int, gen_length: int, use_cache: bool = True) -> Sampler:
    """BD3-LM's sampler: exact cache (or the same attention uncached), one token per step,
    top-k on the SUBS probabilities, greedy, stop at the first block with EOS."""
    return Sampler.of(f"L{block_size}", policy="exact" if use_cache else "block_causal", gen_length=gen_length,
                      block_length=block_size, steps=gen_length, top_p=1.0, stop_at_eos=True)


def run(args) -> None:
    set_threads(args.threads)
    out = Path(args.out)
    for path in args.models:
        wrapper, tok = BD3LM.load(path, dtype=torch.float32)
        model, L = wrapper.model.eval(), wrapper.block_size
        weights = weights_fingerprint(path)
        arith = arith_config_of(path)
        problems = generate_problems(arith, args.n, split="test", seed=args.seed)
        for k in args.fewshot:
            shots = fewshot_examples(arith, k, seed=args.seed + 1) if k else ()
            for use_cache in (True, False):
                n = args.n if use_cache else min(args.uncached, args.n)
                kw = sampler_kwargs(L, args.gen_length, use_cache)
                h = config_hash({"model": repo_relative(path), **kw, "shots": k, "seed": args.seed})
                with JsonlLog(out / f"L{L}_k{k}{'' if use_cache else '_uncached'}.jsonl") as log:
                    evaluate(model, tok, problems[:n], strategy(L, args.gen_length, use_cache), log, shots=shots,
                             batch_size=args.batch_size, seed=args.seed, config_hash=h, weights=weights,
                             tags={"block_size": L, "shots": k, "use_cache": use_cache})
                    print(f"L'={L} k={k} cache={use_cache}: {len(log.records)}/{n}", flush=True)
    report(args)


def summarize(cached: list[dict], uncached: list[dict]) -> dict:
    """One table row: accuracy over ``cached``; cache speed-up and agreement over the problems
    both runs decoded (seconds are per-sample shares of their batch's wall time)."""
    n, c = len(cached), sum(r["correct"] for r in cached)
    both = {r["id"]: r for r in uncached}
    pairs = [(r, both[r["id"]]) for r in cached if r["id"] in both]
    row = {"n": n, "accuracy": c / max(n, 1), "ci95": list(wilson_ci(c, n)),
           "mean_tokens_until_eos": sum(r["tokens_until_eos"] for r in cached) / max(n, 1),
           "mean_prompt_length": sum(r["prompt_length"] for r in cached) / max(n, 1),
           "seconds_per_sample": sum(r["seconds"] for r in cached) / max(n, 1),
           "n_uncached": len(pairs), "identical_outputs": None, "cache_speedup": None}
    if pairs:
        row["identical_outputs"] = sum(a["prediction"] == b["prediction"] for a, b in pairs) / len(pairs)
        row["cache_speedup"] = sum(b["seconds"] for _, b in pairs) / max(sum(a["seconds"] for a, _ in pairs), 1e-12)
    return row


def report(args) -> None:
    out = Path(args.out)
    rows = []
    for f in sorted(out.glob("L*_k*.jsonl"), key=lambda p: p.name):
        if f.stem.endswith("_uncached"):
            continue
        cached = read_jsonl(f)[: args.n]
        if not cached:
            continue
        unc = out / f"{f.stem}_uncached.jsonl"
        uncached = read_jsonl(unc)
        first = cached[0]
        rows.append({"block_size": first["block_size"], "shots": first["shots"], **summarize(cached, uncached),
                     "model_weights": first.get("model_weights"), "config_hash": first["config_hash"]})
    rows.sort(key=lambda r: (r["shots"], r["block_size"]))
    meta = {"git_sha": sample_shas(out), "seed": args.seed, "gen_length": args.gen_length,
            "models": [repo_relative(m) for m in args.models]}
    atomic_write_text(out / "table.json", stable_json({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [f"# Embedded BD3-LM by block size, GSM8K-format testbed, up to {args.gen_length} tokens", "",
             f"git {meta['git_sha']}, seed {args.seed}; greedy, steps per block = L' (one token per step), "
             "exact KV cache, stop at the first block with EOS.", "",
             "| L' | shots | n | accuracy | 95% CI | tokens until EOS | prompt len | s/sample | "
             "uncached n | identical outputs | cache speed-up |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        same = "-" if r["identical_outputs"] is None else f"{100 * r['identical_outputs']:.0f}%"
        speed = "-" if r["cache_speedup"] is None else f"{r['cache_speedup']:.2f}x"
        lines.append(f"| {r['block_size']} | {r['shots']} | {r['n']} | {100 * r['accuracy']:.1f} | "
                     f"[{100 * r['ci95'][0]:.1f}, {100 * r['ci95'][1]:.1f}] | {r['mean_tokens_until_eos']:.1f} | "
                     f"{r['mean_prompt_length']:.0f} | {r['seconds_per_sample']:.3f} | {r['n_uncached']} | "
                     f"{same} | {speed} |")
    atomic_write_text(out / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=DEFAULT_MODELS, help="BD3-LM checkpoint directories")
    p.add_argument("--fewshot", type=int, nargs="+", default=[0, 4], help="numbers of worked examples")
    p.add_argument("--n", type=int, default=500, help="held-out problems")
    p.add_argument("--uncached", type=int, default=100, help="problems also decoded without the cache")
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: OMP_NUM_THREADS if set, else the free cores)")
    p.add_argument("--out", default="results/bd3lm_blocks")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)
    check_out("--out", args.out)
    for m in args.models:
        if not Path(m).is_dir():
            raise ValueError(f"--models: {m!r} is not a checkpoint directory")
    if args.n < 1 or args.uncached < 0 or args.batch_size < 1:
        raise ValueError("--n and --batch-size must be >= 1 and --uncached >= 0")
    report(args) if args.report_only else run(args)


if __name__ == "__main__":
    run_main(main)
