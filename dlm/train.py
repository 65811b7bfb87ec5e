"""One training loop for every objective: AdamW, warm-up + cosine, clipping, EMA, DDP, resume.

``train(model, objective, batches, config)`` optimises ``objective(model, batch, generator)``
(see :mod:`dlm.objectives`). Determinism and resumption rest on *per-step* randomness: the
generators for data, noise and micro-batches at step ``s`` are seeded from ``(config.seed, s)``:
a resumed run needs only the step counter and the model / optimizer / EMA state.

Data: ``batches`` is either ``batch_fn(step, generator) -> dict`` (resumable for free) or an
iterable of dicts (on resume the first ``step`` batches are skipped). Every rank must receive
the same *global* batch of ``config.batch_size`` rows; each rank keeps its contiguous shard and
splits it into micro-batches of ``micro_batch_size`` rows (gradient accumulation). When the
objective defines ``sample_noise``, the noise is drawn once for the global batch before sharding,
so N processes take exactly the optimizer step one process would.

One run per ``out_dir`` (the main process holds its :mod:`dlm.locks` lock; a second run fails at
once naming the first). ``out_dir`` holds ``model/`` (``save_fn`` output, EMA weights when enabled;
temp dir + rename), ``trainer_state.pt`` (tmp file + ``os.replace``) and ``metrics.jsonl``, with
ordinary modes (:mod:`dlm.io`); a full disk is one :class:`dlm.io.DiskFullError` naming the file,
the previous checkpoint intact. At start a killed run's temp files and unheld locks are removed and
``metrics.jsonl`` keeps only records up to the resumed step, so a rerun never logs a step twice.

Resuming never changes the recipe silently: every TrainConfig field but :data:`RESUMABLE_FIELDS`,
plus the caller's ``recipe`` dict (data, objective, model shape, ...: the scripts pass their
flags), must equal the checkpoint's, else ValueError naming each field with both values
(:func:`check_resume`). ``force_recipe=True`` continues with the new values and appends
``{"step", "changed"}`` to the run's ``recipe_changes``, stored with every later checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Optional, Union

import torch
import torch.nn as nn
from torch import Tensor
from tqdm.auto import tqdm

from . import distributed
from .ema import EMA
from .io import atomic_path, remove_leftover_temps, write_dir
from .locks import remove_stale_locks, results_lock
from .recipe import lr_at, param_groups, step_generator
from .resume import (RESUMABLE_FIELDS, as_recipe, check_shapes, flag_recipe,  # noqa: F401
                     check_recipe, trim_metrics)

PRECISIONS = ("fp32", "bf16")
STATE_FILE = "trainer_state.pt"
MODEL_DIR = "model"
METRICS_FILE = "metrics.jsonl"

BatchSource = Union[Callable[[int, torch.Generator], dict], Iterable[dict]]


@dataclass(frozen=True)
class TrainConfig:
    out_dir: str
    max_steps: int
    batch_size: int  # global rows per optimizer step (all ranks, all micro-batches)
    micro_batch_size: Optional[int] = None  # rows per forward on one rank; None = whole shard
    lr: float = 3e-4
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 0
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    adam_eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 = off
    ema_decay: float = 0.0  # 0 = off
    eval_every: int = 0  # 0 = off
    save_every: int = 0  # 0 = only at the end
    log_every: int = 10
    seed: int = 0
    precision: str = "fp32"
    compile: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.out_dir, (str, os.PathLike)) or not str(self.out_dir):
            raise ValueError(f"TrainConfig.out_dir must be a non-empty path, got {self.out_dir!r}")
        object.__setattr__(self, "out_dir", os.fspath(self.out_dir))  # Path -> str (picklable state)
        for name in ("max_steps", "batch_size"):
            _check_int(name, getattr(self, name), minimum=1)
        if self.micro_batch_size is not None:
            _check_int("micro_batch_size", self.micro_batch_size, minimum=1)
            if self.batch_size % self.micro_batch_size:
                raise ValueError(f"TrainConfig.batch_size={self.batch_size} not divisible by "
                                 f"micro_batch_size={self.micro_batch_size}")
        for name in ("warmup_steps", "eval_every", "save_every", "log_every", "seed"):
            _check_int(name, getattr(self, name), minimum=0)
        if self.warmup_steps > self.max_steps:
            raise ValueError(f"TrainConfig.warmup_steps={self.warmup_steps} > max_steps={self.max_steps}")
        _check_float("lr", self.lr, low=0.0, low_open=True)
        _check_float("min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0)
        _check_float("weight_decay", self.weight_decay, low=0.0)
        _check_float("adam_eps", self.adam_eps, low=0.0, low_open=True)
        _check_float("grad_clip", self.grad_clip, low=0.0)
        _check_float("ema_decay", self.ema_decay, low=0.0, high=1.0, high_open=True)
        if not isinstance(self.betas, tuple) or len(self.betas) != 2:
            raise ValueError(f"TrainConfig.betas must be a tuple of two floats, got {self.betas!r}")
        for b in self.betas:
            _check_float("betas", b, low=0.0, high=1.0, high_open=True)
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainConfig.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if not isinstance(self.compile, bool):
            raise TypeError(f"TrainConfig.compile must be a bool, got {self.compile!r}")


def _check_int(name: str, value, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"TrainConfig.{name} must be an int >= {minimum}, got {value!r}")


def _check_float(name: str, value, low: float, high: float = math.inf,
                 low_open: bool = False, high_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        raise ValueError(f"TrainConfig.{name}={value!r} outside {'(' if low_open else '['}{low}, "
                         f"{high}{')' if high_open else ']'}")


@dataclass
class TrainResult:
    step: int  # optimizer steps completed
    train_metrics: dict = field(default_factory=dict)  # last logged training metrics
    eval_metrics: dict = field(default_factory=dict)  # last eval_fn output
    ema: Optional[EMA] = None  # the model itself keeps the raw (non-EMA) weights
    stopped: bool = False  # should_stop ended the run before max_steps


# --------------------------------------------------------------------------------------------
# checkpoint files
# --------------------------------------------------------------------------------------------


def _default_save(model: nn.Module, tokenizer, out_dir: str) -> None:
    from .checkpoints import save_model  # lazy: keeps the trainer importable on its own

    save_model(model, tokenizer, out_dir)


def _atomic_torch_save(obj, path: str) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def check_resume(config: TrainConfig, recipe: Optional[dict] = None, force_recipe: bool = False) -> list[dict]:
    """Check, before anything is built, that a run may resume from ``config.out_dir``.

    The recipe is every TrainConfig field but :data:`RESUMABLE_FIELDS`, plus ``recipe`` (a
    JSON-able dict; the scripts pass :func:`flag_recipe`). Returns the run's recipe changes
    ``[{"step": s, "changed": {name: [checkpoint value, new value]}}]`` ([] for a fresh run), with
    this resume's change appended when ``force_recipe`` allows one; otherwise a change is a
    ValueError naming each differing field and both values. :func:`train` runs the same check.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if not isinstance(force_recipe, bool):
        raise TypeError(f"force_recipe must be a bool, got {force_recipe!r}")
    recipe = as_recipe(recipe)
    path = os.path.join(config.out_dir, STATE_FILE)
    if not os.path.exists(path):
        return []
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return check_recipe(state, config, recipe, force_recipe)


