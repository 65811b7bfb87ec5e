"""Throughput under load: tokens/s and latency per sequence as the batch grows, for AR decoding
with a KV cache (the lean decoder :func:`dlm.ar_decode.ar_decode`), the LLaDA baseline, Fast-dLLM
dual + threshold and BD3-LM's exact cache, next to a roofline prediction measured on the same
machine.

    python -m experiments.bench.bench_load --shape embedded --batches 1 8 32 64 --out results/bench_load
    python -m experiments.bench.bench_load --shape mid --batches 1 8 --gen-length 64
    python -m experiments.bench.bench_load --shape llada8b --device cuda --batches 1 8 32 64   # a GPU

"Single-stream AR decoding is bound by memory bandwidth ... a diffusion step puts that idle
compute to work. The bill arrives under load". At every batch size the strategies' calls are
timed in ``--repeats`` interleaved rounds (:mod:`experiments.bench.ratios`, the order rotated
each round). Every strategy stops at EOS where the model has one (AR too), and a call's useful
tokens are each row's tokens up to and including its first EOS: tokens/s = useful tokens /
seconds, so no method is credited for EOS padding (a random model has no EOS: every column
counts). The roofline floor of a call is ``max(FLOPs / peak, bytes / bandwidth)`` summed over its
forwards, with FLOPs counted by the loop and the matmul peak and copy bandwidth measured here
(:mod:`harness.roofline`).

The test, fixed before the run: at each batch size a strategy's throughput ratio to AR + KV
cache is the median over rounds of (its useful tokens / its seconds) / (AR's / AR's), with a 95%
bootstrap interval. It is *faster* than AR where the interval lies above 1, *slower* where it
lies below 1, *tied* otherwise; the measured crossover is the smallest batch from which every
measured batch is slower, and diffusion "wins at batch 1" where batch 1 is faster. The roofline's
crossover (the first batch whose floor-based throughput falls below AR's) stands beside it.

Shapes: ``embedded`` runs the trained checkpoints (``dream-ar`` decoded autoregressively,
``llada-arith`` for the baseline and dual + threshold 0.9, ``bd3lm-arith-16``), one 0.9M-parameter
shape, on arithmetic questions; ``mid`` (d 512, 8 layers, vocab 32000) and ``llada8b`` (LLaDA-8B's
config from ``../shared/data``) use random weights and fixed steps, with dual + top-k at 4 tokens
per step standing in for the threshold rule (a random model is never confident).
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median

import torch

from dlm.io import stable_json
from harness.cli import add_run_args, check_out, device_of, dtype_of, markdown_table, parser, run_main, set_threads
from harness.results import REPO, atomic_write_text, git_sha
from experiments.bench.ratios import clock_name, fmt, interleaved, load_average, ratio
from harness.roofline import call_floor, machine
from harness.shapes import REAL, SHAPES as RANDOM, random_model, real_shape
from dlm.ar_decode import ar_decode
from dlm.spec import Sampler, generate

STRATEGIES = ("ar", "baseline", "dual_threshold", "bd3lm")
BATCHES = (1, 2, 3, 4, 6, 8, 16, 32, 64)
SHAPES = {"mid": RANDOM["mid"], "tiny": dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=64)}


def strategy(name: str, gen: int, block: int, random_weights: bool, stop: bool) -> Sampler:
    """The strategy's sampler; ``stop``: stop at EOS (every strategy alike)."""
    if name == "ar":
        return Sampler.of("ar", policy="ar", gen_length=gen, block_length=1, stop_at_eos=stop)
    if name == "baseline":
        return Sampler.of("baseline", gen_length=gen, block_length=block, stop_at_eos=stop)
    if name == "dual_threshold":
        if random_weights:  # a random model is never confident: 4 tokens per step instead
            return Sampler.of("dual_threshold", policy="dual", gen_length=gen, block_length=block, steps=gen // 4,
                              stop_at_eos=stop)
        return Sampler.of("dual_threshold", policy="dual", rule="threshold", gen_length=gen, block_length=block,
                          threshold=0.9, stop_at_eos=stop)
    return Sampler.of("bd3lm", policy="exact", gen_length=gen, block_length=16, top_p=1.0, stop_at_eos=stop)


def decode(model, ids, mask, sampler: Sampler):
    """One call of a strategy: AR through the lean decoder (the ar policy's tokens without the
    diffusion loop), the others through :func:`dlm.spec.generate`."""
    if sampler.policy == "ar":
        return ar_decode(model, ids, mask, sampler.gen_length, stop_at_eos=sampler.stop_at_eos)
    return generate(model, ids, mask, sampler)


