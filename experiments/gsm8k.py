"""GSM8K harness: accuracy and throughput of every sampling strategy on one model.

    python -m experiments.gsm8k                                   # embedded model, held-out arith
    python -m experiments.gsm8k --data gsm8k --model GSAI-ML/LLaDA-8B-Instruct --num-fewshot 5 \\
        --strategies table1 --gen-length 256 --block-length 32 --out results/gsm8k_llada
    python -m experiments.gsm8k --data ../shared/data/gsm8k/test.jsonl --limit 100 ...
    torchrun --nproc_per_node 8 -m experiments.gsm8k ...         # samples i % world == rank

Data (--data): ``arith`` = the embedded task's held-out set, ``generate_problems(ArithConfig(),
n, split="test", seed)`` (n = --limit, default 500; the ArithConfig recorded in the model's
config.json ``extra.arith`` when there is one); ``gsm8k`` = the real GSM8K test set from the
Hub (needs ``datasets``); or a local GSM8K jsonl (``question``/``answer`` per line). Few-shot
examples come from the arith train split, the Hub train split, or ``train.jsonl`` beside the
local file. Prompts use ``tokenizer.chat_template`` when the tokenizer has one (shots as
user / assistant turns) unless --no-chat-template; otherwise ``Question: ...\\nAnswer:``.

Strategies (--strategies, names or grids from experiments/strategies.py): grid ``table1`` =
baseline_full baseline_semiar fastdllm_prefix fastdllm_dual fastdllm_threshold fastdllm_factor
fastdllm_prefix_threshold fastdllm_dual_threshold bd3lm; grid ``factorial`` = the 24 ``abl_*``
cells of cache x parallel x stop_at_eos x block size. ``bd3lm`` runs its block-causal model from
--bd3-model and is skipped with a message without it.

Outputs under --out: ``<strategy>.jsonl``, one line per sample (id, strategy, config hash,
prompt length, output, extracted answer, target, correct, nfe, positions computed, tokens until
EOS, seconds, seed, ...) appended batch by batch; a rerun skips the ids already written (a
different config for the same strategy and --out is refused). Multi-process runs write
``<strategy>.rank{r}.jsonl`` and rank 0 merges them. ``config.json`` (git SHA + every
strategy's config), then the report of experiments/report.py: table.md / table.csv /
table.json, pareto.png, ablation.md / ablation.csv.

Throughput = generated tokens up to and including the first EOS / wall-clock seconds of the
sampler calls (each batch's time divided among its rows), the same for every strategy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from tqdm import tqdm

from dlm import distributed
from dlm.sampling import eos_ids
from dlm.tasks import (Problem, extract_flexible, extract_strict, fewshot_examples,
                       generate_problems, is_correct, load_gsm8k, sample_shots)
from dlm.tasks.evaluate import left_pad
from experiments.common import (REPO, JsonlLog, arith_config_of, atomic_write_text, config_hash, decode_until_stop,
                                encode_question, git_sha, merge_logs, rank_log_path, rank_log_paths,
                                read_jsonl, repo_relative)
from experiments.strategies import GRIDS, STRATEGIES, SamplerCall, Settings, Strategy, build_call, resolve

DEFAULT_MODEL = REPO / "results" / "checkpoints" / "llada-arith"
DEFAULT_ARITH_N = 500
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


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
    strategies: tuple[Strategy, ...]
    settings: Settings
    baseline: str
    bd3_model: Optional[str]
    device: str
    dtype: str
    threads: Optional[int]


@dataclass(frozen=True)
class Loaded:
    """A model with its tokenizer; ``bd3`` is the BD3Config of a block-causal model."""

    model: torch.nn.Module
    tokenizer: object
    source: str
    bd3: object = None
    weights: Optional[str] = None  # dlm.checkpoints.weights_fingerprint of the checkpoint


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.gsm8k", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(DEFAULT_MODEL),
                   help="checkpoint directory or hub id for dlm.load_model (default: the embedded "
                        "results/checkpoints/llada-arith)")
    p.add_argument("--bd3-model", default=None,
                   help="BD3-LM checkpoint (bd3lm.BD3LM.load) for the bd3lm strategy; without it "
                        "bd3lm is skipped")
    p.add_argument("--data", default="arith",
                   help="'arith' (held-out embedded task), 'gsm8k' (Hub openai/gsm8k test) or a "
                        "local GSM8K jsonl path (default: arith)")
    p.add_argument("--num-fewshot", type=int, default=0, help="worked examples before each question (default 0)")
    p.add_argument("--limit", type=int, default=None,
                   help=f"first N problems (default: all of GSM8K; {DEFAULT_ARITH_N} for arith)")
    p.add_argument("--batch-size", type=int, default=32, help="prompts per sampler call (default 32)")
    p.add_argument("--seed", type=int, default=0, help="problem set, few-shot draw and sampler noise seed")
    p.add_argument("--no-chat-template", action="store_true",
                   help="use the plain 'Question: ...\\nAnswer:' prompt even if the tokenizer has a chat template")
    p.add_argument("--strategies", nargs="+", default=["table1"],
                   help=f"strategy names or grids {sorted(GRIDS)} (default: table1); known strategies: "
                        + " ".join(STRATEGIES))
    p.add_argument("--baseline", default="baseline_semiar",
                   help="row the report's speed-up is relative to (default baseline_semiar)")
    p.add_argument("--gen-length", type=int, default=256, help="generated columns (default 256)")
    p.add_argument("--block-length", type=int, default=32, help="semi-AR block length (default 32)")
    p.add_argument("--steps", type=int, default=None,
                   help="denoising steps of the top-k schedule (default: gen length, one token per step)")
    p.add_argument("--threshold", type=float, default=0.9, help="Fast-dLLM threshold rule tau (default 0.9)")
    p.add_argument("--factor", type=float, default=1.0, help="Fast-dLLM factor rule f (default 1.0)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--out", default=None, help="results directory (default results/gsm8k_<data>)")
    p.add_argument("--device", default=None, help="torch device (default: cuda[:LOCAL_RANK] if available, else cpu)")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                   help="parameter dtype (default auto: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    return p


def _data_tag(data: str) -> str:
    return data if data in ("arith", "gsm8k") else Path(data).stem


def parse_config(argv=None) -> HarnessConfig:
    """Parse and validate the command line; bad values raise ValueError naming the flag."""
    a = build_parser().parse_args(argv)
    if a.limit is not None and a.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {a.limit}")
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
    try:
        strategies = tuple(resolve(a.strategies))
    except ValueError as e:
        raise ValueError(f"--{e}") from None
    if a.baseline not in STRATEGIES:
        raise ValueError(f"--baseline must be a known strategy, got {a.baseline!r}")
    settings = Settings(a.gen_length, a.block_length, a.steps, a.threshold, a.factor, a.temperature)
    for s in strategies:
        if s.kind != "bd3lm":
            build_call(s, settings)  # layout errors before any model is loaded
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(a.out) if a.out else REPO / "results" / f"gsm8k_{_data_tag(a.data)}"
    return HarnessConfig(a.model, a.data, a.num_fewshot, a.limit, a.batch_size, a.seed,
                         not a.no_chat_template, out, strategies, settings, a.baseline, a.bd3_model,
                         device, a.dtype, a.threads)


# --------------------------------------------------------------------------------------- data
def load_problems(cfg: HarnessConfig) -> list[Problem]:
    """The evaluation problems of --data, in a fixed order (ids are stable across --limit)."""
    if cfg.data == "arith":
        n = DEFAULT_ARITH_N if cfg.limit is None else cfg.limit
        return generate_problems(arith_config_of(cfg.model), n, split="test", seed=cfg.seed)
    problems = load_gsm8k("openai/gsm8k" if cfg.data == "gsm8k" else cfg.data, split="test")
    if not problems:
        raise ValueError(f"--data {cfg.data}: no problems")
    return problems if cfg.limit is None else problems[:cfg.limit]


def load_shots(cfg: HarnessConfig) -> list[Problem]:
    """--num-fewshot worked examples (one fixed draw, never from the evaluation split)."""
    k = cfg.num_fewshot
    if k == 0:
        return []
    if cfg.data == "arith":
        return fewshot_examples(arith_config_of(cfg.model), k, seed=cfg.seed + 1)
    if cfg.data == "gsm8k":
        pool = load_gsm8k("openai/gsm8k", split="train")
    else:
        train = Path(cfg.data).with_name("train.jsonl")
        if not train.is_file():
            raise ValueError(f"--num-fewshot {k} needs {train} beside --data for the examples")
        pool = load_gsm8k(train, split="train")
    return sample_shots(pool, k, seed=cfg.seed)


# ------------------------------------------------------------------------------------- models
def load_models(cfg: HarnessConfig, strategies, device: torch.device) -> tuple[Optional[Loaded], Optional[Loaded]]:
    """The --model (for baseline / fastdllm strategies) and --bd3-model (for bd3lm) it needs."""
    from dlm.checkpoints import load_model, weights_fingerprint

    main = bd3 = None
    auto = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = auto if cfg.dtype == "auto" else DTYPES[cfg.dtype]
    if any(s.kind != "bd3lm" for s in strategies):
        model, tok = load_model(cfg.model, dtype=dtype, device=device)
        if tok is None:
            raise ValueError(f"--model {cfg.model} has no tokenizer files")
        main = Loaded(model, tok, repo_relative(cfg.model), weights=weights_fingerprint(cfg.model))
    if any(s.kind == "bd3lm" for s in strategies):
        from bd3lm import BD3LM

        wrapper, tok = BD3LM.load(cfg.bd3_model, dtype=dtype, device=device)
        if tok is None:
            raise ValueError(f"--bd3-model {cfg.bd3_model} has no tokenizer files")
        bd3 = Loaded(wrapper.model.eval(), tok, repo_relative(cfg.bd3_model), wrapper.bd3_config,
                     weights_fingerprint(cfg.bd3_model))
    return main, bd3


# --------------------------------------------------------------------------------------- jobs
@dataclass(frozen=True)
class Job:
    """Everything one strategy needs, validated before any compute."""

    strategy: Strategy
    loaded: Loaded
    call: SamplerCall
    config: dict
    config_hash: str
    prompts: tuple  # per problem: tuple of token ids


def make_job(strategy: Strategy, loaded: Loaded, cfg: HarnessConfig, problems, shots) -> Job:
    call = build_call(strategy, cfg.settings, loaded.bd3)
    tok = loaded.tokenizer
    chat = cfg.chat_template and bool(getattr(tok, "chat_template", None))
    prompts = tuple(tuple(encode_question(tok, p.question, shots, chat)) for p in problems)
    longest = max(len(x) for x in prompts)
    limit = loaded.model.config.max_seq_len
    if longest + cfg.settings.gen_length > limit:
        raise ValueError(f"--num-fewshot {cfg.num_fewshot} / --gen-length {cfg.settings.gen_length}: the "
                         f"longest prompt ({longest} tokens) + gen length exceeds max_seq_len={limit} "
                         f"of {loaded.source}")
    config = {"strategy": asdict(strategy), "settings": asdict(cfg.settings),
              "sampler": f"{call.fn.__module__}.{call.fn.__name__}", "sampler_kwargs": call.kwargs,
              "model": str(loaded.source), "data": cfg.data, "num_fewshot": cfg.num_fewshot,
              "chat_template": chat, "seed": cfg.seed, "dtype": cfg.dtype}
    return Job(strategy, loaded, call, config, config_hash(config), prompts)


def existing_records(path: Path) -> dict[str, dict]:
    """id -> record over ``path`` and its per-rank logs."""
    out: dict[str, dict] = {}
    for src in [path, *rank_log_paths(path)]:
        for r in read_jsonl(src):
            out.setdefault(r["id"], r)
    return out


def check_resumable(job: Job, path: Path) -> dict[str, dict]:
    done = existing_records(path)
    other = {r.get("config_hash") for r in done.values()} - {job.config_hash}
    if other:
        raise ValueError(f"--out: {path} holds {job.strategy.name} results with config hash(es) "
                         f"{sorted(map(str, other))}, this run's is {job.config_hash}; use another --out")
    # the config names the model by path; a retrained checkpoint at the same path must not be
    # resumed into old samples (records from before weights were recorded carry none)
    weights = {r["model_weights"] for r in done.values() if r.get("model_weights")} - {job.loaded.weights}
    if weights and job.loaded.weights is not None:
        raise ValueError(f"--out: {path} holds {job.strategy.name} samples of other weights {sorted(weights)} "
                         f"at {job.loaded.source} (now {job.loaded.weights}): the checkpoint changed; "
                         f"delete that file or use another --out")
    return done


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _records(job: Job, problems, idx: list[int], out, mask, seconds: float, done: dict, cfg, sha: str,
             factors: dict) -> list[dict]:
    """Per-sample records of one sampler call over the rows ``idx`` (ids already done skipped)."""
    tok, stop = job.loaded.tokenizer, eos_ids(job.loaded.model)
    P, st = mask.shape[1], out.stats
    first_eos = st.first_eos_step if st.first_eos_step is not None else torch.full((len(idx),), -1)
    records = []
    for row, i in enumerate(idx):
        p = problems[i]
        if p.id in done:
            continue
        text = decode_until_stop(tok, out.sequences[row, P:].tolist(), stop)
        records.append({
            "id": p.id, "index": i, "strategy": job.strategy.name, "config_hash": job.config_hash,
            "seed": cfg.seed, "prompt_length": int(mask[row].sum()), "output": text,
            "extracted": extract_strict(text), "extracted_flexible": extract_flexible(text),
            "target": p.target_str, "correct": bool(is_correct(text, p.target)),
            "correct_flexible": bool(is_correct(text, p.target, mode="flexible")),
            "nfe": st.nfe, "positions_computed": st.positions_computed,
            "tokens_until_eos": int(st.tokens_until_eos[row]), "tokens_committed": st.tokens_committed,
            "steps": st.steps, "first_eos_step": int(first_eos[row]), "seconds": seconds,
            "batch_rows": len(idx), "factors": factors, "git_sha": sha, "model_weights": job.loaded.weights})
    return records


def run_job(job: Job, problems, cfg: HarnessConfig, info, clock: Callable[[], float], sha: str) -> None:
    """Run one strategy over this rank's share of ``problems``, appending to its JSONL log."""
    name = job.strategy.name
    path = cfg.out / f"{name}.jsonl"
    done = check_resumable(job, path)
    log = JsonlLog(rank_log_path(path, info.rank) if info.enabled else path)
    mine = [i for i in range(len(problems)) if i % info.world_size == info.rank]
    model, tok = job.loaded.model, job.loaded.tokenizer
    device = next(model.parameters()).device
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    bd3 = job.loaded.bd3
    factors = job.strategy.factors(cfg.settings, None if bd3 is None else bd3.block_size)
    old = [done[problems[i].id] for i in mine if problems[i].id in done]
    tally = {"n": len(old), "correct": sum(r["correct"] for r in old),
             "tokens": sum(r["tokens_until_eos"] for r in old), "seconds": sum(r["seconds"] for r in old)}
    bar = tqdm(total=len(mine), initial=len(old), desc=name, disable=not info.is_main, dynamic_ncols=True)
    for lo in range(0, len(mine), cfg.batch_size):
        idx = mine[lo:lo + cfg.batch_size]
        if all(problems[i].id in done or problems[i].id in log.done for i in idx):
            continue  # whole batch recorded (a partly recorded batch is rerun as the same batch)
        ids, mask = left_pad([list(job.prompts[i]) for i in idx], pad)  # (b, P) each
        ids, mask = ids.to(device), mask.to(device)
        gen = torch.Generator(device=device).manual_seed(cfg.seed * 1_000_003 + idx[0])
        _sync(device)
        t0 = clock()
        out = job.call(model, ids, mask, gen)  # sequences (b, P + G)
        _sync(device)
        seconds = (clock() - t0) / len(idx)
        fresh = [r for r in _records(job, problems, idx, out, mask, seconds, done, cfg, sha, factors)
                 if r["id"] not in log.done]
        log.append(fresh)
        for r in fresh:
            tally["n"] += 1
            tally["correct"] += r["correct"]
            tally["tokens"] += r["tokens_until_eos"]
            tally["seconds"] += r["seconds"]
        bar.update(len(fresh))
        bar.set_postfix(acc=f"{tally['correct'] / max(tally['n'], 1):.3f}",
                        tok_s=f"{tally['tokens'] / max(tally['seconds'], 1e-9):.1f}")
    bar.close()
    distributed.barrier(info)
    if info.is_main and (info.enabled or rank_log_paths(path)):
        merge_logs(path, rank_log_paths(path))


