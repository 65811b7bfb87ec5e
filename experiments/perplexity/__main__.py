"""BD3-LM perplexity ladder (Table 3) and clipped-schedule variance (Table 2), any scale.

    OMP_NUM_THREADS=1 python -m experiments.perplexity --preset laptop --models ar bd4 bd8 &
    OMP_NUM_THREADS=1 python -m experiments.perplexity --preset laptop --models bd16 mdlm &
    wait; python -m experiments.perplexity report --preset laptop
    torchrun --nproc_per_node 8 -m experiments.perplexity train --preset lm1b   # then `eval` on one GPU

Commands: ``train``, ``eval``, ``all`` (default: train, then eval) and ``report`` (tables and plot
rebuilt from the JSONL alone). Models: ``ar`` (L'=1, exact AR NLL objective: every token masked,
t = 1), ``bd<k>`` (BD3-LM, L'=k, NELBO of BD3-LM eq. 8 with the data-driven clipped schedule of
sec. 4 searched on held-out training chunks) and ``mdlm`` (L'=L, unclipped). All share model
size, data, steps, seed (same init, same batches) and optimizer. ``--finetune-from-mdlm``: the
paper's recipe, an MDLM (``mdlm-base``) trained for ``steps - finetune_steps`` steps initialises
``bd<k>`` and ``mdlm``, each then trained for ``finetune_steps`` (``ar`` stays from scratch);
processes splitting --models share ``mdlm-base``: the first trains it, the others wait (``LOCK``).

Evaluation on the test file: NELBO perplexity (unclipped U[0,1], low-discrepancy t; exact NLL
for ``ar``), LLaDA's Monte-Carlo ELBO of ``mdlm`` (cross-check, :mod:`dlm.likelihood`) and, for
``--var-models`` (default bd4 bd16), Var(NELBO) under U[0,1], U[.3,.8], U[.5,1] and the searched
clipping with common random numbers (see :mod:`experiments.perplexity.report`). With
``--var-finetune-steps N`` each schedule row is the L' model fine-tuned N steps under it (BD3-LM
Table 2); with 0 (laptop default) every row scores the one trained model.

Files: ``<out>/perplexity_<run>.jsonl`` (one record per trained/evaluated model, git SHA, config
hash and seed in each; a rerun skips finished ids; another config under the same --run is refused),
``.md``/``.csv``/``.png``; exported bf16 checkpoints ``<out>/checkpoints/perplexity-<run>-<model>/``;
trainer state under ``--work`` (default ``runs/perplexity-<run>/``).

Data are named (:mod:`experiments.perplexity.config`): ``--train`` / ``--test`` take
``<dataset>:<split>`` of the data mirror (``lm1b-sample:dev``, ``wikitext-2:test``, ``ptb:valid``, ...;
found in ``$DLM_SHARED_DATA`` or ``../shared/data`` beside the checkout, a symlink is fine), a text
file of your own or a HF dataset name; the config hash holds the name and the content fingerprint,
never a path. The data are read (and checked against the fingerprint) only when something is left
to compute: with every result of the config recorded, ``eval`` just rebuilds the tables.

Presets: ``laptop`` (lm1b-sample dev -> train, test -> eval, bert-base-uncased, L=128, d=64
tied-embedding models of 2.2M parameters, 4.3 MB per bf16 checkpoint; fp32 on CPU) - see
README for the measured budget; ``lm1b`` / ``owt``: the paper's settings (HF datasets, 12 x 768
Transformer, batch 512, 1M steps, bf16, GPUs, torchrun); ``char``: character-level tinyshakespeare
(first 90% of input.txt's characters -> train, last 10% -> test, tokenizer ``char`` built in code),
seeds 0 1 2, each model a few minutes on one core (docs/perplexity_char.md).

Seeds: ``--seeds 0 1 2`` (the char preset's default) runs each seed as its own run
``<run>-s<seed>`` (JSONL, checkpoints, trainer state: nothing shared) and writes the across-seed
report ``perplexity_<run>.md/.csv`` (mean +- std per model, separation of adjacent rungs, MC-ELBO
CI; :mod:`experiments.perplexity.seeds`).
"""

from __future__ import annotations

import argparse
import re
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Optional

import torch