def models_for(shape: str, device, dtype) -> tuple[dict, object, list]:
    """strategy -> model, the tokenizer (or None) and the prompt pool (lists of ids)."""
    from dlm.checkpoints import load_model

    if shape == "embedded":
        ck = REPO / "results" / "checkpoints"
        paths = {"ar": ck / "dream-ar", "baseline": ck / "llada-arith", "dual_threshold": ck / "llada-arith",
                 "bd3lm": ck / "bd3lm-arith-16"}
        loaded = {p: load_model(p, dtype=dtype, device=device) for p in set(paths.values())}
        tok = loaded[paths["baseline"]][1]
        from tasks import generate_problems
        from harness.results import encode_question

        pool = [encode_question(tok, p.question, [], True) for p in generate_problems(n=64, split="test", seed=0)]
        return {s: loaded[p][0].eval() for s, p in paths.items()}, tok, pool
    base = dict(SHAPES[shape]) if shape in SHAPES else real_shape(shape)
    model = random_model(base, 2048, device, dtype, eos=False)
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    P = 200 if shape != "tiny" else 12
    pool = [torch.randint(0, cfg.vocab_size - 1, (P,), generator=g).tolist() for _ in range(8)]
    return {s: model for s in STRATEGIES}, None, pool


def bench(shape: str, batches, gen: int, block: int, device, dtype, strategies=STRATEGIES,
          skip_after: float = float("inf"), repeats: int = 3) -> dict:
    """Every strategy at every batch size, interleaved over ``repeats`` rounds; once a strategy's
    call takes over ``skip_after`` seconds its larger batches are skipped (listed in ``skipped``:
    the uncached baseline at the mid shape would take hours on one core)."""
    from tasks.evaluate import left_pad

    models, tok, pool = models_for(shape, device, dtype)
    hw = machine(device, dtype)
    rows, skipped, slow = [], [], set()
    for B in batches:
        ids, mask = left_pad([pool[i % len(pool)] for i in range(B)], tok.pad_token_id if tok is not None else 0)
        ids, mask = ids.to(device), mask.to(device)
        calls, outs = {}, {}
        for name in strategies:
            if name in slow:
                skipped.append({"strategy": name, "batch": B})
                continue
            model = models[name]
            s = strategy(name, gen, block, tok is None, model.config.eos_token_id is not None)
            calls[name] = lambda model=model, s=s: decode(model, ids, mask, s)
            outs[name] = calls[name]()  # the tokens; also the warm-up
        if not calls:
            continue
        load = load_average()
        times = interleaved(calls, repeats, device, warmup=False)  # the token calls above warmed them up
        useful = {name: int(out.stats.tokens_until_eos.sum()) for name, out in outs.items()}
        for name, out in outs.items():
            sec = median(times[name])
            floor = call_floor(models[name], out.stats, B, hw)
            row = {"strategy": name, "batch": B, "seconds": sec, "times": times[name], "useful_tokens": useful[name],
                   "tokens_per_s": useful[name] / sec, "latency_s": sec, "nfe": out.stats.nfe,
                   "flops": out.stats.extra["flops"], "floor_s": floor, "roofline_tokens_per_s": useful[name] / floor,
                   "floor_over_measured": floor / sec, "prompt_len": ids.shape[1], "load_before": load,
                   "load_after": load_average()}
            if name != "ar" and "ar" in times:
                r = ratio(times, "ar", name)  # AR seconds / its seconds, per round
                k = useful[name] / useful["ar"]
                row["vs_ar"] = {"median": r["median"] * k, "ci": [c * k for c in r["ci"]], "rounds": r["rounds"]}
                row["verdict"] = verdict(row["vs_ar"]["ci"])
            rows.append(row)
            if sec > skip_after:
                slow.add(name)
            print(json.dumps({k: v for k, v in row.items() if k != "times"}), flush=True)
    return {"shape": shape, "gen_length": gen, "block_length": block, "device": str(device), "dtype": str(dtype),
            "machine": hw, "repeats": repeats, "clock": clock_name(device), "threads": torch.get_num_threads(),
            "rows": rows, "skipped": skipped, "skip_after_s": skip_after, "crossover": crossovers(rows),
            "git_sha": git_sha()}


def verdict(ci) -> str:
    """faster / slower than AR when the interval excludes 1, else tied."""
    return "faster" if ci[0] > 1 else "slower" if ci[1] < 1 else "tied"


def crossovers(rows: list[dict]) -> dict:
    """strategy -> the measured crossover (the smallest batch from which every measured batch is
    ``slower`` than AR by the test), the roofline's (the first batch whose floor-based tokens/s
    falls below AR's) and whether batch 1 is ``faster``."""
    ar = {r["batch"]: r for r in rows if r["strategy"] == "ar"}
    out = {}
    for name in sorted({r["strategy"] for r in rows} - {"ar"}):
        mine = sorted((r for r in rows if r["strategy"] == name and r["batch"] in ar), key=lambda r: r["batch"])
        measured = None
        for r in reversed(mine):
            if r["verdict"] != "slower":
                break
            measured = r["batch"]
        out[name] = {"measured": measured,
                     "roofline": next((r["batch"] for r in mine
                                       if r["roofline_tokens_per_s"] < ar[r["batch"]]["roofline_tokens_per_s"]), None),
                     "wins_at_1": bool(mine) and mine[0]["batch"] == 1 and mine[0]["verdict"] == "faster"}
    return out


