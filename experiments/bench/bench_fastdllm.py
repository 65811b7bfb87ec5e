"""Fast-dLLM speed benchmark (Wu et al. 2025, Tab. 1/2 style): baseline vs caches vs parallel.

One process runs, for each ``--gen-length``: the LLaDA baseline (``dlm.llada.generate``, one
token per step), ``+prefix``, ``+dual`` (top-k, one token per step), ``+threshold`` (no cache),
``+prefix+threshold`` and ``+dual+threshold``, and prints wall time, measured speed-up over the
baseline, the FLOP-count ideal speed-up (``dlm.stats.forward_flops`` summed over the forwards)
and their ratio, NFE and tokens per step, and the roofline (:mod:`harness.roofline`): each
call's floor ``sum over forwards of max(FLOPs / peak, bytes / bandwidth)`` with peak and
bandwidth measured here, ``floor / measured`` for the call and per forward kind (block-start
refresh, cached window), the call's matmuls timed alone at their shapes over the measured time
(the share the BLAS sets), and on CUDA each call's peak memory. ``--out DIR`` writes ``DIR/<name>.md``
and ``.json``. Presets: random weights at a size of :mod:`harness.shapes`, or at LLaDA-8B's /
Dream-7B's real shape (``llada8b`` / ``dream7b``, read from the data mirror's config.json).

    python -m experiments.bench.bench_fastdllm --preset tiny --threads 1
    python -m experiments.bench.bench_fastdllm --preset mid --prompt-len 200 --gen-length 256 --out results/speed
    python -m experiments.bench.bench_fastdllm --model ckpt/llada-8b --device cuda \\
        --dtype bfloat16 --gen-length 256 512
    bash experiments/bench/gpu_check.sh      # LLaDA-8B's shape, random bf16 weights, every backend (one GPU)

Common flags (``--model --device --dtype --threads --seed``) come from :mod:`harness.cli`;
CPU threads default to ``OMP_NUM_THREADS``, else 1.

A random model proposes tokens with near-uniform confidence, so ``--threshold`` rarely commits
more than one token per step on it; raise ``--init-std`` for peakier random distributions.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import fastdllm
from dlm.io import stable_json
from dlm.model import Transformer
from dlm.llada import generate as baseline_generate
from dlm.compiled import compiled
from harness.cli import (add_run_args, at_least, check_out, device_of, dtype_of, markdown_table, parser, reading,
                             run_main, set_threads)
from harness.results import atomic_write_text, git_sha
from harness.roofline import call_floor, kinds, machine
from harness.shapes import REAL, SHAPES, random_model, real_shape

PRESETS = {"tiny": dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=128),
           **SHAPES, **{name: None for name in REAL}}  # None: the real model's shape (harness.shapes)


def parse_args(argv=None) -> argparse.Namespace:
    """Flags, with ``--device`` resolved (cuda if available, else cpu)."""
    p = parser("experiments.bench.bench_fastdllm", __doc__, paragraphs=(0, 2))
    add_run_args(p, model=None, model_help="checkpoint dir (default: a random model)", dtype="float32")
    count = at_least(1)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny", metavar="SHAPE",
                   help=f"random model size: {', '.join(sorted(PRESETS))} (default tiny)")
    p.add_argument("--init-std", type=float, default=0.02, metavar="X", help="random model init std (default 0.02)")
    p.add_argument("--prompt-len", type=count, default=64, metavar="P", help="prompt tokens (default 64)")
    p.add_argument("--gen-length", type=count, nargs="+", default=[256, 512], metavar="G",
                   help="answer tokens, one run each (default 256 512)")
    p.add_argument("--block-length", type=count, default=32, metavar="L", help="block length (default 32)")
    p.add_argument("--batch-size", type=count, default=1, metavar="B", help="rows (default 1)")
    p.add_argument("--threshold", type=float, default=0.9, metavar="T", help="threshold rule's tau (default 0.9)")
    p.add_argument("--backend", default="sdpa", help="attention backend (default sdpa)")
    p.add_argument("--steps-per-token", type=count, default=1, metavar="K",
                   help="tokens per step of the top-k variants (default 1)")
    p.add_argument("--compile", action="store_true", help="also time each variant under torch.compile")
    p.add_argument("--out", default=None, metavar="DIR", help="write <out>/<name>.md and .json")
    p.add_argument("--name", default=None, help="report name (default: model or preset, gen lengths)")
    args = p.parse_args(argv)
    if args.out:
        check_out("--out", args.out)
    args.device = str(device_of(args.device))
    return args


def build_model(args) -> Transformer:
    if args.model is not None:
        from dlm.checkpoints import load_model  # noqa: PLC0415 - only needed for real checkpoints

        with reading("--model", args.model):
            model, _tokenizer = load_model(args.model)
    else:
        shape = PRESETS[args.preset] or real_shape(args.preset)
        return random_model(shape, args.prompt_len + max(args.gen_length), args.device,
                            dtype_of(args.dtype, torch.device(args.device)), args.init_std, args.seed)
    return model.to(device=args.device, dtype=dtype_of(args.dtype, torch.device(args.device))).eval()


def random_prompts(model, args) -> torch.Tensor:
    """(B, P) prompt ids avoiding the model's special tokens."""
    cfg = model.config
    special = {cfg.mask_token_id, cfg.eos_token_id, cfg.eot_token_id, cfg.pad_token_id, cfg.bos_token_id}
    allowed = torch.tensor([i for i in range(cfg.vocab_size) if i not in special])
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = allowed[torch.randint(len(allowed), (args.batch_size, args.prompt_len), generator=g)]
    return ids.to(args.device)


