"""Fast-dLLM speed benchmark (Wu et al. 2025, Tab. 1/2 style): baseline vs caches vs parallel.

One process runs, for each ``--gen-length``: the LLaDA baseline (``dlm.sampling.generate``, one
token per step), ``+prefix``, ``+dual`` (top-k, one token per step), ``+threshold`` (no cache),
``+prefix+threshold`` and ``+dual+threshold``, and prints wall time, measured speed-up over the
baseline, the FLOP-count ideal speed-up (``dlm.stats.forward_flops`` summed over the forwards)
and their ratio, NFE and tokens per step.

    python -m experiments.bench_fastdllm --preset tiny --threads 1
    python -m experiments.bench_fastdllm --model ckpt/llada-8b --device cuda \
        --dtype bfloat16 --gen-length 256 512

Common flags (``--model --device --dtype --threads --seed``) come from :mod:`experiments.cli`;
CPU threads default to ``OMP_NUM_THREADS``, else 1.

A random model proposes tokens with near-uniform confidence, so ``--threshold`` rarely commits
more than one token per step on it; raise ``--init-std`` for peakier random distributions.
"""

from __future__ import annotations

import argparse
import time

import torch

import fastdllm
from dlm.model import ModelConfig, Transformer
from dlm.sampling import generate as baseline_generate
from experiments.cli import add_run_args, device_of, dtype_of, set_threads

PRESETS = {  # random models: (vocab, d_model, layers, heads, kv heads, mlp hidden)
    "tiny": (512, 64, 2, 4, 2, 128),
    "small": (4096, 256, 4, 8, 4, 768),
    "base": (32000, 1024, 8, 16, 8, 2816),
}


def parse_args(argv=None) -> argparse.Namespace:
    """Flags, with ``--device`` resolved (cuda if available, else cpu)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p, model=None, model_help="checkpoint for dlm.checkpoints.load_model (default: a random model)",
                 dtype="float32")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="random model size")
    p.add_argument("--init-std", type=float, default=0.02, help="random model init std")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--gen-length", type=int, nargs="+", default=[256, 512])
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--threshold", type=float, default=0.9)
    p.add_argument("--backend", default="sdpa")
    args = p.parse_args(argv)
    args.device = str(device_of(args.device))
    return args


def build_model(args) -> Transformer:
    if args.model is not None:
        from dlm.checkpoints import load_model  # noqa: PLC0415 - only needed for real checkpoints

        model, _tokenizer = load_model(args.model)
    else:
        vocab, d, layers, heads, kv, mlp = PRESETS[args.preset]
        cfg = ModelConfig(vocab_size=vocab, d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=kv,
                          mlp_hidden=mlp, max_seq_len=args.prompt_len + max(args.gen_length),
                          mask_token_id=vocab - 1, eos_token_id=vocab - 2)
        model = Transformer(cfg)
        model.reset_parameters(std=args.init_std, generator=torch.Generator().manual_seed(args.seed))
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
    common = dict(gen_length=gen_length, block_length=args.block_length, backend=args.backend)
    if kwargs is None:
        out = baseline_generate(model, ids, steps=gen_length, **common)
        T = ids.shape[1] + gen_length  # every baseline forward: all T columns, head on the block
        flops = out.stats.nfe * fastdllm.window_flops(model.config, T, T, args.block_length)
    else:
        out = fastdllm.generate(model, ids, steps=gen_length, **common, **kwargs)
        flops = out.stats.extra["flops"]
    return out.stats, flops


def main(argv=None) -> None:
    args = parse_args(argv)
    args.threads = set_threads(args.threads)
    torch.manual_seed(args.seed)
    model = build_model(args)
    ids = random_prompts(model, args)
    cfg = model.config
    print(f"model: {args.model or args.preset} (d={cfg.d_model}, L={cfg.n_layers}, V={cfg.vocab_size}) "
          f"batch={args.batch_size} prompt={args.prompt_len} block={args.block_length} "
          f"threshold={args.threshold} device={args.device} dtype={args.dtype}")
    for _name, kw in variants(args):  # warm-up (allocator, kernels) on a short generation
        run_one(model, ids, args.block_length * 2, args, kw)
    header = f"{'gen':>5} {'variant':<18} {'seconds':>8} {'speedup':>8} {'ideal':>7} {'ratio':>6} " \
             f"{'NFE':>5} {'tok/step':>8} {'overhead':>8}"
    print(header)
    print("-" * len(header))
    t0 = time.perf_counter()
    for gen_length in args.gen_length:
        base_seconds = base_flops = None
        for name, kw in variants(args):
            stats, flops = run_one(model, ids, gen_length, args, kw)
            if base_seconds is None:
                base_seconds, base_flops = stats.seconds, flops
            speedup, ideal = base_seconds / stats.seconds, base_flops / flops
            print(f"{gen_length:>5} {name:<18} {stats.seconds:>8.3f} {speedup:>7.2f}x {ideal:>6.2f}x "
                  f"{speedup / ideal:>6.2f} {stats.nfe:>5} {stats.tokens_per_step:>8.2f} "
                  f"{stats.overhead_seconds / stats.seconds:>7.1%}")
    print(f"total {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
