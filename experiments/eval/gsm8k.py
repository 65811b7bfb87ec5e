"""GSM8K harness: accuracy and throughput of every sampling strategy on one model.

    python -m experiments.eval.gsm8k                                   # embedded model, held-out arith
    python -m experiments.eval.gsm8k --data gsm8k --model GSAI-ML/LLaDA-8B-Instruct --num-fewshot 5 \\
        --strategies table1 --gen-length 256 --block-length 32 --out results/gsm8k_llada
    python -m experiments.eval.gsm8k --data ../shared/data/gsm8k/test.jsonl --limit 100 ...
    torchrun --nproc_per_node 8 -m experiments.eval.gsm8k ...         # samples i % world == rank

Data (--data): ``arith`` = the embedded task's held-out set, ``generate_problems(ArithConfig(),
n, split="test", seed)`` (--limit n, default 500, after --skip; the model's ArithConfig, ``extra.arith``);
``gsm8k`` = the real GSM8K test set from the Hub (needs ``datasets``); or a local GSM8K jsonl. Few-shot
examples come from the arith train split, the Hub train split, or ``train.jsonl`` beside the
local file. Prompts use ``tokenizer.chat_template`` when the tokenizer has one (shots as
user / assistant turns) unless --no-chat-template; otherwise ``Question: ...\\nAnswer:``. Before any
compute, shots that are test questions and prompts holding the mask token's text are refused, and
text the tokenizer cannot represent is reported (:mod:`harness.prompt_checks`).

Strategies (--strategies, names or grids from harness/grids.py; ``--list-strategies``
prints them all): grid ``table1`` = the LLaDA baselines, Fast-dLLM's caches and rules and
``bd3lm``; grid ``factorial`` = the 24 ``abl_*`` cells of cache x parallel x stop_at_eos x block
size. ``bd3lm`` runs its block-causal model from --bd3-model (skipped without it); ``--bd3-context
N`` raises its context limit (no learned positions; it stops at its first EOS block).

Outputs under --out (default ``runs/gsm8k_<data>_<date-time>``): ``<strategy>.jsonl``, one record
per sample (:mod:`harness.records`), appended batch by batch; a rerun skips the ids written (another
config is refused); ranks write ``<strategy>.rank{r}.jsonl``, merged by rank 0. Then ``config.json``
(git SHA, configs, ``--margin``: harness.noninferiority) and harness/report.py's tables and plot.
Throughput = tokens up to the first EOS / seconds of the sampler calls, alike for every strategy.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from tqdm import tqdm

from dlm import distributed, registry
from tasks import Problem, fewshot_examples, generate_problems, load_gsm8k, sample_shots
from harness.cli import (DTYPES, UserError, add_list_flag, check_out, device_of, dtype_of, flags_of, in_flags,
                         parser, reading, run_main, set_threads, writing_to)
from harness.results import (REPO, JsonlLog, arith_config_of, config_hash, encode_question,
                             git_sha, merge_logs, rank_log_path, rank_log_paths, repo_relative)
from harness.prompt_checks import check_fits, check_shots_unseen, encode_prompts
from harness.records import write_run_config
from harness.noninferiority import check_declared, check_margin, declaration
from harness.evaluate import check_resumable, check_same_problems, evaluate, existing_records
from dlm.kind import ModelKind
from dlm.spec import Sampler, resolve_family
from harness.grids import listing, resolve, sampler_names

DEFAULT_MODEL = REPO / "results" / "checkpoints" / "llada-arith"
DEFAULT_ARITH_N = 500
DEFAULT_BLOCK = 32


@dataclass(frozen=True)
class HarnessConfig:
    """Validated command line of one harness run."""

    model: str
    data: str
    num_fewshot: int
    limit: Optional[int]
    batch_size: int
    seed: int
    chat_template: bool
    out: Path
    strategies: tuple[Sampler, ...]
    baseline: str
    bd3_model: Optional[str]
    device: str
    dtype: str
    threads: Optional[int]
    sort_prompts: bool = False
    compile: bool = False
    bd3_context: Optional[int] = None
    block_length: Optional[int] = None  # --block-length as given (None: not given)
    margin: Optional[float] = None  # --margin: non-inferiority margin vs --baseline, points (None: none)
    skip: int = 0  # --skip: the problems before this index are left out (held-out confirmation)


@dataclass(frozen=True)
class Loaded:
    """A model with its tokenizer, the attention it was trained with and the flag that named it;
    ``bd3`` is the BD3Config of a block-causal model."""

    model: torch.nn.Module
    tokenizer: object
    source: str
    kind: ModelKind
    flag: str
    bd3: object = None
    weights: Optional[str] = None  # dlm.checkpoints.weights_fingerprint of the checkpoint


def build_parser(module: str = "experiments.eval.gsm8k", doc: str = __doc__, paragraphs=2) -> argparse.ArgumentParser:
    """The harness's flags under ``python -m <module>`` (experiments.eval.timing adds its own)."""
    p = parser(module, doc, paragraphs=paragraphs)
    add_list_flag(p, "--list-strategies", listing, "print every grid and strategy name and exit")
    p.add_argument("--model", default=str(DEFAULT_MODEL), metavar="DIR",
                   help="checkpoint dir or hub id (default: llada-arith)")
    p.add_argument("--bd3-model", default=None, metavar="DIR",
                   help="BD3-LM checkpoint for bd3lm (else skipped)")
    p.add_argument("--bd3-context", type=int, default=None, metavar="N",
                   help="raise --bd3-model's max_seq_len to N (recorded)")
    p.add_argument("--data", default="arith", help="arith (default), gsm8k (Hub) or a GSM8K jsonl")
    p.add_argument("--num-fewshot", type=int, default=0, metavar="K", help="worked examples per prompt (default 0)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help=f"first N problems (default all; {DEFAULT_ARITH_N} for arith) after --skip")
    p.add_argument("--skip", type=int, default=0, metavar="K",
                   help="leave out problems 0..K-1: a point picked on them is confirmed on the next ones (default 0)")
    p.add_argument("--batch-size", type=int, default=32, metavar="B", help="prompts per sampler call (default 32)")
    p.add_argument("--compile", action="store_true", help="forward under torch.compile (same tokens)")
    p.add_argument("--sort-prompts", action="store_true", help="batch prompts of similar length (recorded)")
    p.add_argument("--seed", type=int, default=0, help="problems, shots and sampler noise (default 0)")
    p.add_argument("--no-chat-template", action="store_true", help="plain 'Question: ...\\nAnswer:' prompts")
    p.add_argument("--strategies", nargs="+", default=["table1"], metavar="NAME",
                   help="strategy or grid names (default table1; --list-strategies)")
    p.add_argument("--baseline", default="baseline_semiar", metavar="NAME",
                   help="row of the speed-ups (default baseline_semiar)")
    p.add_argument("--gen-length", type=int, default=256, metavar="G", help="generated columns (default 256)")
    p.add_argument("--block-length", type=int, default=None, metavar="L",
                   help=f"semi-AR block length (default {DEFAULT_BLOCK}; bd3lm: the model's)")
    p.add_argument("--steps", type=int, default=None, metavar="S", help="top-k steps in all (default: G)")
    p.add_argument("--threshold", type=float, default=0.9, metavar="T", help="threshold rule's tau (default 0.9)")
    p.add_argument("--factor", type=float, default=1.0, metavar="F", help="factor rule's f (default 1.0)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="sampling temperature (default 0)")
    p.add_argument("--family", default="auto", choices=("auto", *registry.names("family")),
                   help="whose block rules and proposal run (auto: read from the model's config)")
    p.add_argument("--margin", type=float, default=None, metavar="POINTS",
                   help="non-inferiority margin vs --baseline, declared before the run (recorded; harness.report)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="results dir (default: new runs/gsm8k_<data>_<time>)")
    p.add_argument("--device", default=None, help="torch device (default cuda[:LOCAL_RANK], else cpu)")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], metavar="DTYPE",
                   help="auto (bf16 on CUDA, else fp32) or a torch dtype")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads (default: free cores)")
    return p


def _data_tag(data: str) -> str:
    return data if data in ("arith", "gsm8k") else Path(data).stem


def parse_config(argv=None) -> HarnessConfig:
    """Parse and validate the command line; bad values raise ValueError naming the flag."""
    p = build_parser()
    return config_of(p, p.parse_args(argv))


def config_of(p: argparse.ArgumentParser, a: argparse.Namespace) -> HarnessConfig:
    """The :class:`HarnessConfig` of parsed flags ``a`` of ``p``; bad values raise ValueError naming the flag."""
    if a.limit is not None and a.limit < 1 or a.skip < 0:
        raise ValueError(f"--limit must be >= 1 and --skip >= 0, got {a.limit} and {a.skip}")
    if a.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {a.batch_size}")
    if a.num_fewshot < 0:
        raise ValueError(f"--num-fewshot must be >= 0, got {a.num_fewshot}")
    if a.threads is not None and a.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {a.threads}")
    if a.data not in ("arith", "gsm8k") and not Path(a.data).is_file():
        raise ValueError(f"--data must be 'arith', 'gsm8k' or an existing jsonl file, got {a.data!r}")
    if a.bd3_model is not None and not Path(a.bd3_model).is_dir():
        raise ValueError(f"--bd3-model {a.bd3_model!r} is not a checkpoint directory")
    if a.bd3_context is not None and (a.bd3_model is None or a.bd3_context < 1):
        raise ValueError(f"--bd3-context must be >= 1 and needs --bd3-model, got {a.bd3_context}")
    numbers = dict(gen_length=a.gen_length, block_length=DEFAULT_BLOCK if a.block_length is None else a.block_length,
                   steps=a.steps, threshold=a.threshold, factor=a.factor, temperature=a.temperature, family=a.family)
    try:  # every strategy is validated here, before any model is loaded
        strategies = tuple(resolve(a.strategies, **numbers))
    except (TypeError, ValueError) as e:  # names the strategy asked for and the flags of its fields
        flags = {k: f for k, f in flags_of(p).items() if k in numbers}
        raise UserError("--" + in_flags(str(e), flags)) from None
    if a.baseline not in sampler_names():
        raise ValueError(f"--baseline must be a known strategy, got {a.baseline!r}")
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(a.out) if a.out else REPO / "runs" / f"gsm8k_{_data_tag(a.data)}_{time.strftime('%Y%m%d-%H%M%S')}"
    check_out("--out", out)
    return HarnessConfig(a.model, a.data, a.num_fewshot, a.limit, a.batch_size, a.seed,
                         not a.no_chat_template, out, strategies, a.baseline, a.bd3_model,
                         device, a.dtype, a.threads, a.sort_prompts, a.compile, a.bd3_context, a.block_length,
                         None if a.margin is None else check_margin(a.margin), a.skip)


# --------------------------------------------------------------------------------------- data
def load_problems(cfg: HarnessConfig) -> list[Problem]:
    """The problems of --data up to --skip + --limit, in a fixed order (ids stable across --limit);
    the run decodes those from --skip on (:func:`run_job`), so a record's index is its problem's."""
    if cfg.data == "arith":
        n = DEFAULT_ARITH_N if cfg.limit is None else cfg.limit
        return generate_problems(arith_config_of(cfg.model), cfg.skip + n, split="test", seed=cfg.seed)
    with reading("--data", cfg.data):
        problems = load_gsm8k("openai/gsm8k" if cfg.data == "gsm8k" else cfg.data, split="test")
    if not problems:
        raise ValueError(f"--data {cfg.data}: no problems")
    return problems if cfg.limit is None else problems[:cfg.skip + cfg.limit]


def load_shots(cfg: HarnessConfig) -> list[Problem]:
    """--num-fewshot worked examples (one fixed draw, never from the evaluation split)."""
    k = cfg.num_fewshot
    if k == 0:
        return []
    if cfg.data == "arith":
        return fewshot_examples(arith_config_of(cfg.model), k, seed=cfg.seed + 1)
    if cfg.data == "gsm8k":
        with reading("--data", cfg.data):
            pool = load_gsm8k("openai/gsm8k", split="train")
    else:
        train = Path(cfg.data).with_name("train.jsonl")
        if not train.is_file():
            raise ValueError(f"--num-fewshot {k} needs {train} beside --data for the examples")
        with reading("--num-fewshot", k):
            pool = load_gsm8k(train, split="train")
    return sample_shots(pool, k, seed=cfg.seed)


# ------------------------------------------------------------------------------------- models
def load_models(cfg: HarnessConfig, strategies, device: torch.device) -> tuple[Optional[Loaded], Optional[Loaded]]:
    """The --model (for baseline / fastdllm strategies) and --bd3-model (for bd3lm) it needs."""
    from dlm.checkpoints import load_model, model_kind, weights_fingerprint

    main = bd3 = None
    dtype = dtype_of(cfg.dtype, device)
    if any(not is_bd3(s) for s in strategies):
        with reading("--model", cfg.model):
            model, tok = load_model(cfg.model, dtype=dtype, device=device)
            kind = model_kind(cfg.model)
        if tok is None:
            raise ValueError(f"--model {cfg.model} has no tokenizer files")
        main = Loaded(model, tok, repo_relative(cfg.model), kind, "--model", weights=weights_fingerprint(cfg.model))
    if any(is_bd3(s) for s in strategies):
        from bd3lm import BD3LM

        with reading("--bd3-model", cfg.bd3_model):
            wrapper, tok = BD3LM.load(cfg.bd3_model, dtype=dtype, device=device)
            kind = model_kind(cfg.bd3_model)
        if tok is None:
            raise ValueError(f"--bd3-model {cfg.bd3_model} has no tokenizer files")
        if cfg.bd3_context is not None:
            wrapper.model.config = dataclasses.replace(wrapper.model.config, max_seq_len=cfg.bd3_context)
        bd3 = Loaded(wrapper.model.eval(), tok, repo_relative(cfg.bd3_model), kind, "--bd3-model", wrapper.bd3_config,
                     weights_fingerprint(cfg.bd3_model))
    return main, bd3


# --------------------------------------------------------------------------------------- jobs
def is_bd3(s: Sampler) -> bool:
    """Whether ``s`` decodes a block-diffusion (BD3-LM) model."""
    return registry.get("policy", s.policy).block_model


@dataclass(frozen=True)
class Job:
    """Everything one strategy needs, validated before any compute."""

    strategy: Sampler  # bound to the model (BD3-LM: its block size and alignment)
    loaded: Loaded
    config: dict
    config_hash: str


#: how to run a checkpoint of each attention with this harness (dlm.kind.ModelKind.bind)
RUN_AS = {"block_causal": "pass it as --bd3-model with --strategies bd3lm",
          "causal": "run it with --strategies ar (or ar_eos, grid autoregressive)",
          "bidirectional": "run it as --model with a bidirectional strategy (e.g. --strategies table1)"}


def make_job(strategy: Sampler, loaded: Loaded, cfg: HarnessConfig, problems, shots) -> Job:
    strategy = loaded.kind.bind(strategy, f"{loaded.flag} {loaded.source}", RUN_AS)
    if is_bd3(strategy) and cfg.block_length not in (None, strategy.block_length):  # an explicit other --block-length
        what = (f"strategy {strategy.name} decodes in the block size of --bd3-model {loaded.source}, "
                f"{strategy.block_length} ({loaded.kind.source})")
        if all(is_bd3(s) for s in cfg.strategies):
            raise ValueError(f"--block-length {cfg.block_length}: {what}; omit --block-length or pass a "
                             f"--bd3-model of block size {cfg.block_length}")
        print(f"note: --block-length {cfg.block_length} is for the other strategies: {what}", file=sys.stderr)
    chat = cfg.chat_template and bool(getattr(loaded.tokenizer, "chat_template", None))
    length, first = max((len(encode_question(loaded.tokenizer, p.question, shots, chat)), p.id) for p in problems)
    check_fits(f"--data {cfg.data}: problem {first} ({cfg.num_fewshot} shots, the longest)", length,
               strategy.gen_length, loaded.model.config.max_seq_len,
               f"lower --num-fewshot or --gen-length (the limit of {loaded.source})")
    family = resolve_family(strategy.family, loaded.model.config)
    config = {"strategy": strategy.as_dict(), "model": str(loaded.source), "data": cfg.data,
              "num_fewshot": cfg.num_fewshot, "chat_template": chat, "seed": cfg.seed,
              "dtype": str(next(loaded.model.parameters()).dtype).removeprefix("torch."),  # auto resolved
              "family": family, "sampler": strategy.resolved(family),  # what ran, every default included
              "bd3_context": cfg.bd3_context if loaded.bd3 is not None else None, "sort_prompts": cfg.sort_prompts}
    return Job(strategy, loaded, config, config_hash(config))


def run_job(job: Job, problems, shots, cfg: HarnessConfig, info, clock: Callable[[], float]) -> None:
    """Run one strategy over this rank's share of ``problems``, appending to its JSONL log."""
    name = job.strategy.name
    path = cfg.out / f"{name}.jsonl"
    done = existing_records(path)
    mine = [i for i in range(cfg.skip, len(problems)) if i % info.world_size == info.rank]
    old = [done[problems[i].id] for i in mine if problems[i].id in done]
    tally = {"n": len(old), "correct": sum(r["correct"] for r in old),
             "tokens": sum(r["tokens_until_eos"] for r in old), "seconds": sum(r["seconds"] for r in old)}
    bar = tqdm(total=len(mine), initial=len(old), desc=name, disable=not info.is_main, dynamic_ncols=True)

    def progress(t: dict) -> None:
        for r in t["records"][-t["new"]:] if t["new"] else ():
            tally["n"] += 1
            tally["correct"] += r["correct"]
            tally["tokens"] += r["tokens_until_eos"]
            tally["seconds"] += r["seconds"]
        bar.update(t["new"])
        bar.set_postfix(acc=f"{tally['correct'] / max(tally['n'], 1):.3f}",
                        tok_s=f"{tally['tokens'] / max(tally['seconds'], 1e-9):.1f}")

    last = [0.0]

    def on_step(view) -> None:  # inside a batch: show the denoising step, at most twice a second
        now = time.monotonic()
        if bar.disable or now - last[0] < 0.5:
            return
        last[0] = now
        bar.set_postfix_str(f"batch step {view.global_step + 1}, block {view.block + 1}", refresh=True)

    with JsonlLog(rank_log_path(path, info.rank) if info.enabled else path) as log:  # holds its lock
        evaluate(job.loaded.model, job.loaded.tokenizer, problems, job.strategy, log, shots=shots,
                 chat_template=job.config["chat_template"], batch_size=cfg.batch_size, seed=cfg.seed,
                 config_hash=job.config_hash, weights=job.loaded.weights, indices=mine, done=done, clock=clock,
                 progress=progress, callback=on_step, sort_by_length=cfg.sort_prompts, compile=cfg.compile)
    bar.close()
    distributed.barrier(info)
    if info.is_main and (info.enabled or rank_log_paths(path)):
        merge_logs(path, rank_log_paths(path))


def run(cfg: HarnessConfig, clock: Callable[[], float] = time.perf_counter) -> list[str]:
    """Run every strategy of ``cfg`` (resumable) and rebuild the report; returns the strategies run.

    ``clock`` times the sampler calls (tests pass a fake clock). The main process holds ``--out``'s
    lock for the whole run (:func:`harness.cli.writing_to`)."""
    info = distributed.init()
    try:  # the main process creates --out, holds its lock, cleans what killed runs left there
        with writing_to("--out", cfg.out) if info.is_main else contextlib.nullcontext():
            return _run(cfg, info, clock)
    finally:
        distributed.cleanup()


def _run(cfg: HarnessConfig, info, clock: Callable[[], float]) -> list[str]:
    set_threads(cfg.threads)
    device = device_of(cfg.device)
    if info.enabled and device.type == "cuda":
        device = torch.device("cuda", info.local_rank)
    problems, shots = load_problems(cfg), load_shots(cfg)
    local = cfg.data not in ("arith", "gsm8k")
    check_shots_unseen(shots, problems, Path(cfg.data).parent / "train.jsonl" if local else cfg.data)
    strategies = list(cfg.strategies)
    if cfg.bd3_model is None and any(is_bd3(s) for s in strategies):
        if info.is_main:
            print("bd3lm: skipped (no --bd3-model given)", file=sys.stderr)
        strategies = [s for s in strategies if not is_bd3(s)]
    main_model, bd3_model = load_models(cfg, strategies, device)
    for loaded in (m for m in (main_model, bd3_model) if m is not None):  # the mask token refused, <|unk|> reported
        encode_prompts(loaded.tokenizer, problems, shots, cfg.chat_template, mask_id=loaded.model.config.mask_token_id,
                       where=f"--data {cfg.data} on {loaded.source}")
    jobs = [make_job(s, bd3_model if is_bd3(s) else main_model, cfg, problems, shots) for s in strategies]
    margins = {j.strategy.name: declaration(cfg.margin, cfg.baseline, j.strategy.name) for j in jobs}
    for j in jobs:  # every file is checked before any compute
        path = cfg.out / f"{j.strategy.name}.jsonl"
        done = existing_records(path)
        check_resumable(done, path, j.config_hash, j.loaded.weights)
        check_same_problems(done, problems, path)
        check_declared(cfg.out, j.strategy.name, margins[j.strategy.name], bool(done))
    sha = git_sha()
    if info.is_main:
        write_run_config(cfg.out, {j.strategy.name: {"config_hash": j.config_hash, "config": j.config,
                                                      "model_weights": j.loaded.weights,
                                                      **({"margin": m} if (m := margins[j.strategy.name]) else {})}
                                   for j in jobs}, cfg.baseline, sha, sys.argv[1:])
    for j in jobs:
        run_job(j, problems, shots, cfg, info, clock)
    distributed.barrier(info)
    if info.is_main and jobs:
        from harness.report import build_report

        print(build_report(cfg.out, baseline=cfg.baseline).table_md)
    return [j.strategy.name for j in jobs]


def main(argv=None) -> None:
    run(parse_config(argv))


if __name__ == "__main__":
    run_main(main)