def variants(args):
    """(name, kwargs for fastdllm.generate or None for the baseline)."""
    th = {"threshold": args.threshold}
    return [("baseline", None), ("+prefix", {"cache": "prefix"}), ("+dual", {"cache": "dual"}),
            ("+threshold", th), ("+prefix+threshold", {"cache": "prefix", **th}),
            ("+dual+threshold", {"cache": "dual", **th})]


def run_one(model, ids, gen_length, args, kwargs):
    """One call of the variant (``kwargs`` None: the LLaDA baseline): its GenerateOutput."""
    steps = gen_length // args.steps_per_token
    common = dict(gen_length=gen_length, block_length=args.block_length, backend=args.backend, timed=True)
    if kwargs is None:
        out = baseline_generate(model, ids, steps=steps, **common)
    else:
        out = fastdllm.generate(model, ids, steps=steps, **common, **kwargs)
    return out


def time_compiled(model, ids, gen_length, args, kwargs, eager) -> dict:
    """The variant with the compiled forward: the first call (compiles any new graph, timed) and a
    second one (timed), its tokens compared with the eager call's ``eager`` output."""
    fast = compiled(model)
    t0 = time.perf_counter()
    run_one(fast, ids, gen_length, args, kwargs)
    first = time.perf_counter() - t0
    out = run_one(fast, ids, gen_length, args, kwargs)
    return {"compiled_seconds": out.stats.seconds, "compile_speedup": eager.stats.seconds / out.stats.seconds,
            "first_call_seconds": first, "tokens_equal": bool(torch.equal(out.sequences, eager.sequences))}


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.threads = set_threads(args.threads)
    torch.manual_seed(args.seed)
    model = build_model(args)
    ids = random_prompts(model, args)
    cfg = model.config
    hw = machine(torch.device(args.device), next(model.parameters()).dtype)
    print(f"model: {args.model or args.preset} (d={cfg.d_model}, L={cfg.n_layers}, V={cfg.vocab_size}) "
          f"batch={args.batch_size} prompt={args.prompt_len} block={args.block_length} "
          f"threshold={args.threshold} device={args.device} dtype={args.dtype}; peak "
          f"{hw['peak_flops'] / 1e9:.1f} GFLOP/s, bandwidth {hw['bandwidth'] / 1e9:.1f} GB/s")
    for _name, kw in variants(args):  # warm-up (allocator, kernels) on a short generation
        run_one(model, ids, min(args.block_length * 2, min(args.gen_length)), args, kw)
    header = f"{'gen':>5} {'variant':<18} {'seconds':>8} {'speedup':>8} {'ideal':>7} {'ratio':>6} " \
             f"{'NFE':>5} {'tok/step':>8} {'floor/meas':>10} {'mm/meas':>7} {'overhead':>8}"
    print(header)
    print("-" * len(header))
    rows, t0 = [], time.perf_counter()
    for gen_length in args.gen_length:
        base_seconds = base_flops = None
        for name, kw in variants(args):
            cuda = torch.device(args.device).type == "cuda"
            if cuda:
                torch.cuda.reset_peak_memory_stats(args.device)
            out = run_one(model, ids, gen_length, args, kw)
            peak = torch.cuda.max_memory_allocated(args.device) / 2**30 if cuda else None
            stats, flops = out.stats, out.stats.extra["flops"]
            if base_seconds is None:
                base_seconds, base_flops = stats.seconds, flops
            speedup, ideal = base_seconds / stats.seconds, base_flops / flops
            floor = call_floor(model, stats, args.batch_size, hw)
            per_kind = kinds(model, stats, args.batch_size, hw, matmuls=True)
            matmul_s = sum(k["forwards"] * k["matmul_each"] for k in per_kind)
            rows.append({"gen_length": gen_length, "variant": name, "seconds": stats.seconds, "speedup": speedup,
                         "flop_ideal": ideal, "ratio": speedup / ideal, "nfe": stats.nfe,
                         "tokens_per_step": stats.tokens_per_step, "floor_s": floor,
                         "floor_over_measured": floor / stats.seconds, "matmul_s": matmul_s,
                         "matmul_over_measured": matmul_s / stats.seconds,
                         "overhead_share": stats.overhead_seconds / stats.seconds, "peak_memory_gib": peak,
                         "kinds": per_kind})
            if args.compile:
                rows[-1].update(time_compiled(model, ids, gen_length, args, kw, out))
            print(f"{gen_length:>5} {name:<18} {stats.seconds:>8.3f} {speedup:>7.2f}x {ideal:>6.2f}x "
                  f"{speedup / ideal:>6.2f} {stats.nfe:>5} {stats.tokens_per_step:>8.2f} "
                  f"{floor / stats.seconds:>10.2f} {matmul_s / stats.seconds:>7.2f} "
                  f"{stats.overhead_seconds / stats.seconds:>7.1%}"
                  + (f" compiled {rows[-1]['compile_speedup']:.2f}x (first call {rows[-1]['first_call_seconds']:.1f}s, "
                     f"tokens equal: {rows[-1]['tokens_equal']})" if args.compile else ""))
    print(f"total {time.perf_counter() - t0:.1f}s")
    res = {"model": args.model or args.preset, "batch_size": args.batch_size, "prompt_len": args.prompt_len,
           "block_length": args.block_length, "threshold": args.threshold, "steps_per_token": args.steps_per_token,
           "device": args.device, "dtype": args.dtype, "threads": args.threads, "machine": hw, "rows": rows,
           "git_sha": git_sha()}
    if args.out:
        name = args.name or f"{Path(str(res['model'])).name}_p{args.prompt_len}_g{'-'.join(map(str, args.gen_length))}"
        report(res, Path(args.out), name)
    return res