def write_config(cfg: HarnessConfig, jobs: list[Job], sha: str) -> None:
    path = cfg.out / "config.json"
    prev = json.loads(path.read_text()) if path.is_file() else {}
    strategies = dict(prev.get("strategies", {}))
    for j in jobs:
        strategies[j.strategy.name] = {"config_hash": j.config_hash, "config": j.config,
                                       "model_weights": j.loaded.weights}
    meta = {"git_sha": sha, "argv": sys.argv[1:], "baseline": cfg.baseline, "strategies": strategies}
    atomic_write_text(path, json.dumps(meta, indent=2, default=str) + "\n")


def run(cfg: HarnessConfig, clock: Callable[[], float] = time.perf_counter) -> list[str]:
    """Run every strategy of ``cfg`` (resumable) and rebuild the report; returns the strategies run.

    ``clock`` times the sampler calls (tests pass a fake clock for reproducible tables)."""
    info = distributed.init()
    try:
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        device = torch.device(cfg.device)
        if info.enabled and device.type == "cuda":
            device = torch.device("cuda", info.local_rank)
        problems, shots = load_problems(cfg), load_shots(cfg)
        strategies = list(cfg.strategies)
        if cfg.bd3_model is None and any(s.kind == "bd3lm" for s in strategies):
            if info.is_main:
                print("bd3lm: skipped (no --bd3-model given)", file=sys.stderr)
            strategies = [s for s in strategies if s.kind != "bd3lm"]
        main_model, bd3_model = load_models(cfg, strategies, device)
        jobs = [make_job(s, bd3_model if s.kind == "bd3lm" else main_model, cfg, problems, shots)
                for s in strategies]
        for j in jobs:
            check_resumable(j, cfg.out / f"{j.strategy.name}.jsonl")
        sha = git_sha()
        if info.is_main:
            write_config(cfg, jobs, sha)
        for j in jobs:
            run_job(j, problems, cfg, info, clock, sha)
        distributed.barrier(info)
        if info.is_main and jobs:
            from experiments.report import build_report

            print(build_report(cfg.out, baseline=cfg.baseline).table_md)
        return [j.strategy.name for j in jobs]
    finally:
        distributed.cleanup()


def main(argv=None) -> None:
    run(parse_config(argv))


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:
        sys.exit(f"error: {e}")
