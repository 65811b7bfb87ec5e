"""Retrain the embedded LLaDA-style (bidirectional) model from scratch, in three phases.

    # phase 1 (~35 min on one core): learn the task on short EOS-padded answers
    OMP_NUM_THREADS=1 python -m experiments.train.train_llada --out runs/llada-p1 --d-model 128 --n-layers 4 \\
        --n-heads 4 --lr 3e-3 --warmup 100 --ema 0 --steps 2600 --short-steps 2000 --max-value 9 \\
        --weighting uniform --response-lengths 32 256 512 --response-probs 0.8 0.15 0.05 --fewshot-prob 0.2
    # phase 2 (~14 min): long EOS tails (generation lengths 64-512) and few-shot prompts
    OMP_NUM_THREADS=1 python -m experiments.train.train_llada --init runs/llada-p1/model --out runs/llada-p2 \\
        --steps 1000 --batch-size 16 --lr 1e-3 --warmup 50 --ema 0 --max-value 9 --weighting uniform \\
        --response-lengths 32 64 256 512 --response-probs 0.2 0.2 0.4 0.2 --fewshot-prob 0.2
    # phase 3 (~2 x 17 min): worked examples in 60% of the batches, 600 steps then 900 more
    # (--init runs/llada-p2/model --out runs/llada-p3a, then --init runs/llada-p3a/model
    #  --out runs/llada-arith; flags in the README and experiments/reproduce/plan.toml, group LLADA_PHASE3)
    # runs/llada-arith/model (bf16) is what results/checkpoints/llada-arith holds

SFT recipe (LLaDA guidelines): prompt never masked, the answer EOS-padded to the batch length
and masked with p ~ U(eps, 1). Procedural GSM8K-format problems from ``tasks``; tokenizer
from ``tasks.tokenizer`` (digits one by one). What made a 0.9M-parameter model learn on a CPU
budget: fp32 (bf16 autocast is ~10x slower on AVX2 CPUs), single-digit operands (a fixed answer
layout), the ``uniform`` per-row loss weight instead of LLaDA's high-variance 1/t, a curriculum
of short answers first, and a second phase with small batches of long EOS tails (a model
trained on 32-token answers fails at gen_length 64+: it has never seen a long masked tail).
Torch CPU threads: ``OMP_NUM_THREADS`` if set, else 1 (:func:`harness.cli.set_threads`).

Resuming: rerun with the same ``--out`` and the run continues from its last checkpoint. Only
``--out``, ``--eval-every`` and ``--save-every`` (and the thread count) may differ: every other flag
is the recipe (data, loss, model shape, optimizer; ``--steps`` too, since it sets the cosine
schedule of every step) and a changed one stops the resume before anything is built, with a
ValueError naming each flag and both values. To train further, start a new phase with
``--init <run>/model``. ``--force-recipe`` continues anyway; the change is recorded in the model's
``config.json`` (``extra.recipe_changes``: the step and ``[old, new]`` of each flag).
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import asdict, replace

import torch

from dlm.checkpoints import load_model, save_model
from dlm.model import ModelConfig, Transformer
from dlm.objectives import ARSFTLoss, LLaDASFTLoss
from tasks import COT_STYLES, ArithConfig, generate_problems
from tasks.sft_data import SFTBatches, SFTDataConfig
from tasks.tokenizer import build_tokenizer
from dlm.train import TrainConfig, check_resume, flag_recipe, train
from harness.cli import (add_shape_args, add_train_args, at_least, parser, reading, run_main, set_threads,
                         train_config, writing_to)
from harness.evaluate import score
from dlm.spec import Sampler

#: flags that may change when a run resumes (the others are its recipe; see the module docstring)
RESUMABLE_FLAGS = ("out", "eval_every", "save_every", "force_recipe")


def build_model(tok, d_model: int, n_layers: int, n_heads: int, max_seq_len: int, seed: int,
                family: str = "llada") -> Transformer:
    """A fresh model; ``family="dream"``: Qwen2 layout (q/k/v bias) with Dream's shifted logits."""
    dream = family == "dream"
    cfg = ModelConfig(qkv_bias=dream, shift_logits=dream,
        vocab_size=len(tok), d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_heads,
        mlp_hidden=(8 * d_model // 3 + 63) // 64 * 64, max_seq_len=max_seq_len, rope_theta=10000.0,
        tie_embeddings=True, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    model = Transformer(cfg)
    model.reset_parameters(std=0.02, generator=torch.Generator().manual_seed(seed))
    return model


def main(argv=None) -> None:
    p = parser("experiments.train.train_llada", __doc__)
    count = at_least(1)
    p.add_argument("--out", default="runs/llada-arith", metavar="DIR", help="run dir (default runs/llada-arith)")
    p.add_argument("--init", default=None, metavar="DIR", help="start from this checkpoint (default: random init)")
    add_train_args(p, steps=1200, lr=2e-3, warmup=60)
    add_shape_args(p, d_model=192, n_layers=4, n_heads=6)
    p.add_argument("--max-seq-len", type=count, default=1024, metavar="T",
                   help="context (default 1024; with --init: raised to T)")
    p.add_argument("--max-value", type=int, default=50, metavar="N", help="largest operand (default 50)")
    p.add_argument("--min-steps-per-problem", type=int, default=1, metavar="N",
                   help="fewest reasoning steps per problem (default 1)")
    p.add_argument("--max-steps-per-problem", type=int, default=2, metavar="N",
                   help="most reasoning steps per problem (default 2)")
    p.add_argument("--ops", nargs="+", default=["+", "-"], choices=["+", "-", "*"], metavar="OP",
                   help="operators: + - * (default + -)")
    p.add_argument("--max-factor", type=int, default=9, metavar="N", help="bound on both operands of * (default 9)")
    p.add_argument("--cot", default="terse", choices=list(COT_STYLES), help="chain-of-thought style (default terse)")
    p.add_argument("--loop", action="store_true", help="add a repeated subtraction to every problem")
    p.add_argument("--response-lengths", type=count, nargs="+", default=[48, 256, 512], metavar="N",
                   help="answer lengths (default 48 256 512)")
    p.add_argument("--response-probs", type=float, nargs="+", default=[0.85, 0.12, 0.03], metavar="P",
                   help="their probabilities (default .85 .12 .03)")
    p.add_argument("--fewshot-prob", type=float, default=0.25, metavar="P",
                   help="share of few-shot rows (default 0.25)")
    p.add_argument("--shots-per-batch", action="store_true", help="one shot count per few-shot batch, not per row (about half the compute)")
    p.add_argument("--direct-prob", type=float, default=0.0, metavar="P",
                   help="share of answers cut to '#### N' (default 0)")
    p.add_argument("--short-steps", type=int, default=0, metavar="N",
                   help="first N steps on the shortest length (default 0)")
    p.add_argument("--weighting", default="elbo", choices=["elbo", "uniform"], help="loss weight (default elbo)")
    p.add_argument("--suffix-prob", type=float, default=0.0, metavar="P",
                   help="share of rows masked from a cut to the end (needs --weighting uniform)")
    p.add_argument("--family", default="llada", choices=["llada", "dream"], help="model built from scratch (default llada; --init keeps the checkpoint's)")
    p.add_argument("--objective", default="diffusion", choices=["diffusion", "ar"],
                   help="LLaDA's SFT loss or next-token (ar)")
    p.add_argument("--ema", type=float, default=0.995, metavar="X", help="EMA decay (default 0.995)")
    # bf16 autocast is ~10x *slower* than fp32 on CPUs without AVX512-BF16/AMX (measured on a
    # 2-core AVX2 EPYC); use it on GPUs
    p.add_argument("--precision", default="fp32", choices=["bf16", "fp32"],
                   help="fp32 (default) or bf16 autocast (GPUs)")
    p.add_argument("--eval-every", type=int, default=200, metavar="N", help="steps between evaluations (default 200)")
    p.add_argument("--save-every", type=int, default=100, metavar="N", help="steps between checkpoints (default 100)")
    p.add_argument("--seed", type=int, default=0, help="init and data seed (default 0)")
    p.add_argument("--force-recipe", action="store_true", help="resume though recipe flags changed (recorded)")
    args = p.parse_args(argv)
    set_threads(None)
    cfg = train_config(p, args, min_lr_ratio=0.05, weight_decay=0.1, grad_clip=1.0, log_every=10)
    with writing_to("--out", args.out):  # one run per --out, refused before anything is built
        run(args, cfg)


def run(args, cfg: TrainConfig) -> None:
    """Train as the parsed flags ``args`` say, into ``cfg.out_dir``."""
    recipe = flag_recipe({**vars(args), "init": args.init and os.path.normpath(args.init)}, RESUMABLE_FLAGS)
    recipe_changes = check_resume(cfg, recipe, force_recipe=args.force_recipe)  # before anything is built

    tok = build_tokenizer()
    arith = ArithConfig(min_steps=args.min_steps_per_problem, max_steps=args.max_steps_per_problem,
                        max_value=args.max_value, ops=tuple(args.ops), max_factor=args.max_factor, cot=args.cot,
                        loop=args.loop)
    data = SFTBatches(tok, SFTDataConfig(arith=arith, batch_size=args.batch_size,
                                         response_lengths=tuple(args.response_lengths),
                                         response_probs=tuple(args.response_probs),
                                         fewshot_prob=args.fewshot_prob, short_steps=args.short_steps,
                                         shots_per_batch=args.shots_per_batch,
                                         direct_prob=args.direct_prob))
    if args.init:
        with reading("--init", args.init):
            model, _ = load_model(args.init, dtype=torch.float32)
        if args.max_seq_len > model.config.max_seq_len:  # RoPE has no table to grow: only the limit moves
            model.config = replace(model.config, max_seq_len=args.max_seq_len)
    else:
        model = build_model(tok, args.d_model, args.n_layers, args.n_heads, args.max_seq_len, args.seed,
                            args.family)
    print(f"params: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M")
    held_out = generate_problems(arith, 64, split="test", seed=12345)

    def eval_fn(m) -> dict:
        semiar = score(m, tok, held_out, Sampler.of("semiar32", gen_length=64, block_length=32), batch_size=64)
        pure = score(m, tok, held_out, Sampler.of("pure", gen_length=64, block_length=None), batch_size=64)
        return {"acc_semiar64": semiar["accuracy"], "acc_pure64": pure["accuracy"]}

    t0 = time.time()
    if args.objective == "ar":
        objective = ARSFTLoss()
    else:
        objective = LLaDASFTLoss(weighting=args.weighting, suffix_prob=args.suffix_prob)
    layout = "dream" if model.config.shift_logits else "native"
    extra = {"recipe": "ar-sft" if args.objective == "ar" else "llada-sft", "args": vars(args), "arith": asdict(arith), "recipe_changes": recipe_changes}
    train(model, objective, data, cfg, tokenizer=tok, eval_fn=eval_fn, recipe=recipe,
          force_recipe=args.force_recipe,
          save_fn=functools.partial(save_model, dtype=torch.bfloat16, layout=layout, extra_config=extra))
    print(json.dumps({"wall_seconds": time.time() - t0, "steps": args.steps}))


if __name__ == "__main__":
    run_main(main)
