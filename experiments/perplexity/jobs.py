"""Training and evaluation jobs of ``experiments.perplexity`` (see its docstring).

Training: :func:`dlm.train.train` on :class:`bd3lm.BD3Objective` (exact AR NLL for L'=1), with
the data-driven clipping search of BD3-LM sec. 4 for 1 < L' < L; checkpoints exported in bf16.
Evaluation: NELBO perplexity (:func:`bd3lm.perplexity`), LLaDA's MC ELBO
(:func:`dlm.likelihood.mc_loglikelihood`, per test chunk, paired with the NELBO of the chunk) and :func:`nelbo_variance` for Table 2. Every result is
one JSONL record; ids already written are skipped.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from bd3lm import BD3LM, BD3Objective, ClipSchedule, save_bd3
from bd3lm.data import batch_fn, build_dataset, iterate_batches
from bd3lm.loss import bd3_nelbo
from bd3lm.clipping import search_clipping
from bd3lm.schedules import UNCLIPPED, draw_noise
from dlm import distributed
from dlm.likelihood import mc_loglikelihood
from dlm.model import ModelConfig, Transformer
from dlm.train import TrainConfig, train
from harness.results import JsonlLog, config_hash, git_sha, read_jsonl, repo_relative
from experiments.perplexity.config import FIXED_SCHEDULES, RunConfig, locate, locate_tokenizer, model_block

POLL_S = 5  # seconds between checks while another process trains a shared job


# ----------------------------------------------------------------------------------------- data
@dataclass
class Data:
    train: torch.Tensor  # (N_train, L)
    val: torch.Tensor  # (N_val, L) held-out training chunks
    test: torch.Tensor  # (N_test, L)
    ids: object  # bd3lm.data.SpecialIds


def load_data(cfg: RunConfig) -> Data:
    """Train / val / test chunks of the named data (found in the mirror, fingerprints checked first)."""
    d = cfg.data
    train_src, test_src, tokenizer = locate("train", d), locate("test", d), locate_tokenizer(d)
    span = {role: (lo, hi) for role, lo, hi in d.spans}
    chunks, ids = build_dataset(train_src, d.style, tokenizer, d.seq_len, d.train_split, d.max_train_lines,
                                d.hf_config, span=span.get("train"))
    if chunks.shape[0] <= d.val_chunks:
        raise ValueError(f"--train: {chunks.shape[0]} chunks, need more than --val-chunks {d.val_chunks}")
    test, _ = build_dataset(test_src, d.style, tokenizer, d.seq_len, d.test_split, d.max_test_lines, d.hf_config,
                            span=span.get("test"))
    n_val = d.val_chunks
    return Data(chunks[:chunks.shape[0] - n_val], chunks[chunks.shape[0] - n_val:], test, ids)


def new_model(cfg: RunConfig, ids) -> Transformer:
    """Same architecture and init (seed) for every model of the ladder."""
    a = cfg.arch
    mc = ModelConfig(vocab_size=ids.vocab_size, d_model=a.d_model, n_layers=a.n_layers, n_heads=a.n_heads,
                     n_kv_heads=a.n_kv_heads, mlp_hidden=a.mlp_hidden, max_seq_len=cfg.data.seq_len,
                     tie_embeddings=a.tie_embeddings, mask_token_id=ids.mask, eos_token_id=ids.eos,
                     pad_token_id=ids.pad, bos_token_id=ids.bos)
    model = Transformer(mc)
    model.reset_parameters(std=0.02, generator=torch.Generator().manual_seed(cfg.train.seed))
    return model


# ------------------------------------------------------------------------------------------ jobs
@dataclass(frozen=True)
class Job:
    """One training run: ``name`` (record / checkpoint), block size, steps, optional init job and
    fixed schedule (None: exact AR for L'=1, searched clipping for 1 < L' < L, unclipped MDLM)."""

    name: str
    block_size: int
    steps: int
    init: Optional[str] = None
    schedule: Optional[tuple] = None  # (beta, omega)
    export: bool = True


class ARObjective(BD3Objective):
    """BD3-LM eq. 8 at L'=1 with t = 1: every token masked, weight 1, i.e. the exact AR NLL
    (the reference implementation's choice for block size 1; U[0,1] would only add variance)."""

    def __call__(self, model, batch, generator):
        out = bd3_nelbo(model, batch, 1, generator=generator, fixed_t=1.0, backend=self.backend)
        return out.loss, {"nelbo": out.loss.detach()}


#: the suffix of a model's raw-weights checkpoint when it trained with an EMA (``--ema``)
RAW = "-raw"


def var_label(beta: float, omega: float) -> str:
    return f"{beta:g}-{omega:g}"


def plan_jobs(cfg: RunConfig) -> list[Job]:
    """Training jobs of this process, dependencies first (``ar`` before ``mdlm-base``, so that a
    second process can train the shared MDLM meanwhile)."""
    L, t = cfg.data.seq_len, cfg.train
    jobs = [Job("ar", 1, t.steps)] if "ar" in cfg.models else []
    if t.finetune_from_mdlm and any(m != "ar" for m in cfg.models):
        jobs.append(Job("mdlm-base", L, t.steps - t.finetune_steps, export=False))
    for m in cfg.models:
        if m != "ar":
            ft = t.finetune_from_mdlm
            jobs.append(Job(m, model_block(m, L), t.finetune_steps if ft else t.steps, "mdlm-base" if ft else None))
    if t.var_finetune_steps:
        for m in cfg.var_models:
            if m in cfg.models:
                k, n = model_block(m, L), t.var_finetune_steps
                jobs += [Job(f"{m}@{var_label(b, o)}", k, n, m, (b, o), False) for _, b, o in FIXED_SCHEDULES]
                jobs.append(Job(f"{m}@searched", k, n, m, None, False))
    return jobs


class Paths:
    def __init__(self, cfg: RunConfig) -> None:
        self.cfg, self.out, self.work = cfg, Path(cfg.out), Path(cfg.work)
        self.jsonl = self.out / f"perplexity_{cfg.run}.jsonl"

    def checkpoint(self, job_name: str) -> Path:
        if "@" in job_name or job_name == "mdlm-base":
            return self.work / job_name / "model"
        return self.out / "checkpoints" / f"perplexity-{self.cfg.run}-{job_name}"


def _record(cfg: RunConfig, rid: str, kind: str, **fields) -> dict:
    return {"id": rid, "kind": kind, "run": cfg.run, "config_hash": config_hash(cfg.identity()),
            "git_sha": git_sha(), "seed": cfg.train.seed, "eval_seed": cfg.eval.seed, **fields}


def differences(old, new, prefix: str = "") -> list[str]:
    """``key old -> new`` for every leaf where two nested dicts differ (dotted keys)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new), key=str)
                for d in differences(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [f"{prefix.rstrip('.')} {json.dumps(old)} -> {json.dumps(new)}"]


def open_log(cfg: RunConfig, paths: Paths) -> JsonlLog:
    """The run's JSONL; a config record first; a different config under the same --run is refused,
    saying what differs."""
    log = JsonlLog(paths.jsonl, shared=True)  # several --models processes append to one run
    h = config_hash(cfg.identity())
    other = [r for r in log.records if r.get("kind") == "config" and r["config_hash"] != h]
    if other:
        log.close()
        diff = differences(other[0].get("config", {}), json.loads(json.dumps(cfg.identity())))  # tuples: lists
        legacy = all(d.startswith(("data.train ", "data.test ", "data.fingerprints")) for d in diff)
        raise ValueError(
            f"--run {cfg.run}: {paths.jsonl} holds results of config {other[0]['config_hash']}, this one is {h}: "
            + "; ".join(diff[:8]) + (f" (and {len(diff) - 8} more)" if len(diff) > 8 else "") + ". "
            + ("These results name their data by path (recorded before datasets were named): convert them once "
               f"with python -m research.convert_perplexity_v2 {paths.jsonl}" if legacy else
               "Run this config under another --run, or give the recorded config's values"))
    log.append([_record(cfg, "config", "config", config=cfg.identity())])
    return log


def eval_ids(name: str, cfg: RunConfig) -> list[str]:
    """Record ids :func:`eval_model` writes for ``name``."""
    ids = [f"ppl/{name}"] + ([f"ppl_raw/{name}"] if cfg.train.ema > 0 else []) + (["mc/mdlm"] if name == "mdlm" else [])
    if name in cfg.var_models:
        labels = [label for label, _, _ in FIXED_SCHEDULES] + ["searched"]
        ids += [f"search/{name}"] + [f"var/{name}/{label}" for label in labels]
    return ids


def pending(cfg: RunConfig, paths: Paths) -> list[str]:
    """Record ids this command would still compute: none when every result of this config is
    recorded (then neither the data nor the models are needed). A recorded training job whose
    exported checkpoint is missing is refused (``train`` / ``all``)."""
    done = {r["id"] for r in read_jsonl(paths.jsonl)}
    ids = []
    for job in plan_jobs(cfg) if cfg.command in ("all", "train") else []:
        rid, ckpt = f"train/{job.name}", paths.checkpoint(job.name)
        if rid in done and job.export and not ckpt.is_dir():
            raise ValueError(f"{job.name}: recorded in {paths.jsonl} but {ckpt} is missing; delete its '{rid}' "
                             "line to retrain")
        ids.append(rid)
    if cfg.command in ("all", "eval"):
        ids += [i for name in cfg.models for i in eval_ids(name, cfg)]
    return [i for i in ids if i not in done]


def _claim(lock: Path) -> bool:
    """Create ``lock`` (with our pid); a lock left by a dead process is taken over."""
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            os.kill(int(lock.read_text() or 0), 0)
            return False
        except (ProcessLookupError, ValueError):
            lock.unlink(missing_ok=True)
            return _claim(lock)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def _my_turn(rid: str, lock: Path, paths: Paths, distributed_run: bool) -> bool:
    """True when this process should train ``rid`` (holding ``lock``); False once it is recorded.
    Processes splitting --models wait here for a shared dependency (``mdlm-base``)."""
    done = lambda: rid in {r["id"] for r in read_jsonl(paths.jsonl)}  # noqa: E731
    while not done():
        if distributed_run:
            return True
        if _claim(lock):
            if done():
                lock.unlink(missing_ok=True)
                return False
            return True
        print(f"[perplexity] waiting for another process to finish {lock.parent.name} ({lock})", flush=True)
        time.sleep(POLL_S)
    return False


def train_job(job: Job, cfg: RunConfig, data: Data, paths: Paths, log: JsonlLog) -> None:
    """Train one job (resuming its trainer state), export it and append its ``train/`` record."""
    rid = f"train/{job.name}"
    info = distributed.init()
    ckpt = paths.checkpoint(job.name)
    workdir = paths.work / job.name
    workdir.mkdir(parents=True, exist_ok=True)
    lock = workdir / "LOCK"
    if not _my_turn(rid, lock, paths, info.enabled):
        if not ckpt.is_dir():
            raise ValueError(f"{job.name}: recorded in {paths.jsonl} but {ckpt} is missing; delete "
                             f"its '{rid}' line to retrain")
        return
    try:
        t, L = cfg.train, cfg.data.seq_len
        if job.init is None:
            model = new_model(cfg, data.ids)
        else:
            model = BD3LM.load(paths.checkpoint(job.init))[0].model
        model.to(cfg.device)
        schedule = ClipSchedule(*job.schedule) if job.schedule else UNCLIPPED
        search = job.schedule is None and t.clip_search and 1 < job.block_size < L
        if job.name.endswith("@searched"):  # Table 2: the variance-minimising clipping, fixed
            res = search_clipping(model, _batches(data.val, cfg), job.block_size, t.grid,
                                  _gen(cfg, 1))  # as the eval-time search/<name>: same schedule
            schedule, search = res.schedule, False
        bd3 = BD3LM(model, job.block_size, schedule)
        objective = ARObjective(1) if job.block_size == 1 else bd3.objective
        tc = TrainConfig(out_dir=str(workdir), max_steps=job.steps, batch_size=t.batch_size,
                         micro_batch_size=t.micro_batch_size, lr=t.lr, warmup_steps=min(t.warmup, job.steps),
                         min_lr_ratio=t.min_lr_ratio, weight_decay=t.weight_decay, betas=tuple(t.betas),
                         grad_clip=t.grad_clip, ema_decay=t.ema, eval_every=t.search_every if search else 0,
                         save_every=max(job.steps // 4, 1), log_every=max(1, min(25, job.steps // 10)),
                         seed=t.seed, precision=t.precision)
        dtype = torch.bfloat16 if job.export else None
        eval_fn = bd3.eval_fn(_batches(data.val[:t.search_chunks], cfg), grid=t.grid) if search else None
        t0, c0 = time.perf_counter(), time.process_time()
        res = train(model, objective, batch_fn(data.train, t.batch_size), tc, eval_fn=eval_fn,
                    save_fn=lambda m, tok, d: save_bd3(m, None, d, bd3.bd3_config, dtype))
        if not info.is_main:
            return
        if job.export:
            tmp = ckpt.with_name(f".{ckpt.name}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(workdir / "model", tmp)
            shutil.rmtree(ckpt, ignore_errors=True)
            os.replace(tmp, ckpt)
            if t.ema > 0:  # the exported model holds the EMA weights; the raw ones are evaluated beside them
                raw = paths.checkpoint(f"{job.name}{RAW}")
                save_bd3(model, None, raw.with_name(f".{raw.name}.tmp"), bd3.bd3_config, dtype)
                shutil.rmtree(raw, ignore_errors=True)
                os.replace(raw.with_name(f".{raw.name}.tmp"), raw)
        s = bd3.schedule
        log.append([_record(cfg, rid, "train", model=job.name, block_size=job.block_size, steps=job.steps,
                            init=job.init, beta=s.beta, omega=s.omega, checkpoint=repo_relative(ckpt),
                            train_loss=res.train_metrics.get("loss"), wall_s=time.perf_counter() - t0,
                            cpu_s=time.process_time() - c0, tokens=job.steps * t.batch_size * L)])
    finally:
        if not info.enabled:
            lock.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------ eval
def _batches(chunks: torch.Tensor, cfg: RunConfig, limit: Optional[int] = None) -> list[dict]:
    chunks = chunks if limit is None else chunks[:limit]
    return [{k: v.to(cfg.device) for k, v in b.items()} for b in iterate_batches(chunks, cfg.eval.batch_size)]


def _gen(cfg: RunConfig, salt: int = 0) -> torch.Generator:
    return torch.Generator(device=cfg.device).manual_seed(cfg.eval.seed + salt)


def load_bd3(name: str, paths: Paths, cfg: RunConfig) -> BD3LM:
    path = paths.checkpoint(name)
    if not path.is_dir():
        raise ValueError(f"{name}: no checkpoint at {path}; run `train` first")
    return BD3LM.load(path, dtype=torch.float32, device=cfg.device)[0].eval()


@torch.no_grad()
def nelbo_variance(model, batches: list[dict], block_size: int, schedule: ClipSchedule,
                   generator: torch.Generator) -> dict:
    """Var(NELBO) under ``schedule``: mean over batches of the variance of the per-(sequence,
    block) NELBO means (BD3-LM sec. 4; the statistic :func:`search_clipping` minimises), plus the
    clipped estimate in nats/token (biased unless U[0,1]). The noise (u, token uniforms) depends
    only on ``generator`` and the batch, so every schedule sees common random numbers."""
    vs, nats, toks = [], 0.0, 0
    for b in batches:
        ids = b["input_ids"]  # (B, L)
        noise = draw_noise(ids.shape[0], ids.shape[1], block_size, UNCLIPPED, generator, ids.device)
        out = bd3_nelbo(model, b, block_size, schedule=schedule, noise=noise)
        vs.append(float(out.block_terms.flatten().double().var()))  # (B * L / L',) -> scalar
        nats, toks = nats + float(out.total), toks + int(out.n_tokens)
    return {"var_nelbo": sum(vs) / len(vs), "clipped_nelbo": nats / toks, "batches": len(vs)}


@torch.no_grad()
def chunk_nelbo(bd3: BD3LM, batches: list[dict], reps: int, generator: torch.Generator) -> list[float]:
    """Per chunk (row), the BD3-LM NELBO in nats (unclipped U[0,1], low-discrepancy t over each
    batch), averaged over ``reps`` passes with fresh noise; the first pass is ``bd3.perplexity``'s."""
    sums: Optional[list] = None
    for _ in range(reps):
        rows = [bd3_nelbo(bd3.model, b, bd3.block_size, schedule=UNCLIPPED, generator=generator,
                          backend=bd3.backend).terms.sum(-1).double().cpu() for b in batches]  # (B,) each
        sums = rows if sums is None else [a + r for a, r in zip(sums, rows)]
    return [float(x) / reps for x in torch.cat(sums)]


def eval_model(name: str, cfg: RunConfig, data: Data, paths: Paths, log: JsonlLog) -> None:
    """``ppl/<name>``, ``mc/mdlm`` and the ``var/<name>/...`` rows of Table 2."""
    L, e = cfg.data.seq_len, cfg.eval
    test = _batches(data.test, cfg, e.eval_chunks)
    if f"ppl/{name}" not in log.done:
        bd3, t0 = load_bd3(name, paths, cfg), time.perf_counter()
        r = bd3.perplexity(test, _gen(cfg), exact_ar=bd3.block_size == 1, passes=e.passes)
        log.append([_record(cfg, f"ppl/{name}", "ppl", model=name, block_size=bd3.block_size, **r.to_dict(),
                            seconds=time.perf_counter() - t0)])
    if cfg.train.ema > 0 and f"ppl_raw/{name}" not in log.done:  # the same run without its EMA
        bd3, t0 = load_bd3(f"{name}{RAW}", paths, cfg), time.perf_counter()
        r = bd3.perplexity(test, _gen(cfg), exact_ar=bd3.block_size == 1, passes=e.passes)
        log.append([_record(cfg, f"ppl_raw/{name}", "ppl_raw", model=name, block_size=bd3.block_size, **r.to_dict(),
                            seconds=time.perf_counter() - t0)])
    if name == "mdlm" and "mc/mdlm" not in log.done:
        bd3, t0 = load_bd3(name, paths, cfg), time.perf_counter()
        sub = _batches(data.test, cfg, e.mc_chunks)
        g = torch.Generator().manual_seed(e.seed)  # the MC ELBO draws on the CPU
        mc_nats = [-mc_loglikelihood(bd3.model, torch.zeros(0, dtype=torch.long, device=row.device), row, e.mc_num,
                                     e.mc_batch_size, g, subs=True) for b in sub for row in b["input_ids"]]
        nelbo_nats = chunk_nelbo(bd3, sub, e.mc_num, _gen(cfg))  # same number of draws per chunk
        tokens = L * len(mc_nats)
        mc = {"nelbo": sum(mc_nats) / tokens, "ppl": math.exp(min(sum(mc_nats) / tokens, 700.0)), "tokens": tokens,
              "mc_num": e.mc_num}
        same = sum(nelbo_nats) / tokens
        log.append([_record(cfg, "mc/mdlm", "mc_elbo", model=name, block_size=L, **mc, nelbo_same=same,
                            ppl_same=math.exp(min(same, 700.0)), nelbo_reps=e.mc_num, chunk_mc_nats=mc_nats,
                            chunk_nelbo_nats=nelbo_nats, seconds=time.perf_counter() - t0)])
    if name not in cfg.var_models:
        return
    var_batches = _batches(data.test, cfg, e.var_chunks)
    k = model_block(name, L)
    if f"search/{name}" not in log.done:
        model = load_bd3(name, paths, cfg).model
        res = search_clipping(model, _batches(data.val, cfg), k, cfg.train.grid, _gen(cfg, 1))
        log.append([_record(cfg, f"search/{name}", "search", model=name, block_size=k, **res.to_dict())])
    found = next(r for r in log.records if r["id"] == f"search/{name}")
    rows = [(label, b, o, f"{name}@{var_label(b, o)}") for label, b, o in FIXED_SCHEDULES]
    b, o = found["beta"], found["omega"]
    rows.append((f"searched U[{b:g},{o:g}]", b, o, f"{name}@searched"))
    for label, b, o, ft_name in rows:
        rid = f"var/{name}/{label.split()[0]}"
        if rid in log.done:
            continue
        use = ft_name if cfg.train.var_finetune_steps else name
        bd3, t0 = load_bd3(use, paths, cfg), time.perf_counter()
        stats = nelbo_variance(bd3.model, var_batches, k, ClipSchedule(b, o), _gen(cfg, 2))
        ppl = bd3.perplexity(test, _gen(cfg), passes=e.passes).to_dict() if use != name else \
            next(r for r in log.records if r["id"] == f"ppl/{name}")
        log.append([_record(cfg, rid, "var", model=name, block_size=k, schedule=label, beta=b, omega=o,
                            evaluated=use, trained_under=[bd3.schedule.beta, bd3.schedule.omega],
                            ppl=ppl["ppl"], nelbo=ppl["nelbo"], **stats, seconds=time.perf_counter() - t0)])