from bd3lm.schedules import check_grid
from dlm import distributed
from harness.cli import check_out, parser, run_main
from harness.results import REPO
from experiments.perplexity.config import (CUTS, DEFAULT_MODELS, PRESETS, RunConfig, model_block, name_source,
                                           name_tokenizer)
from experiments.perplexity.jobs import Paths, eval_model, load_data, open_log, pending, plan_jobs, train_job
from experiments.perplexity.report import write_report
from experiments.perplexity.seeds import seed_configs, write_seed_report

COMMANDS = ("all", "train", "eval", "report")


# ----------------------------------------------------------------------------------- command line
#: preset fields a flag overrides (one value each; default: the preset's), by section
OVERRIDES = {"model": [("--seq-len", int), ("--d-model", int), ("--n-layers", int), ("--n-heads", int),
                       ("--mlp-hidden", int)],
             "training": [("--steps", int), ("--batch-size", int), ("--micro-batch-size", int), ("--lr", float),
                          ("--warmup", int), ("--ema", float), ("--precision", str), ("--seed", int),
                          ("--search-every", int), ("--finetune-steps", int), ("--max-train-lines", int),
                          ("--val-chunks", int)],
             "evaluation": [("--eval-chunks", int), ("--eval-batch-size", int), ("--eval-passes", int),
                            ("--eval-seed", int), ("--mc-chunks", int), ("--mc-num", int), ("--var-chunks", int),
                            ("--var-finetune-steps", int), ("--max-test-lines", int)]}


def build_parser() -> argparse.ArgumentParser:
    p = parser("experiments.perplexity.__main__", __doc__, paragraphs=2)
    p.add_argument("command", nargs="?", default="all", help=f"one of {', '.join(COMMANDS)} (default all)")
    p.add_argument("--preset", default="laptop", help=f"one of {', '.join(sorted(PRESETS))} (default laptop)")
    p.add_argument("--run", default=None, metavar="NAME", help="run name for files (default: the preset name)")
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), metavar="M", help="ar, bd<k> (k < L), mdlm")
    p.add_argument("--var-models", nargs="*", default=None, metavar="M",
                   help="models of the variance table (default bd4 bd16)")
    p.add_argument("--finetune-from-mdlm", action="store_true", help="the paper's recipe (see the docstring)")
    p.add_argument("--seeds", nargs="+", type=int, default=None, metavar="S",
                   help="training seeds, each its own run <run>-s<seed>")
    for flag, hlp in (("--train", "training data: <dataset>:<split>, a text file or a HF dataset"),
                      ("--test", "test data (the same)"), ("--tokenizer", "tokenizer dir or hub name"),
                      ("--out", "results dir (default results/)"),
                      ("--work", "trainer state dir (default runs/perplexity-<run>)"),
                      ("--device", "default cuda if available, else cpu")):
        p.add_argument(flag, default=None, help=hlp)
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    lines = [line for section, flags in OVERRIDES.items()
             for line in textwrap.wrap(f"{section}: " + " ".join(flag for flag, _ in flags), 74,
                                       subsequent_indent="    ", break_on_hyphens=False)]
    group = p.add_argument_group("preset overrides", "one value each (default: the preset's; --precision "
                                 "fp32|bf16,\n--search-every 0: unclipped)\n" + "\n".join(lines))
    for flags in OVERRIDES.values():
        for flag, typ in flags:
            group.add_argument(flag, type=typ, default=None, help=argparse.SUPPRESS)
    return p


def _positive(flag: str, value, minimum: int = 1) -> None:
    if value is not None and (not isinstance(value, int) or value < minimum):
        raise ValueError(f"{flag} must be an int >= {minimum}, got {value!r}")