def report(res: dict, out: Path, name: str) -> None:
    """``<out>/<name>.md``: one row per variant and one per forward kind; ``.json``: everything."""
    hw = res["machine"]
    table = [[r["gen_length"], r["variant"], f"{r['seconds']:.3f}", f"{r['speedup']:.2f}x", f"{r['flop_ideal']:.2f}x",
              f"{r['ratio']:.2f}", r["nfe"], f"{r['floor_over_measured']:.2f}", f"{r['matmul_over_measured']:.2f}",
              f"{r['overhead_share']:.0%}",
              "-" if r.get("peak_memory_gib") is None else f"{r['peak_memory_gib']:.1f}"] for r in res["rows"]]
    per_kind = [[r["gen_length"], r["variant"], f"{k['queries']} x {k['keys']}, head {k['head']}", k["forwards"],
                 f"{1e3 * k['seconds_each']:.2f}", f"{1e3 * k['floor_each']:.2f}", f"{k['floor_over_measured']:.2f}",
                 f"{1e3 * k['matmul_each']:.2f}", f"{k['matmul_over_measured']:.2f}"]
                for r in res["rows"] for k in r["kinds"]]
    md = [f"# Fast-dLLM speed against the roofline: {name}", "",
          f"{res['model']}, batch {res['batch_size']}, prompt {res['prompt_len']}, block {res['block_length']}, "
          f"{res['steps_per_token']} token(s) per top-k step, threshold {res['threshold']}; {res['device']} "
          f"{res['dtype']}, {res['threads']} thread(s); measured matmul peak {hw['peak_flops'] / 1e9:.1f} GFLOP/s, "
          f"copy bandwidth {hw['bandwidth'] / 1e9:.1f} GB/s; git {res['git_sha']}. One run: every row timed in "
          "this process. `ideal`: the FLOP-count speed-up; `floor / measured`: the roofline floor (sum over "
          "forwards of max(FLOPs / peak, bytes / bandwidth)) over the measured time (1 = at the roofline); "
          "`matmuls / measured`: the call's matmuls timed alone at their shapes (harness.roofline."
          "matmul_seconds) over the measured time, the share the BLAS sets; `overhead`: time outside model "
          "forwards.", "",
          *markdown_table(["gen", "variant", "seconds", "speed-up", "ideal", "ratio", "NFE", "floor / measured",
                           "matmuls / measured", "overhead", "peak GiB (CUDA)"], table), "",
          *(["Compiled forward (`torch.compile`, dynamic shapes) against eager, same tokens:", "",
             *markdown_table(["gen", "variant", "eager s", "compiled s", "compiled speed-up", "first call s",
                              "tokens equal"],
                             [[r["gen_length"], r["variant"], f"{r['seconds']:.3f}", f"{r['compiled_seconds']:.3f}",
                               f"{r['compile_speedup']:.2f}x", f"{r['first_call_seconds']:.1f}", r["tokens_equal"]]
                              for r in res["rows"]]), ""] if "compiled_seconds" in res["rows"][0] else []),
          "Per forward kind (query columns x key columns, LM-head columns):", "",
          *markdown_table(["gen", "variant", "forward", "n", "ms each", "floor ms", "floor / measured",
                           "matmuls ms", "matmuls / measured"], per_kind)]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{name}.md", "\n".join(md) + "\n")
    atomic_write_text(out / f"{name}.json", stable_json(res, indent=1))


if __name__ == "__main__":
    run_main(main)
