"""BD3-LM costs measured in one run (Arriola et al., ICLR 2025): every comparison timed in
interleaved rounds (:mod:`experiments.bench.ratios`; one thread's CPU time on the CPU), each ratio
the median of its per-round ratios with a 95% bootstrap interval.

(a) training step (forward + backward) of the vectorized ``x_t ⊕ x_0`` NELBO (block size L')
    vs MDLM (the same code with L' = L: one block, no clean half) on the same model and batch,
    with SDPA over the dense mask and with the ``blocksparse`` backend (SDPA on the mask's nonzero
    blocks only); FlexAttention too where it has a backward (CUDA). On CPU FlexAttention runs
    eagerly and has no backward, so its row is forward-only (and says so).
(b) sampling: exact KV cache vs the uncached block-causal reference (rerun the whole prefix
    at every step, the same tokens: checked) at total lengths 512 and 1024, next to two ideals:
    the FLOP ratio, and the ratio of the two calls' matmuls timed alone at their shapes
    (:func:`harness.roofline.matmuls_of_call`: what the speed-up would be if everything but the
    matmuls cost nothing; a 16-column window's GEMMs run slower per FLOP than a 500-column one's,
    which the FLOP ratio ignores). Also each call's roofline floor (peak and bandwidth measured here).

    python -m experiments.bench.bench_bd3lm --threads 1 --out results/speed   # ~5 min CPU
    python -m experiments.bench.bench_bd3lm --model runs/bd3/model --device cuda

Common flags (``--model --device --dtype --threads``) come from :mod:`harness.cli`; CPU
threads default to ``OMP_NUM_THREADS``, else 1 (OpenMP spin on shared CPUs).
"""

from __future__ import annotations

import warnings
from statistics import median
from pathlib import Path

import torch

from bd3lm import BD3Objective, sample
from bd3lm.loss import bd3_nelbo
from bd3lm.masks import dense_bd3_mask, num_columns
from dlm.io import stable_json
from experiments.bench.ratios import clock_name, fmt, interleaved, load_average, median_ci, ratio
from dlm.model import ModelConfig, Transformer
from dlm.stats import forward_flops
from harness.results import atomic_write_text, git_sha
from harness.cli import (add_run_args, at_least, device_of, dtype_of, markdown_table, parser, reading, run_main,
                         set_threads)
from harness.roofline import call_floor, machine, matmuls_of_call


def parse_args(argv=None):
    p = parser("experiments.bench.bench_bd3lm", __doc__, paragraphs=3)
    add_run_args(p, model=None, model_help="checkpoint dir (default: a random model)", dtype="float32", device="cpu",
                 seed=False)
    count = at_least(1)
    for flag, default, what in (("--d-model", 256, "random model width"), ("--layers", 4, "random model layers"),
                                ("--vocab", 512, "random model vocabulary"), ("--block-size", 16, "L'"),
                                ("--train-len", 256, "training row length L"), ("--train-batch", 4, "training rows"),
                                ("--reps", 5, "interleaved timing rounds"),
                                ("--steps-per-block", 4, "sampling steps per block"),
                                ("--sample-batch", 1, "sampled rows")):
        p.add_argument(flag, type=count, default=default, metavar="N", help=f"{what} (default {default})")
    p.add_argument("--lengths", type=count, nargs="+", default=[512, 1024], metavar="T",
                   help="total sampling lengths (default 512 1024)")
    p.add_argument("--out", default=None, metavar="DIR", help="write bd3lm.md and bd3lm.json here")
    return p.parse_args(argv)


