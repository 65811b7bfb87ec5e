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

Curves (:func:`tasks.anyorder.heldout`, :mod:`harness.run_records`): every step logs ``answer_loss``, the loss on the
answer's own tokens with the EOS padding left out; ``--eval-every N`` logs held-out accuracy on
``--eval-n`` items to ``metrics.jsonl``; ``--stop-patience K --stop-delta X`` ends the run when the
curve flattens, ``--steps`` being the cap (and the cosine schedule's length). ``--train-size N``
(countdown) trains on a fixed set of N distinct 3-number puzzles over many epochs, disjoint from the
shared CD3 test set and the held-out set. ``--task reversal2`` is the reversal task with one
tokenisation of a line in every format (:mod:`tasks.reversal`).
"""

from __future__ import annotations

import functools
import json
import os
import time

import torch

from dlm.checkpoints import load_model, save_model
from dlm.objectives import ARSFTLoss, LLaDASFTLoss
from tasks import reversal
from tasks.pairs import Epochs, PairBatches
from dlm.tokenizer import build_word_tokenizer
from dlm.train import METRICS_FILE, TrainConfig, check_resume, flag_recipe, train
from harness.cli import (add_shape_args, add_train_args, parser, reading, run_main, set_threads, train_config,
                         writing_to)
from experiments.eval.anyorder import eval_fn
from tasks.anyorder import RESPONSE_LEN, TASKS, countdown_sets, heldout
from harness import run_records as runs
from dlm.io import stable_json
from harness.results import atomic_write_text, git_sha
from experiments.train.train_llada import build_model

RESUMABLE_FLAGS = ("out", "save_every", "eval_every", "stop_patience", "stop_delta")


def task_sampler(task: str, train_size: int = 0, set_seed: int = 0, valid_size: int = 100):
    """``sample(n, seed)`` of the task's training pairs, or with ``train_size`` (countdown) the
    fixed set read in epochs (:class:`tasks.pairs.Epochs`), disjoint from the held-out set of
    ``valid_size`` puzzles and the shared test set."""
    if task in reversal.VERSIONS:
        return reversal.sampler(reversal.corpus(), reversal.VERSIONS[task])
    if train_size:
        return Epochs(tuple(countdown_sets(train_size, set_seed, valid_size)[0]), set_seed)
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
    p.add_argument("--family", choices=["dream", "llada"], default="dream",
                   help="the fresh model's layout: Dream's (q/k/v bias, shifted logits; default) or LLaDA's")
    p.add_argument("--init", default=None, metavar="DIR", help="start from this checkpoint (AR: Dream's recipe)")
    p.add_argument("--save-every", type=int, default=250, metavar="N", help="steps between checkpoints (default 250)")
    p.add_argument("--seed", type=int, default=0, help="init and data seed (default 0)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    p.add_argument("--min-lr-ratio", type=float, default=0.05, metavar="R",
                   help="the cosine decays to lr * R over --steps (default 0.05; 1 = constant after warm-up)")
    p.add_argument("--train-size", type=int, default=0, metavar="N",
                   help="countdown: train on a fixed set of N distinct 3-number puzzles over epochs, disjoint from "
                        "the held-out and test sets (default 0: a fresh draw of 3- and 4-number puzzles per batch)")
    p.add_argument("--train-set-seed", type=int, default=0, metavar="S", help="seed of the fixed set (default 0)")
    p.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="held-out accuracy every N steps into metrics.jsonl (default 0: off)")
    p.add_argument("--eval-n", type=int, default=100, metavar="N", help="held-out items per evaluation (default 100)")
    p.add_argument("--stop-patience", type=int, default=0, metavar="K",
                   help="stop when the best held-out accuracy of the last K evaluations is at most --stop-delta "
                        "points above the best before them; --steps stays the cap (default 0: off)")
    p.add_argument("--stop-delta", type=float, default=1.0, metavar="X", help="points, see --stop-patience (default 1)")
    args = p.parse_args(argv)
    check_curve_flags(args)
    set_threads(args.threads)
    cfg = train_config(p, args, weight_decay=0.1, grad_clip=1.0, ema_decay=0.0, log_every=10)
    with writing_to("--out", args.out):  # one run per --out, refused before anything is built
        run(args, cfg)


def check_curve_flags(args) -> None:
    """The curve and fixed-set flags, checked before anything is built."""
    for flag in ("train_size", "train_set_seed", "eval_every", "stop_patience"):
        if getattr(args, flag) < 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    if args.eval_n < 1:
        raise ValueError(f"--eval-n must be >= 1, got {args.eval_n}")
    if args.stop_delta < 0:
        raise ValueError(f"--stop-delta must be >= 0, got {args.stop_delta}")
    if args.train_size and args.task != "countdown":
        raise ValueError(f"--train-size: only --task countdown has a fixed training set, not --task {args.task}")
    if args.stop_patience and not args.eval_every:
        raise ValueError("--stop-patience reads the held-out curve: it needs --eval-every")


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
        model = build_model(tok, args.d_model, args.n_layers, args.n_heads, 256, args.seed, family=args.family)
    sample = task_sampler(args.task, args.train_size, args.train_set_seed, args.eval_n)
    data = PairBatches(tok, sample, args.batch_size, RESPONSE_LEN[args.task], args.max_tail)
    objective = ARSFTLoss() if args.objective == "ar" else LLaDASFTLoss(weighting="uniform")
    evaluate = eval_fn(tok, args.task, args.objective, heldout(args.task, args.eval_n)) \
        if args.eval_every else None
    metrics = os.path.join(cfg.out_dir, METRICS_FILE)
    stop = (lambda: runs.flat(runs.curve(metrics), args.stop_patience, args.stop_delta)) \
        if args.stop_patience else None
    sha = git_sha()
    extra = {"recipe": f"anyorder-{args.objective}", "task": args.task, "git_sha": sha,
             "args": {k: v for k, v in vars(args).items() if k != "out"}}  # where it trained is no model property
    t0, c0 = time.time(), time.process_time()
    from_step = runs.steps_done(cfg.out_dir)
    runs.begin_invocation(cfg.out_dir, from_step, sha)
    result = train(model, objective, data, cfg, tokenizer=tok, recipe=recipe, eval_fn=evaluate, should_stop=stop,
                   save_fn=functools.partial(save_model, dtype=torch.bfloat16, extra_config=extra))
    epochs = {"epochs": sample.epoch(result.step, args.batch_size)} if isinstance(sample, Epochs) else {}
    summary = {"steps": result.step, "stopped_flat": result.stopped, **epochs, "params": model.config.num_params(),
               "args": vars(args)}  # this invocation's (a resumed run: the last one's)
    invocation = {"from_step": from_step, "to_step": result.step, "cpu_seconds": round(time.process_time() - c0, 1),
                  "wall_seconds": round(time.time() - t0, 1), "git_sha": sha}
    print(json.dumps(runs.add_invocation(cfg.out_dir, summary, invocation)))
    atomic_write_text(os.path.join(cfg.out_dir, runs.RECORD_FILE),
                      stable_json(runs.run_record(cfg.out_dir)) + "\n")


if __name__ == "__main__":
    run_main(main)
