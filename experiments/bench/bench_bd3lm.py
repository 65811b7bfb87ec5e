"""BD3-LM costs measured in one run (Arriola et al., ICLR 2025).

(a) training step (forward + backward) of the vectorized ``x_t ⊕ x_0`` NELBO (block size L')
    vs MDLM (the same code with L' = L: one block, no clean half) on the same model and batch,
    with SDPA over the dense mask and with the ``blocksparse`` backend (SDPA on the mask's nonzero
    blocks only); FlexAttention too where it has a backward (CUDA). On CPU FlexAttention runs
    eagerly and has no backward, so its row is forward-only (and says so).
(b) sampling: exact KV cache vs the uncached block-causal reference (rerun the whole prefix
    at every step) at total lengths 512 and 1024, next to the FLOP-count ideal speed-up and
    each call's roofline floor (:mod:`harness.roofline`, peak and bandwidth measured here).

    python -m experiments.bench.bench_bd3lm            # small random model, ~1-2 min CPU
    python -m experiments.bench.bench_bd3lm --model runs/bd3/model --device cuda

Common flags (``--model --device --dtype --threads``) come from :mod:`harness.cli`; CPU
threads default to ``OMP_NUM_THREADS``, else 1 (OpenMP spin on shared CPUs).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import torch

from bd3lm import BD3Objective, sample
from bd3lm.loss import bd3_nelbo
from bd3lm.masks import dense_bd3_mask, num_columns
from dlm.io import stable_json
from dlm.model import ModelConfig, Transformer
from dlm.stats import forward_flops
from harness.results import atomic_write_text
from harness.cli import add_run_args, at_least, device_of, dtype_of, parser, reading, run_main, set_threads
from harness.roofline import call_floor, machine


def parse_args(argv=None):
    p = parser("experiments.bench.bench_bd3lm", __doc__, paragraphs=3)
    add_run_args(p, model=None, model_help="checkpoint dir (default: a random model)", dtype="float32", device="cpu",
                 seed=False)
    count = at_least(1)
    for flag, default, what in (("--d-model", 256, "random model width"), ("--layers", 4, "random model layers"),
                                ("--vocab", 512, "random model vocabulary"), ("--block-size", 16, "L'"),
                                ("--train-len", 256, "training row length L"), ("--train-batch", 4, "training rows"),
                                ("--reps", 3, "timed repetitions"),
                                ("--steps-per-block", 4, "sampling steps per block"),
                                ("--sample-batch", 1, "sampled rows")):
        p.add_argument(flag, type=count, default=default, metavar="N", help=f"{what} (default {default})")
    p.add_argument("--lengths", type=count, nargs="+", default=[512, 1024], metavar="T",
                   help="total sampling lengths (default 512 1024)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results here")
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


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps: int, device) -> float:
    fn()  # warm-up
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / reps


def bench_training(model, args) -> dict:
    cfg = model.config
    g = torch.Generator(device=args.device).manual_seed(0)
    x = torch.randint(4, cfg.mask_token_id, (args.train_batch, args.train_len), generator=g, device=args.device)
    batch = {"input_ids": x}
    out = {}
    flex_backward = torch.device(args.device).type == "cuda"
    for backend in ("sdpa", "blocksparse", "flex"):
        res = {}
        for name, bs in (("bd3", args.block_size), ("mdlm", args.train_len)):
            obj = BD3Objective(bs, backend=backend)
            noise = obj.sample_noise(batch, g)
            if backend != "flex" or flex_backward:
                def step():
                    loss, _ = obj(model, {**batch, **noise}, None)
                    loss.backward()
                    model.zero_grad(set_to_none=True)
            else:
                def step():
                    with torch.no_grad():
                        bd3_nelbo(model, {**batch, **noise}, bs, backend=backend)
            res[name] = timed(step, args.reps, args.device)
        res["ratio_bd3_over_mdlm"] = res["bd3"] / res["mdlm"]
        res["mode"] = "fwd+bwd" if backend != "flex" or flex_backward else "forward only (no flex backward on CPU)"
        out[backend] = res
    L, bs = args.train_len, args.block_size
    out["columns_ratio"] = (2 * L - bs) / L  # pruned [x_t | x_0 minus last block] vs [x_t]
    out.update(flop_ratios(cfg, L, bs))
    return out


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
    cfg = model.config
    bs = args.block_size
    out = {}
    for length in args.lengths:
        prompt = torch.randint(4, cfg.mask_token_id, (args.sample_batch, bs), device=args.device,
                               generator=torch.Generator(device=args.device).manual_seed(1))
        row = {}
        for use_cache in (True, False):
            sync(args.device)
            t0 = time.perf_counter()
            res = sample(model, prompt, block_size=bs, max_length=length, steps_per_block=args.steps_per_block,
                         stop_at_eos=False, use_cache=use_cache)
            sync(args.device)
            key = "cached" if use_cache else "uncached"
            sec = time.perf_counter() - t0
            floor = call_floor(model, res.stats, args.sample_batch, hw)
            row[key] = {"seconds": sec, "nfe": res.stats.nfe, "positions": res.stats.positions_computed,
                        "flops": res.stats.extra["flops"], "floor_s": floor, "floor_over_measured": floor / sec}
        row["speedup"] = row["uncached"]["seconds"] / row["cached"]["seconds"]
        row["flop_ideal_speedup"] = row["uncached"]["flops"] / row["cached"]["flops"]
        out[str(length)] = row
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.device = str(device_of(args.device))
    args.threads = set_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    model = build_model(args)
    c = model.config
    print(f"model: d={c.d_model} layers={c.n_layers} vocab={c.vocab_size} params={c.num_params():,} "
          f"dtype={args.dtype} device={args.device} threads={args.threads}; block size {args.block_size}")
    model.train()
    train = bench_training(model, args)
    model.eval()
    print(f"(a) training step, batch {args.train_batch} x L={args.train_len}, L'={args.block_size} "
          f"(columns {train['columns_ratio']:.2f}x MDLM; FLOPs {train['flop_ratio_dense']:.2f}x with dense "
          f"attention, {train['flop_ratio_sparse']:.2f}x over the allowed pairs only; without the last "
          f"layer's clean rows {train['flop_ratio_dense_pruned']:.2f}x / {train['flop_ratio_sparse_pruned']:.2f}x)")
    for backend in ("sdpa", "blocksparse", "flex"):
        r = train[backend]
        print(f"    {backend:5s} [{r['mode']}]: bd3 {r['bd3'] * 1e3:8.1f} ms  mdlm {r['mdlm'] * 1e3:8.1f} ms  "
              f"ratio {r['ratio_bd3_over_mdlm']:.2f}x")
    hw = machine(torch.device(args.device), next(model.parameters()).dtype)
    samp = bench_sampling(model, args, hw)
    print(f"(b) sampling, {args.steps_per_block} steps per block of {args.block_size}, batch {args.sample_batch}")
    for length, r in samp.items():
        print(f"    length {length:>5s}: cached {r['cached']['seconds']:6.2f} s ({r['cached']['nfe']} nfe, floor / measured "
              f"{r['cached']['floor_over_measured']:.2f})  uncached {r['uncached']['seconds']:6.2f} s "
              f"({r['uncached']['nfe']} nfe, floor / measured {r['uncached']['floor_over_measured']:.2f})  "
              f"speed-up {r['speedup']:.2f}x  (FLOP ideal {r['flop_ideal_speedup']:.2f}x)")
    result = {"training": train, "sampling": samp, "machine": hw, "args": vars(args)}
    if args.json:
        atomic_write_text(Path(args.json), stable_json(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    run_main(main)