def parse_config(argv=None) -> RunConfig:
    """Parse and validate the command line; bad values raise ValueError naming the flag."""
    a = build_parser().parse_args(argv)
    if a.command not in COMMANDS:
        raise ValueError(f"command must be one of {COMMANDS}, got {a.command!r}")
    if a.preset not in PRESETS:
        raise ValueError(f"--preset must be one of {sorted(PRESETS)}, got {a.preset!r}")
    run = a.run or a.preset
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", run):
        raise ValueError(f"--run must be letters, digits, '_', '.', '-', got {run!r}")
    for flag in ("seq_len", "steps", "batch_size", "micro_batch_size", "d_model", "n_layers", "n_heads",
                 "mlp_hidden", "eval_chunks", "eval_batch_size", "eval_passes", "mc_chunks", "mc_num", "var_chunks",
                 "threads", "max_train_lines", "max_test_lines"):
        _positive("--" + flag.replace("_", "-"), getattr(a, flag))
    for flag in ("val_chunks", "warmup", "seed", "search_every", "finetune_steps", "var_finetune_steps",
                 "eval_seed"):
        _positive("--" + flag.replace("_", "-"), getattr(a, flag), minimum=0)
    if a.lr is not None and not a.lr > 0:
        raise ValueError(f"--lr must be > 0, got {a.lr}")
    if a.ema is not None and not 0 <= a.ema < 1:
        raise ValueError(f"--ema must lie in [0, 1), got {a.ema}")
    if a.precision not in (None, "fp32", "bf16"):
        raise ValueError(f"--precision must be fp32 or bf16, got {a.precision!r}")
    base = PRESETS[a.preset]()
    pick = lambda v, d: d if v is None else v  # noqa: E731
    d0, t0, e0, m0 = base["data"], base["train"], base["eval"], base["arch"]
    named = {"train": name_source(pick(a.train, d0.train), "--train", check=a.command != "report"),
             "test": name_source(pick(a.test, d0.test), "--test", check=a.command != "report"),
             "tokenizer": name_tokenizer(pick(a.tokenizer, d0.tokenizer))}
    spans = tuple((role, *CUTS[named[role][0]]) for role in ("train", "test") if named[role][0] in CUTS)
    style = d0.style
    for role, *_ in spans:
        if style != "char":
            raise ValueError(f"--{role}: {named[role][0]} is a character span of its file: only the char preset "
                             f"(style char) cuts it, this preset's style is {style}")
    data = replace(d0, train=named["train"][0], test=named["test"][0], tokenizer=named["tokenizer"][0], spans=spans,
                   fingerprints=tuple((role, fp) for role, (_, fp, _) in named.items() if fp),
                   paths=tuple((role, path) for role, (_, _, path) in named.items() if path),
                   seq_len=pick(a.seq_len, d0.seq_len),
                   max_train_lines=pick(a.max_train_lines, d0.max_train_lines),
                   max_test_lines=pick(a.max_test_lines, d0.max_test_lines),
                   val_chunks=pick(a.val_chunks, d0.val_chunks))
    heads = pick(a.n_heads, m0.n_heads)
    arch = replace(m0, d_model=pick(a.d_model, m0.d_model), n_layers=pick(a.n_layers, m0.n_layers), n_heads=heads,
                   n_kv_heads=heads if a.n_heads else m0.n_kv_heads, mlp_hidden=pick(a.mlp_hidden, m0.mlp_hidden))
    if arch.d_model % arch.n_heads or (arch.d_model // arch.n_heads) % 2:
        raise ValueError(f"--d-model {arch.d_model} / --n-heads {arch.n_heads} must give an even head size")
    steps = pick(a.steps, t0.steps)
    scale = steps / t0.steps  # --steps rescales the preset's step-denominated settings
    tspec = replace(t0, steps=steps, batch_size=pick(a.batch_size, t0.batch_size),
                    micro_batch_size=pick(a.micro_batch_size, t0.micro_batch_size), lr=pick(a.lr, t0.lr),
                    warmup=pick(a.warmup, min(t0.warmup, int(t0.warmup * scale))), ema=pick(a.ema, t0.ema),
                    precision=pick(a.precision, t0.precision), seed=pick(a.seed, t0.seed),
                    search_every=pick(a.search_every, int(t0.search_every * scale)),
                    finetune_from_mdlm=a.finetune_from_mdlm,
                    finetune_steps=pick(a.finetune_steps, int(t0.finetune_steps * scale)),
                    var_finetune_steps=pick(a.var_finetune_steps, t0.var_finetune_steps))
    tspec = replace(tspec, clip_search=tspec.search_every > 0)
    if tspec.warmup > steps:
        raise ValueError(f"--warmup {tspec.warmup} exceeds --steps {steps}")
    if tspec.micro_batch_size and tspec.batch_size % tspec.micro_batch_size:
        raise ValueError(f"--batch-size {tspec.batch_size} not divisible by --micro-batch-size")
    if tspec.finetune_from_mdlm and not 0 < tspec.finetune_steps < steps:
        raise ValueError(f"--finetune-steps must lie in [1, --steps) with --finetune-from-mdlm, "
                         f"got {tspec.finetune_steps}")
    espec = replace(e0, eval_chunks=pick(a.eval_chunks, e0.eval_chunks),
                    batch_size=pick(a.eval_batch_size, e0.batch_size),
                    mc_chunks=pick(a.mc_chunks, e0.mc_chunks), mc_num=pick(a.mc_num, e0.mc_num),
                    var_chunks=pick(a.var_chunks, e0.var_chunks), seed=pick(a.eval_seed, e0.seed),
                    passes=pick(a.eval_passes, e0.passes))
    espec = replace(espec, mc_batch_size=min(espec.mc_batch_size, espec.mc_num))
    if espec.mc_num % espec.mc_batch_size:
        raise ValueError(f"--mc-num {espec.mc_num} must be a multiple of {espec.mc_batch_size}")
    if not a.models:
        raise ValueError("--models: need at least one model")
    if len(set(a.models)) != len(a.models):
        raise ValueError(f"--models: duplicates in {a.models}")
    for name in a.models:
        model_block(name, data.seq_len)
    if a.var_models is None:  # the paper's L'=4 and 16, where L allows them
        a.var_models = [n for n in ("bd4", "bd16") if data.seq_len % int(n[2:]) == 0 < data.seq_len - int(n[2:])]
    for name in a.var_models:
        if model_block(name, data.seq_len, "--var-models") in (1, data.seq_len):
            raise ValueError(f"--var-models: only bd<k> models have a clipped schedule, got {name!r}")
    if a.command in ("all", "train") and data.val_chunks < 1 and tspec.clip_search:
        raise ValueError("--val-chunks must be >= 1 for the clipping search (or --search-every 0)")
    if a.seeds is not None and a.seed is not None:
        raise ValueError("--seeds: give either --seeds or --seed")
    seeds = tuple(a.seeds) if a.seeds is not None else (() if a.seed is not None else tuple(base.get("seeds", ())))
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must be distinct ints >= 0, got {list(seeds)}")
    out = check_out("--out", a.out or REPO / "results")
    work = check_out("--work", a.work or REPO / "runs" / f"perplexity-{run}")
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return RunConfig(a.preset, run, a.command, tuple(a.models), tuple(a.var_models), data, arch, tspec, espec,
                     str(out), str(work), device, a.threads, seeds)


# ------------------------------------------------------------------------------------------- run
def run(cfg: RunConfig) -> Optional[Path]:
    """Train, evaluate and report as ``cfg.command`` says; returns the markdown report's path.
    With ``cfg.seeds``: each seed in turn as run ``<run>-s<seed>``, then the across-seed report."""
    if cfg.seeds:
        for one in seed_configs(cfg):  # report: the seeds with results so far
            if cfg.command != "report" or Paths(one).jsonl.is_file():
                run(one)
        return write_seed_report(Path(cfg.out), cfg.run, cfg.seeds)
    paths = Paths(cfg)
    if cfg.command == "report":
        return write_report(paths.out, cfg.run)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    check_grid(cfg.train.grid)
    info = distributed.init()
    try:
        log = open_log(cfg, paths) if info.is_main else None
        todo = pending(cfg, paths)
        if not todo:  # every result recorded under this config: the tables only, no data, no model
            print(f"[perplexity] {paths.jsonl}: every {cfg.command} result of this config is recorded", flush=True)
            return write_report(paths.out, cfg.run) if info.is_main else None
        data = load_data(cfg)
        if cfg.command in ("all", "train"):
            for job in plan_jobs(cfg):
                train_job(job, cfg, data, paths, log)
        if cfg.command in ("all", "eval") and info.is_main:
            for name in cfg.models:
                eval_model(name, cfg, data, paths, log)
        return write_report(paths.out, cfg.run) if info.is_main else None
    finally:
        distributed.cleanup()


def main(argv=None) -> None:
    path = run(parse_config(argv))
    if path is not None:
        print(Path(path).read_text())


if __name__ == "__main__":
    run_main(main)
