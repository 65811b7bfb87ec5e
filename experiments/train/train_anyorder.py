"""Train the any-order task models: an autoregressive and a masked-diffusion model of the same
size on the same rows for the same number of tokens (the article's "where the end constrains the
start" comparison, at embedded scale).

    python -m experiments.train.train_anyorder --task sudoku --objective ar --out runs/anyorder/sudoku-ar
    python -m experiments.train.train_anyorder --task sudoku --objective diffusion --out runs/anyorder/sudoku-mdm

Both objectives see identical batches (:class:`tasks.pairs.PairBatches`: a prompt, the answer
EOS-padded to the task's response length plus a random tail of 0 … ``--max-tail`` columns):
``ar`` is next-token cross-entropy on the answer under a causal mask
(:class:`dlm.objectives.ARSFTLoss`), ``diffusion`` LLaDA's SFT loss with the uniform per-row
weight. The model is the embedded shape (d 128, 4 layers, 4 heads, a task tokenizer: digits one by
one) in Dream's layout (q/k/v bias, logit ``i`` from hidden state ``i - 1``) for both objectives,
so ``--init <ar run>/model --objective diffusion`` is Dream's recipe: the AR weights continue as a
masked diffusion model, every logit keeping its meaning. Resumable as :mod:`experiments.train.train_llada`.
"""

from __future__ import annotations

import functools
import json
import os
import time

import torch

from dlm.checkpoints import load_model, save_model
from dlm.objectives import ARSFTLoss, LLaDASFTLoss
from tasks import countdown, reversal, sudoku
from tasks.pairs import PairBatches
from dlm.tokenizer import build_word_tokenizer
from dlm.train import TrainConfig, check_resume, flag_recipe, train
from harness.cli import (add_shape_args, add_train_args, parser, reading, run_main, set_threads, train_config,
                         writing_to)
from experiments.train.train_llada import build_model

TASKS = {"sudoku": sudoku, "countdown": countdown, "reversal": reversal}
RESPONSE_LEN = {"sudoku": 24, "countdown": 40, "reversal": 32}
RESUMABLE_FLAGS = ("out", "save_every")


def task_sampler(task: str):
    """``sample(n, seed)`` of the task's training pairs."""
    if task == "reversal":
        return reversal.sampler(reversal.corpus())
    return functools.partial(TASKS[task].generate, split="train")


def task_tokenizer(task: str):
    return build_word_tokenizer(TASKS[task].vocabulary())


def main(argv=None) -> None:
    p = parser("experiments.train.train_anyorder", __doc__, paragraphs=2)
    p.add_argument("--task", required=True, choices=sorted(TASKS))
    p.add_argument("--objective", required=True, choices=["ar", "diffusion"])
    p.add_argument("--out", required=True, metavar="DIR", help="run dir (resumable)")
    add_train_args(p, steps=1500, lr=2e-3, warmup=50)
    add_shape_args(p, d_model=128, n_layers=4, n_heads=4)
    p.add_argument("--max-tail", type=int, default=16, metavar="N",
                   help="EOS tail of 0..N extra columns per batch (default 16)")
    p.add_argument("--init", default=None, metavar="DIR", help="start from this checkpoint (AR: Dream's recipe)")
    p.add_argument("--save-every", type=int, default=250, metavar="N", help="steps between checkpoints (default 250)")
    p.add_argument("--seed", type=int, default=0, help="init and data seed (default 0)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    args = p.parse_args(argv)
    set_threads(args.threads)
    cfg = train_config(p, args, min_lr_ratio=0.05, weight_decay=0.1, grad_clip=1.0, ema_decay=0.0, eval_every=0,
                       log_every=10)
    with writing_to("--out", args.out):  # one run per --out, refused before anything is built
        run(args, cfg)


def run(args, cfg: TrainConfig) -> None:
    """Train as the parsed flags ``args`` say, into ``cfg.out_dir``."""
    recipe = flag_recipe({**vars(args), "out": os.path.normpath(args.out),
                          "init": args.init and os.path.normpath(args.init)}, RESUMABLE_FLAGS + ("threads",))
    check_resume(cfg, recipe)
    tok = task_tokenizer(args.task)
    if args.init:
        with reading("--init", args.init):
            model, init_tok = load_model(args.init, dtype=torch.float32)
        if init_tok.get_vocab() != tok.get_vocab():
            raise ValueError(f"--init {args.init}: its tokenizer is not the {args.task} task's")
    else:
        model = build_model(tok, args.d_model, args.n_layers, args.n_heads, 256, args.seed, family="dream")
    data = PairBatches(tok, task_sampler(args.task), args.batch_size, RESPONSE_LEN[args.task], args.max_tail)
    objective = ARSFTLoss() if args.objective == "ar" else LLaDASFTLoss(weighting="uniform")
    extra = {"recipe": f"anyorder-{args.objective}", "task": args.task, "args": vars(args)}
    t0 = time.time()
    train(model, objective, data, cfg, tokenizer=tok, recipe=recipe,
          save_fn=functools.partial(save_model, dtype=torch.bfloat16, extra_config=extra))
    print(json.dumps({"wall_seconds": time.time() - t0, "steps": args.steps, "params": model.config.num_params()}))


if __name__ == "__main__":
    run_main(main)
