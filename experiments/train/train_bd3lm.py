"""Embedded BD3-LM models on the testbed task: fine-tune a bidirectional checkpoint to block size L'.

    # stage 1: the phase-1 LLaDA-style snapshot made block-causal at L'=16, zero-shot prompts
    OMP_NUM_THREADS=1 python -m experiments.train.train_bd3lm --init runs/llada-p1/model --block-size 16 \\
        --fewshot-prob 0 --out runs/bd3lm-arith-16-s1
    # stage 2, per block size: small batches, 1-8 worked examples in 60% of them
    OMP_NUM_THREADS=1 python -m experiments.train.train_bd3lm --init runs/bd3lm-arith-16-s1/model --block-size 8 \\
        --batch-size 16 --steps 1200 --warmup 30 --fewshot-prob 0.6 --eval-every 300 --out runs/bd3lm-arith-8

BD3-LM's recipe (Arriola et al. 2025, sec. 6: fine-tune from an MDLM checkpoint): the
bidirectional embedded model initialises a block-causal one, trained with the vectorized
``[prompt | x_t | x_0]`` NELBO on prompt-conditioned SFT rows. Sampling stops at the first block
that contains EOS, so unlike the bidirectional model it never needs the long EOS tail: responses
are padded only to a few blocks past the answer. Few-shot batches draw one shot count per batch
(``SFTDataConfig.shots_per_batch``): the layout starts every row's response after the shortest
prompt of the batch, so mixing 1-shot and 8-shot rows would train on hundreds of EOS columns.
Evaluation (64 held-out problems) reports zero-shot and 4-shot accuracy; the command line is
recorded in the checkpoint's ``config.json`` (``extra.args``). Torch CPU threads:
``OMP_NUM_THREADS`` if set, else 1 (:func:`harness.cli.set_threads`).

Resuming: rerun with the same ``--out``. Only ``--out`` and ``--eval-every`` may differ from the
checkpoint's flags; any other change (``--steps`` too: it sets the cosine schedule) is a ValueError
naming each flag and both values, raised before the model is loaded. ``--force-recipe`` continues
anyway and records the change in ``config.json`` (``extra.recipe_changes``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from bd3lm import BD3LM, ClipSchedule
from dlm.checkpoints import load_model
from tasks import fewshot_examples, generate_problems
from tasks.sft_data import SFTBatches, SFTDataConfig
from dlm.train import TrainConfig, check_resume, flag_recipe, train
from harness.cli import add_train_args, at_least, parser, reading, run_main, set_threads, train_config, writing_to
from harness.evaluate import score
from dlm.spec import Sampler
from harness.results import arith_config_of

DEFAULT_INIT = Path(__file__).resolve().parents[2] / "results" / "checkpoints" / "llada-arith"
#: flags that may change when a run resumes (the others are its recipe; see the module docstring)
RESUMABLE_FLAGS = ("out", "eval_every", "force_recipe")


def main(argv=None) -> None:
    p = parser("experiments.train.train_bd3lm", __doc__)
    count = at_least(1)
    p.add_argument("--init", default=str(DEFAULT_INIT), metavar="DIR",
                   help="bidirectional checkpoint to start from (default llada-arith)")
    p.add_argument("--block-size", type=count, default=16, metavar="L'", help="block size (default 16)")
    p.add_argument("--out", default=None, metavar="DIR", help="run dir (default runs/bd3lm-arith-<L'>)")
    add_train_args(p, steps=300, lr=5e-4, warmup=20)
    p.add_argument("--response-length", type=count, default=64, metavar="N",
                   help="answer columns, a multiple of L' (default 64)")
    p.add_argument("--fewshot-prob", type=float, default=0.25, metavar="P",
                   help="share of batches with 1..--max-shots examples")
    p.add_argument("--max-shots", type=int, default=8, metavar="K", help="most worked examples (default 8)")
    p.add_argument("--beta", type=float, default=0.0, help="clipped schedule's lower end (default 0)")
    p.add_argument("--omega", type=float, default=1.0, help="clipped schedule's upper end (default 1)")
    p.add_argument("--ema", type=float, default=0.99, metavar="X", help="EMA decay (default 0.99)")
    p.add_argument("--eval-every", type=int, default=100, metavar="N", help="steps between evaluations (default 100)")
    p.add_argument("--seed", type=int, default=0, help="data seed (default 0)")
    # bf16 autocast is ~10x slower than fp32 on CPUs without AVX512-BF16/AMX; use it on GPUs
    p.add_argument("--precision", default="fp32", choices=["bf16", "fp32"], help="fp32 (default) or bf16 (GPUs)")
    p.add_argument("--force-recipe", action="store_true", help="resume though recipe flags changed (recorded)")
    args = p.parse_args(argv)
    set_threads(None)
    if args.response_length % args.block_size:
        raise ValueError(f"--response-length {args.response_length} must be a multiple of --block-size")
    out = args.out or f"runs/bd3lm-arith-{args.block_size}"
    cfg = train_config(p, args, out_dir=out, min_lr_ratio=0.1, weight_decay=0.1, grad_clip=1.0, save_every=50,
                       log_every=10)
    with writing_to("--out", out):  # one run per --out, refused before the model is loaded
        run(args, cfg)


def run(args, cfg: TrainConfig) -> None:
    """Fine-tune as the parsed flags ``args`` say, into ``cfg.out_dir``."""
    recipe = flag_recipe({**vars(args), "init": os.path.normpath(args.init)}, RESUMABLE_FLAGS)
    recipe_changes = check_resume(cfg, recipe, force_recipe=args.force_recipe)  # before anything is built

    with reading("--init", args.init):
        model, tok = load_model(args.init, dtype=torch.float32)
    arith = arith_config_of(args.init)
    bd3 = BD3LM(model, args.block_size, ClipSchedule(args.beta, args.omega), align="prompt")
    data = SFTBatches(tok, SFTDataConfig(arith=arith, batch_size=args.batch_size,
                                         response_lengths=(args.response_length,), response_probs=(1.0,),
                                         fewshot_prob=args.fewshot_prob, max_shots=args.max_shots,
                                         shots_per_batch=True))
    held_out = generate_problems(arith, 64, split="test", seed=12345)

    shots = fewshot_examples(arith, k=4, seed=0)

    def eval_fn(m) -> dict:
        acc = {}
        strategy = Sampler.of("bd3lm", policy="exact", gen_length=args.response_length, block_length=args.block_size,
                              top_p=1.0, stop_at_eos=True)  # bd3lm.sample's defaults, one token per step
        for name, k_shots in (("acc", ()), ("acc_4shot", shots)):
            r = score(m, tok, held_out, strategy, batch_size=64, shots=k_shots)
            acc[name] = r["accuracy"]
        return acc

    def save_fn(m, tokenizer, d) -> None:
        from bd3lm import save_bd3

        save_bd3(m, tokenizer, d, bd3.bd3_config, dtype=torch.bfloat16)
        meta = json.loads((Path(d) / "config.json").read_text())
        meta.setdefault("extra", {}).update(arith=asdict(arith), recipe="bd3lm-sft", args=vars(args),
                                            recipe_changes=recipe_changes)
        (Path(d) / "config.json").write_text(json.dumps(meta, indent=2) + "\n")

    t0 = time.time()
    train(model, bd3.objective, data, cfg, tokenizer=tok, eval_fn=eval_fn, save_fn=save_fn, recipe=recipe,
          force_recipe=args.force_recipe)
    print(json.dumps({"wall_seconds": time.time() - t0, "steps": args.steps}))


if __name__ == "__main__":
    run_main(main)