# --------------------------------------------------------------------------------------------
# the loop
# --------------------------------------------------------------------------------------------


def _prepare_batch(batch, config: TrainConfig, device: torch.device) -> dict[str, Tensor]:
    if not isinstance(batch, dict) or not batch:
        raise TypeError(f"each batch must be a non-empty dict of tensors, got {type(batch).__name__}")
    out = {}
    for key, value in batch.items():
        if not isinstance(value, Tensor) or value.dim() == 0 or value.shape[0] != config.batch_size:
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"batch[{key!r}] must be a tensor with {config.batch_size} rows "
                             f"(TrainConfig.batch_size), got {shape}")
        out[key] = value.to(device, non_blocking=True)
    return out


def _batch_stream(batches: BatchSource, start: int, seed: int):
    if callable(batches):
        step = start
        while True:
            yield batches(step, step_generator(seed, step, 0, torch.device("cpu")))
            step += 1
    if not isinstance(batches, Iterable):
        raise TypeError("batches must be batch_fn(step, generator) or an iterable of dicts")
    it = iter(batches)
    for _ in range(start):  # fast-forward past the batches already trained on
        next(it)
    yield from it


def train(
    model: nn.Module,
    objective: Callable,
    batches: BatchSource,
    config: TrainConfig,
    tokenizer=None,
    eval_fn: Optional[Callable[[nn.Module], dict]] = None,
    save_fn: Optional[Callable] = None,
    recipe: Optional[dict] = None,
    force_recipe: bool = False,
    should_stop: Callable[[], bool] | None = None,
) -> TrainResult:
    """Train ``model`` in place for ``config.max_steps`` optimizer steps (resuming from
    ``config.out_dir/trainer_state.pt`` if present) and return a :class:`TrainResult`.

    save_fn(model, tokenizer, dir) exports the model (default ``dlm.checkpoints.save_model``);
    eval_fn(model) -> dict runs on rank 0 under ``no_grad`` on the EMA weights when enabled.
    recipe / force_recipe: see :func:`check_resume` (stored in ``trainer_state.pt``). should_stop()
    (rank 0, after each logged evaluation and at a resume): True ends the run with a checkpoint.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if not isinstance(force_recipe, bool):
        raise TypeError(f"force_recipe must be a bool, got {force_recipe!r}")
    recipe = as_recipe(recipe)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not callable(objective):
        raise TypeError("objective must be callable(model, batch, generator)")
    save_fn = _default_save if save_fn is None else save_fn

    info = distributed.init()
    if info.is_main:
        os.makedirs(config.out_dir, exist_ok=True)
    with results_lock(config.out_dir) if info.is_main else nullcontext():  # one run per out_dir
        return _train(model, objective, batches, config, tokenizer, eval_fn, save_fn, recipe, force_recipe, info,
                      should_stop)


def _train(model, objective, batches, config: TrainConfig, tokenizer, eval_fn, save_fn, recipe, force_recipe,
           info, should_stop=None) -> TrainResult:
    """:func:`train` after its checks, the main process holding the lock of ``config.out_dir``."""
    per_rank, rem = divmod(config.batch_size, info.world_size)
    micro = config.micro_batch_size or per_rank
    if rem or per_rank % micro:
        raise ValueError(f"TrainConfig.batch_size={config.batch_size} must split into world_size="
                         f"{info.world_size} shards of micro_batch_size={micro} rows")
    accum = per_rank // micro
    device = distributed.device_for(info, model)
    model.to(device)
    model.train()

    optimizer = torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.lr,
                                  betas=config.betas, eps=config.adam_eps)
    ema = EMA(model, config.ema_decay) if config.ema_decay > 0 else None
    out_dir = str(config.out_dir)
    state_path = os.path.join(out_dir, STATE_FILE)
    metrics_path = os.path.join(out_dir, METRICS_FILE)
    if info.is_main:
        removed = remove_leftover_temps(out_dir) + remove_stale_locks(out_dir)
        if removed:
            print(f"{out_dir}: removed temp files of an interrupted run: {', '.join(removed)}")
    distributed.barrier(info)

    step, tokens_seen, recipe_changes = 0, 0, []
    if os.path.exists(state_path):
        state = torch.load(state_path, map_location=device, weights_only=True)
        recipe_changes = check_recipe(state, config, recipe, force_recipe)
        check_shapes(state["model"], model, out_dir)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        for i, group in enumerate(optimizer.param_groups):  # a forced change of these takes effect
            group.update(betas=config.betas, eps=config.adam_eps, weight_decay=config.weight_decay if i == 0 else 0.0)
        if ema is not None and state.get("ema") is not None:
            ema.load_state_dict(state["ema"])
        elif ema is not None:  # EMA switched on by a forced change: it starts at the resumed weights
            ema = EMA(model, config.ema_decay)
        step, tokens_seen = state["step"], state["tokens_seen"]
    if info.is_main:
        trim_metrics(metrics_path, step)

    fwd = distributed.wrap(model, info)
    if config.compile:
        fwd = torch.compile(fwd)
    use_bf16 = config.precision == "bf16"
    sample_noise = getattr(objective, "sample_noise", None)

    def checkpoint() -> None:
        if info.is_main:
            if ema is None:
                write_dir(os.path.join(out_dir, MODEL_DIR), lambda d: save_fn(model, tokenizer, d))
            else:
                with ema.applied_to(model):
                    write_dir(os.path.join(out_dir, MODEL_DIR), lambda d: save_fn(model, tokenizer, d))
            _atomic_torch_save({
                "step": step, "tokens_seen": tokens_seen, "config": asdict(config),
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "ema": None if ema is None else ema.state_dict(),
                "world_size": info.world_size, "recipe": recipe, "recipe_changes": recipe_changes,
            }, state_path)
        distributed.barrier(info)

    def evaluate() -> dict:
        metrics = {}
        if info.is_main and eval_fn is not None:
            model.eval()
            with torch.no_grad():
                if ema is None:
                    metrics = dict(eval_fn(model))
                else:
                    with ema.applied_to(model):
                        metrics = dict(eval_fn(model))
            model.train()
        distributed.barrier(info)
        return metrics

    def stop() -> bool:  # rank 0 decides, every rank follows
        flag = float(info.is_main and should_stop is not None and should_stop())
        return bool(distributed.all_reduce_mean(torch.tensor([flag], device=device), info).item() > 0)

    def log(record: dict) -> None:
        if info.is_main:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(record) + "\n")

    result = TrainResult(step=step, ema=ema)
    stream = _batch_stream(batches, step, config.seed)
    bar = tqdm(total=config.max_steps, initial=step, disable=not info.is_main, dynamic_ncols=True)
    sums: dict[str, Tensor] = {}
    n_summed, t_last, tokens_last = 0, time.perf_counter(), tokens_seen
    stopped = step > 0 and stop()  # a run that stopped early stays stopped when rerun
    try:  # the bar ends its line even when a step fails, so an error starts a line of its own
        while step < config.max_steps and not stopped:
            lr = lr_at(step, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            try:
                batch = _prepare_batch(next(stream), config, device)
            except StopIteration:
                raise ValueError(f"batches ran out after {step} steps (max_steps={config.max_steps})") from None
            if "input_ids" in batch:
                tokens_seen += batch["input_ids"].numel()
            if sample_noise is not None:
                noise = sample_noise(batch, step_generator(config.seed, step, 1, device))
                clash = set(noise) & set(batch)
                if clash:
                    raise ValueError(f"objective noise keys {sorted(clash)} collide with batch keys")
                batch.update(noise)
            shard = distributed.shard_rows(batch, info)

            for k in range(accum):
                mb = {key: v[k * micro:(k + 1) * micro] for key, v in shard.items()}
                g = step_generator(config.seed, step, 2 + info.rank * accum + k, device)
                defer_sync = info.enabled and k < accum - 1
                with fwd.no_sync() if defer_sync else nullcontext():
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                        loss, metrics = objective(fwd, mb, g)
                    (loss / accum).backward()
                for name, value in {"loss": loss, **metrics}.items():
                    value = torch.as_tensor(value, dtype=torch.float32).detach().to(device)
                    sums[name] = sums.get(name, 0.0) + value / accum
            grad_norm = torch.nn.utils.clip_grad_norm_(
                model.parameters(), config.grad_clip if config.grad_clip > 0 else math.inf)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if ema is not None:
                ema.update(model)
            step += 1
            n_summed += 1
            bar.update(1)

            if config.log_every and (step % config.log_every == 0 or step == config.max_steps):
                names = sorted(sums)
                values = distributed.all_reduce_mean(torch.stack([sums[n] for n in names]), info) / n_summed
                now = time.perf_counter()
                record = {"step": step, "lr": lr, "grad_norm": float(grad_norm),
                          "tokens_per_s": (tokens_seen - tokens_last) / max(now - t_last, 1e-9),
                          **{n: float(v) for n, v in zip(names, values.tolist())}}
                sums, n_summed, t_last, tokens_last = {}, 0, now, tokens_seen
                bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
                log(record)
                result.train_metrics = record
            if config.eval_every and (step % config.eval_every == 0 or step == config.max_steps):
                result.eval_metrics = evaluate()
                if result.eval_metrics:
                    log({"step": step, **{f"eval/{k}": _to_float(v) for k, v in result.eval_metrics.items()}})
                stopped = stop()
            if stopped or step == config.max_steps or (config.save_every and step % config.save_every == 0):
                checkpoint()
    finally:
        bar.close()
    result.step, result.stopped = step, stopped
    return result


def _to_float(v):
    return float(v) if isinstance(v, (int, float, Tensor)) else v