def report(res: dict, out: Path) -> None:
    name = f"{res['shape']}_g{res['gen_length']}"
    hw = res["machine"]
    table = [[r["strategy"], r["batch"], r["useful_tokens"], f"{r['tokens_per_s']:.1f}", f"{r['latency_s']:.2f}",
              fmt(r["vs_ar"]) if "vs_ar" in r else "-", r.get("verdict", "-"), f"{r['roofline_tokens_per_s']:.1f}",
              f"{r['floor_over_measured']:.2f}", r["nfe"]] for r in res["rows"]]
    cross = [[k, v["measured"] or "none measured", v["roofline"] or "none predicted", "yes" if v["wins_at_1"] else "no"]
             for k, v in res["crossover"].items()]
    md = [f"# Throughput under load: {res['shape']} shape, gen {res['gen_length']}", "",
          f"{res['device']} {res['dtype']}; measured matmul peak {hw['peak_flops'] / 1e9:.1f} GFLOP/s, copy bandwidth "
          f"{hw['bandwidth'] / 1e9:.1f} GB/s; {res['threads']} thread(s), {res['repeats']} interleaved rounds "
          f"({res['clock']}); git {res['git_sha']}. Useful tokens: each row's tokens up to and including its first "
          "EOS (every strategy stops at EOS); tokens/s = useful tokens / median seconds. vs AR: the median over rounds "
          "of the throughput ratio to AR + KV cache [95% bootstrap interval]; faster / slower: the interval above / "
          "below 1 (the test fixed before the run, in the module docstring). Roofline floor = sum over the call's "
          "forwards of max(FLOPs / peak, bytes / bandwidth); floor / measured = floor seconds / measured seconds."
          + ("".join(f" Not run (a smaller batch took over {res['skip_after_s']:g} s): {k['strategy']} at batch {k['batch']}."
                     for k in res.get("skipped", ()))), "",
          *markdown_table(["strategy", "batch", "useful tokens", "tokens/s", "latency s", "vs AR", "test",
                           "roofline tokens/s", "floor / measured", "NFE"], table), "",
          "Crossover: the smallest batch from which the strategy is slower than AR + KV cache at every measured batch "
          "(by the test), and the first batch whose roofline throughput falls below AR's:", "",
          *markdown_table(["strategy", "measured", "roofline", "faster than AR at batch 1"], cross)]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{name}.md", "\n".join(md) + "\n")
    atomic_write_text(out / f"{name}.json", stable_json(res, indent=1))
    plot(res, out / f"{name}.png")


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for c, name in enumerate(dict.fromkeys(r["strategy"] for r in res["rows"])):
        rs = [r for r in res["rows"] if r["strategy"] == name]
        ax.plot([r["batch"] for r in rs], [r["tokens_per_s"] for r in rs], "-o", color=f"C{c}", label=name)
        ax.plot([r["batch"] for r in rs], [r["roofline_tokens_per_s"] for r in rs], ":", color=f"C{c}", lw=1)
    ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="tokens/s (dotted: roofline)",
           title=f"throughput under load, {res['shape']} shape")
    ax.legend(fontsize=8), ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    p = parser("experiments.bench.bench_load", __doc__, paragraphs=2)
    add_run_args(p, model=None, model_help="unused (the shape picks the models)", dtype="float32", seed=False)
    p.add_argument("--shape", default="embedded", choices=["embedded", *SHAPES, *REAL], metavar="SHAPE",
                   help=f"embedded checkpoints or random {'|'.join([*SHAPES, *REAL])} (default embedded)")
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES), metavar="B",
                   help=f"batch sizes (default {' '.join(map(str, BATCHES))})")
    p.add_argument("--repeats", type=int, default=3, metavar="R", help="interleaved timing rounds (default 3)")
    p.add_argument("--gen-length", type=int, default=256, metavar="G",
                   help="answer tokens (multiple of 16 and L; default 256)")
    p.add_argument("--skip-after", type=float, default=float("inf"), metavar="SEC",
                   help="skip a strategy's larger batches after a slower call")
    p.add_argument("--block-length", type=int, default=32, metavar="L", help="block length (default 32)")
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES), metavar="NAME",
                   help=f"of {' '.join(STRATEGIES)} (default all; ar needed)")
    p.add_argument("--out", default=str(REPO / "results" / "bench_load"), metavar="DIR",
                   help="results dir (default results/bench_load)")
    a = p.parse_args(argv)
    check_out("--out", a.out)
    if not a.skip_after > 0:
        raise ValueError(f"--skip-after must be > 0 seconds, got {a.skip_after}")
    if a.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {a.repeats}")
    if any(b < 1 for b in a.batches):
        raise ValueError(f"--batches must be >= 1, got {a.batches}")
    if "ar" not in a.strategies:
        raise ValueError("--strategies must include ar (the crossover is measured against it)")
    if a.gen_length % 16 or a.gen_length % a.block_length:
        raise ValueError(f"--gen-length must be a multiple of 16 and of --block-length, got {a.gen_length}")
    set_threads(a.threads)
    device = device_of(a.device)
    res = bench(a.shape, sorted(set(a.batches)), a.gen_length, a.block_length, device, dtype_of(a.dtype, device),
                a.strategies, a.skip_after, a.repeats)
    report(res, Path(a.out))
    return res


if __name__ == "__main__":
    run_main(main)