def build_model(args) -> Transformer:
    dtype = dtype_of(args.dtype, torch.device(args.device))
    if args.model:
        from dlm.checkpoints import load_model

        with reading("--model", args.model):
            model, _ = load_model(args.model, dtype=dtype, device=args.device)
        return model
    d = args.d_model
    cfg = ModelConfig(vocab_size=args.vocab, d_model=d, n_layers=args.layers, n_heads=max(d // 32, 1),
                      n_kv_heads=max(d // 32, 1), mlp_hidden=int(d * 8 / 3) // 8 * 8,
                      max_seq_len=max(args.lengths + [args.train_len]), mask_token_id=args.vocab - 1,
                      eos_token_id=2, pad_token_id=0, bos_token_id=1)
    model = Transformer(cfg)
    model.reset_parameters(generator=torch.Generator().manual_seed(0))
    return model.to(device=args.device, dtype=dtype)


def bench_training(model, args) -> dict:
    """Per backend: BD3 (L') and MDLM (L' = L) training steps timed in interleaved rounds."""
    cfg = model.config
    g = torch.Generator(device=args.device).manual_seed(0)
    x = torch.randint(4, cfg.mask_token_id, (args.train_batch, args.train_len), generator=g, device=args.device)
    batch = {"input_ids": x}
    out = {}
    flex_backward = torch.device(args.device).type == "cuda"
    for backend in ("sdpa", "blocksparse", "flex"):
        backward = backend != "flex" or flex_backward
        steps = {name: training_step(model, batch, bs, backend, backward, g)
                 for name, bs in (("bd3", args.block_size), ("mdlm", args.train_len))}
        times = interleaved(steps, args.reps, torch.device(args.device))
        out[backend] = {"seconds": {k: median(v) for k, v in times.items()}, "times": times,
                        "ratio": ratio(times, "bd3", "mdlm"),
                        "mode": "fwd+bwd" if backward else "forward only (no flex backward on CPU)"}
    L, bs = args.train_len, args.block_size
    out["columns_ratio"] = (2 * L - bs) / L  # pruned [x_t | x_0 minus last block] vs [x_t]
    out.update(flop_ratios(cfg, L, bs))
    return out


def training_step(model, batch: dict, bs: int, backend: str, backward: bool, g: torch.Generator):
    """One NELBO step at block size ``bs`` (L' = L: MDLM) on fixed noise: forward + backward, or
    the forward alone."""
    obj = BD3Objective(bs, backend=backend)
    inputs = {**batch, **obj.sample_noise(batch, g)}

    def step() -> None:
        if backward:
            loss, _ = obj(model, inputs, None)
            loss.backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                bd3_nelbo(model, inputs, bs, backend=backend)

    return step


def flop_ratios(cfg, L: int, bs: int) -> dict:
    """FLOP ratio of the 2L objective over MDLM (forward; the backward scales alike), with the
    attention computed densely over all N x N pairs (SDPA with a bool mask) or over exactly the
    pairs the mask allows (the floor a block-sparse kernel such as FlexAttention approaches);
    ``_pruned``: as the objective runs, the last layer without the clean half's queries, output
    projection and MLP (``prune_last_layer``: nothing reads those rows)."""
    n_params = cfg.num_params(include_embeddings=False)
    N = num_columns(L, bs)
    mask = dense_bd3_mask(L, bs)[0, 0]  # (N, N): rows 0..L-1 noisy, L..N-1 clean
    allowed, clean_allowed = int(mask.sum()), int(mask[L:].sum())
    kv = 2 * cfg.d_model * cfg.n_kv_heads * cfg.head_dim  # K and V projections: still every row
    skipped = 2 * (n_params / cfg.n_layers - kv) * (N - L)  # last layer, clean rows

    def flops(q: int, k: float) -> float:  # logits only for the L noisy columns in both objectives
        return forward_flops(n_params, cfg.n_layers, cfg.d_model, q, k, cfg.vocab_size, L)

    mdlm, dense, sparse = flops(L, L), flops(N, N), flops(N, allowed / N)
    return {"flop_ratio_dense": dense / mdlm, "flop_ratio_sparse": sparse / mdlm,
            "flop_ratio_dense_pruned": (dense - skipped - 4 * cfg.d_model * (N - L) * N) / mdlm,
            "flop_ratio_sparse_pruned": (sparse - skipped - 4 * cfg.d_model * clean_allowed) / mdlm}


def bench_sampling(model, args, hw: dict) -> dict:
    """Per total length: the cached and uncached calls and their matmuls alone, interleaved."""
    cfg = model.config
    bs, B, dev = args.block_size, args.sample_batch, torch.device(args.device)
    out = {}
    for length in args.lengths:
        prompt = torch.randint(4, cfg.mask_token_id, (B, bs), device=dev, generator=torch.Generator(device=dev).manual_seed(1))
        calls = {key: (lambda use_cache=use_cache: sample(
            model, prompt, block_size=bs, max_length=length, steps_per_block=args.steps_per_block,
            stop_at_eos=False, use_cache=use_cache)) for key, use_cache in (("cached", True), ("uncached", False))}
        res = {key: call() for key, call in calls.items()}
        fns = {**calls, **{f"{key}_matmuls": matmuls_of_call(model, r.stats, B) for key, r in res.items()}}
        load = load_average()
        times = interleaved(fns, args.reps, dev)
        row = {key: {"seconds": median(times[key]), "matmul_seconds": median(times[f"{key}_matmuls"]),
                     "nfe": r.stats.nfe, "positions": r.stats.positions_computed, "flops": r.stats.extra["flops"],
                     "floor_s": call_floor(model, r.stats, B, hw)} for key, r in res.items()}
        for r in row.values():
            r["floor_over_measured"] = r["floor_s"] / r["seconds"]
        flop_ideal = row["uncached"]["flops"] / row["cached"]["flops"]
        speedup = ratio(times, "uncached", "cached")
        out[str(length)] = {
            **row, "tokens_equal": torch.equal(res["cached"].sequences, res["uncached"].sequences),
            "speedup": speedup, "flop_ideal": flop_ideal,
            "of_flop_ideal": {"median": speedup["median"] / flop_ideal, "ci": [c / flop_ideal for c in speedup["ci"]],
                              "rounds": speedup["rounds"]},
            "matmul_ideal": ratio(times, "uncached_matmuls", "cached_matmuls"),
            "of_matmul_ideal": of_ideal(times),
            "cached_matmul_share": ratio(times, "cached_matmuls", "cached"),
            "uncached_matmul_share": ratio(times, "uncached_matmuls", "uncached"),
            "load_before": load, "load_after": load_average(), "times": times}
    return out


def of_ideal(times: dict) -> dict:
    """The speed-up over the matmul ideal, per round ((uncached / cached) / (uncached matmuls /
    cached matmuls)): median and 95% bootstrap interval. 1 = the cache removes exactly the matmul
    time it should; below 1 = the rest (attention, norms, the loop) weighs more in the cached call."""
    per_round = [(u / c) / (um / cm) for u, c, um, cm in
                 zip(times["uncached"], times["cached"], times["uncached_matmuls"], times["cached_matmuls"])]
    med, lo, hi = median_ci(per_round)
    return {"median": med, "ci": [lo, hi], "rounds": len(per_round)}


def report(res: dict) -> list[str]:
    """The markdown of one run."""
    a, m = res["args"], res["model"]
    train, samp = res["training"], res["sampling"]
    md = ["# BD3-LM costs: training step against MDLM, exact cache against recomputing", "",
          (f"{m['name']}: d {m['d_model']}, {m['n_layers']} layers, vocab {m['vocab_size']}, L' = {a['block_size']}; "
           f"{a['device']} {a['dtype']}, {a['threads']} thread(s), {a['reps']} interleaved rounds ({res['clock']}); "
           f"git {res['git_sha']}; load average {' '.join(map(str, res['load_before']))}. Seconds: medians; "
           "ratios: median of the per-round ratios [95% bootstrap interval]. Written by "
           "`python -m experiments.bench.bench_bd3lm`."), "",
          f"## Training step, batch {a['train_batch']} x L = {a['train_len']}", "",
          (f"Columns {train['columns_ratio']:.2f}x MDLM's; FLOPs {train['flop_ratio_dense']:.2f}x with dense "
           f"attention, {train['flop_ratio_sparse']:.2f}x over the allowed pairs only; without the last layer's "
           f"clean rows {train['flop_ratio_dense_pruned']:.2f}x / {train['flop_ratio_sparse_pruned']:.2f}x."), "",
          *markdown_table(["backend", "step", "BD3 ms", "MDLM ms", "BD3 / MDLM"],
                          [[b, train[b]["mode"], f"{train[b]['seconds']['bd3'] * 1e3:.1f}",
                            f"{train[b]['seconds']['mdlm'] * 1e3:.1f}", fmt(train[b]["ratio"])]
                           for b in ("sdpa", "blocksparse", "flex")]), "",
          f"## Sampling, batch {a['sample_batch']}, {a['steps_per_block']} steps per block", "",
          ("Speed-up: uncached block-causal / exact cache, the same tokens. FLOP ideal: the FLOP ratio. "
           "Matmul ideal: the two calls' matmuls timed alone (the speed-up if nothing but the matmuls cost "
           "time; a narrow window's GEMMs run slower per FLOP, so it lies below the FLOP ideal, and matmul "
           "ideal / FLOP ideal bounds the share of the FLOP ideal any loop can reach here). Matmul share: the "
           "call's matmuls alone / the call."), "",
          *markdown_table(["length", "cached s", "uncached s", "speed-up", "FLOP ideal", "of FLOP ideal",
                           "matmul ideal", "of matmul ideal", "cached matmul share", "uncached matmul share",
                           "tokens equal"],
                          [[n, f"{r['cached']['seconds']:.3f}", f"{r['uncached']['seconds']:.3f}", fmt(r["speedup"]),
                            f"{r['flop_ideal']:.2f}", fmt(r["of_flop_ideal"]), fmt(r["matmul_ideal"]),
                            fmt(r["of_matmul_ideal"]),
                            fmt(r["cached_matmul_share"]), fmt(r["uncached_matmul_share"]), r["tokens_equal"]]
                           for n, r in samp.items()])]
    return md


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.device = str(device_of(args.device))
    args.threads = set_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    model = build_model(args)
    c = model.config
    print(f"model: d={c.d_model} layers={c.n_layers} vocab={c.vocab_size} params={c.num_params():,} "
          f"dtype={args.dtype} device={args.device} threads={args.threads}; block size {args.block_size}")
    load = load_average()
    model.train()
    train = bench_training(model, args)
    model.eval()
    hw = machine(torch.device(args.device), next(model.parameters()).dtype)
    samp = bench_sampling(model, args, hw)
    model_info = {"name": args.model or "random model", "d_model": c.d_model, "n_layers": c.n_layers,
                  "vocab_size": c.vocab_size}
    result = {"training": train, "sampling": samp, "machine": hw, "args": vars(args), "model": model_info,
              "git_sha": git_sha(),
              "clock": clock_name(torch.device(args.device)), "load_before": load, "load_after": load_average()}
    md = report(result)
    print("\n".join(md))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "bd3lm.md", "\n".join(md) + "\n")
        atomic_write_text(out / "bd3lm.json", stable_json(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    run_main(main)
