"""The one evaluation path: a :class:`dlm.spec.Sampler` over GSM8K-format problems,
one record per sample, appended to a resumable log.

:func:`evaluate` left-pads each batch of prompts, decodes it with :func:`dlm.spec.generate`, and writes one
record per problem (the format below) to a :class:`harness.results.JsonlLog`; problems
already in the log are skipped, and samples already there must come from the same config and
weights (:func:`check_resumable`). The GSM8K harness, the testbed, the BD3-LM block-size study
and the training scripts' held-out evaluation all call it.

Record: ``id, index, strategy, config_hash, seed, problem, prompt_length, prediction, extracted,
extracted_flexible, target, correct, correct_flexible, nfe, steps, positions_computed, flops,
tokens_committed, tokens_until_eos, first_eos_step, tail_before_answer, seconds, batch_rows,
batch_width, cost_basis, factors, git_sha, model_weights`` plus the caller's tags. ``problem`` fingerprints
the question and target (a resume over edited data is refused). ``nfe``, ``steps``,
``positions_computed``, ``flops`` and ``tokens_committed`` are the row's own
(``cost_basis: "row"``, :class:`dlm.stats.SampleStats` ``row_*``: the same at any batch size);
``seconds`` is the batch's sampler wall time divided among its rows (it does depend on the batch
size, recorded as ``batch_rows``; ``batch_width`` is the batch's padded prompt width, so
``1 - prompt_length / batch_width`` is the row's padding). Files written before per-row accounting hold batch-level costs
and are not extended (the committed harness files were converted to ``prediction`` once:
``research/convert_records_v2.py``; ``experiments.reproduce`` reads either name).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from dlm.sample import stop_ids
from dlm.stats import tail_before_answer
from tasks import Problem, extract_flexible, extract_strict, is_correct
from tasks.evaluate import decode_until_stop, left_pad, length_batches, wilson_ci
from harness.records import Expected, check_records, read_records
from harness.results import JsonlLog, encode_question, git_sha, rank_log_paths
from dlm.spec import Sampler, generate
from harness.grids import factors


def existing_records(path: Path) -> dict[str, dict]:
    """id -> record over ``path`` and its per-rank logs (first seen wins), each checked
    (:func:`harness.records.read_records`: a resume never builds on an edited record)."""
    out: dict[str, dict] = {}
    for src in [Path(path), *rank_log_paths(path)]:
        for r in read_records(src):
            out.setdefault(r["id"], r)
    return out


def fingerprint(p: Problem) -> str:
    """Content fingerprint of a problem (question and target): ids are positions in a data file."""
    return hashlib.sha1(json.dumps([p.question, p.target_str]).encode()).hexdigest()[:12]


def check_same_problems(records: dict[str, dict], problems: Sequence[Problem], path) -> None:
    """Every recorded sample must be of the same problem as now (fingerprint, or the target for
    records written before fingerprints); refuses with the first differing id."""
    for p in problems:
        r = records.get(p.id)
        if r is None:
            continue
        same = r["problem"] == fingerprint(p) if "problem" in r else str(r.get("target")) == p.target_str
        if not same:
            raise ValueError(f"--data: {path} holds sample {p.id} of another problem (the data changed since it "
                             f"was written: target {r.get('target')!r}, now {p.target_str!r}); use another --out")


def check_resumable(records: dict[str, dict], path, config_hash: str, weights: Optional[str]) -> None:
    """The samples already recorded must come from this config and these weights (records from
    before weights were recorded carry none and pass on the config hash alone)."""
    hashes = {r.get("config_hash") for r in records.values()} - {config_hash}
    other = {r["model_weights"] for r in records.values() if r.get("model_weights")} - {weights}
    if hashes or (other and weights is not None):
        raise ValueError(f"--out: {path} holds samples of config {sorted(map(str, hashes))} / weights "
                         f"{sorted(other)}, this run is config {config_hash}, weights {weights}: the config or "
                         f"the checkpoint changed; delete that file or use another --out")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batch_generator(device: torch.device, seed: int, first: int) -> torch.Generator:
    """The noise of the batch whose first problem is ``problems[first]``: seeded by the batch, not the call."""
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + first)


def timed_generate(model, ids, mask, strategy: Sampler, generator: torch.Generator,
                   clock: Callable[[], float] = time.perf_counter, **kwargs) -> tuple:
    """:func:`dlm.spec.generate` between two ``clock`` reads, synchronised before and after on CUDA:
    (its output, the call's seconds)."""
    device = ids.device
    _sync(device)
    t0 = clock()
    out = generate(model, ids, mask, strategy, generator=generator, **kwargs)
    _sync(device)
    return out, clock() - t0


def make_records(tokenizer, model, strategy: Sampler, problems: Sequence[Problem], idx: Sequence[int], out, mask,
                 seconds: float, tags: dict) -> list[dict]:
    """Per-sample records of one sampler call over the rows ``idx`` (indices into ``problems``)."""
    P, st = mask.shape[1], out.stats
    stops = stop_ids(model)
    row = {k: getattr(st, f"row_{k}").tolist() for k in ("nfe", "steps", "positions", "flops", "tokens", "refreshes")}
    tails = tail_before_answer(out.sequences[:, P:], out.commit_step, model.config.eos_token_id).tolist()
    first_eos = st.first_eos_step.tolist()
    records = []
    for j, i in enumerate(idx):
        p = problems[i]
        text = decode_until_stop(tokenizer, out.sequences[j, P:].tolist(), stops)
        records.append({
            "id": p.id, "index": i, "strategy": strategy.name, **tags, "problem": fingerprint(p),
            "prompt_length": int(mask[j].sum()), "prediction": text, "extracted": extract_strict(text),
            "extracted_flexible": extract_flexible(text), "target": p.target_str,
            "correct": bool(is_correct(text, p.target)),
            "correct_flexible": bool(is_correct(text, p.target, mode="flexible")),
            "nfe": row["nfe"][j], "steps": row["steps"][j], "positions_computed": row["positions"][j],
            "flops": row["flops"][j], "refreshes": row["refreshes"][j], "tokens_committed": row["tokens"][j],
            "tokens_until_eos": int(st.tokens_until_eos[j]), "first_eos_step": int(first_eos[j]),
            "tail_before_answer": None if math.isnan(tails[j]) else round(tails[j], 4),
            "seconds": seconds, "batch_rows": len(idx), "batch_width": P, "cost_basis": "row",
            "factors": factors(strategy)})
    return records


@torch.no_grad()
def evaluate(model, tokenizer, problems: Sequence[Problem], strategy: Sampler, log: Optional[JsonlLog] = None, *,
             shots: Sequence[Problem] = (), chat_template: bool = False, batch_size: int = 32, seed: int = 0,
             config_hash: Optional[str] = None, weights: Optional[str] = None, tags: Optional[dict] = None,
             indices: Optional[Sequence[int]] = None, done: Optional[dict] = None,
             clock: Callable[[], float] = time.perf_counter, progress: Optional[Callable[[dict], None]] = None,
             callback=None, sort_by_length: bool = False, compile: bool = False) -> list[dict]:
    """Decode ``problems[indices]`` (default: all) with ``strategy``; returns this call's records.

    log: append each batch's records there (a rerun skips the ids already in ``log`` or ``done``;
    a partly recorded batch is rerun as the same batch, so sampled runs resume exactly);
    None keeps them in memory. Each batch's noise comes from a generator seeded with
    ``seed * 1_000_003 + first index`` (the batch, not the call, fixes the tokens).
    tags: recorded with every sample (plus ``config_hash``, ``seed``, ``git_sha``,
    ``model_weights`` when given). progress(tally) is called after every batch; callback(view)
    after every denoising step (:class:`dlm.sample.StepView`, e.g. for a progress display).
    sort_by_length: batch prompts of similar length (longest first, :func:`length_batches`) rather
    than in order; each record keeps its batch's padded width (``batch_width``). compile: the
    model forward under ``torch.compile`` (:mod:`dlm.compiled`: same tokens, the first batches pay
    the compile time in their ``seconds``).
    """
    if not isinstance(strategy, Sampler):
        raise TypeError(f"strategy must be a dlm.spec.Sampler, got {type(strategy).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    done = dict(done or {})
    if log is not None:
        done.update({r["id"]: r for r in log.records})
        check_resumable(done, log.path, config_hash, weights)
        check_records(log.path, enumerate(log.records, 1),  # the log's records are its lines, in order
                      Expected(gen_length=strategy.gen_length, source=f"strategy {strategy.name}"))
    check_same_problems(done, problems, "the results file" if log is None else log.path)
    tags = {**(tags or {}), **({} if config_hash is None else {"config_hash": config_hash}), "seed": seed}
    tail = {} if log is None else {"git_sha": git_sha(), "model_weights": weights}
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = [encode_question(tokenizer, p.question, shots, chat_template) for p in problems]
    limit = model.config.max_seq_len
    longest = max(len(x) for x in prompts)
    if longest + strategy.gen_length > limit:
        raise ValueError(f"the longest prompt ({longest} tokens, {len(shots)} shots) + gen_length "
                         f"{strategy.gen_length} exceeds max_seq_len={limit}")
    order = list(range(len(problems))) if indices is None else list(indices)
    todo = [i for i in order if problems[i].id not in done]
    if todo and any(r.get("cost_basis") != "row" for r in done.values()):
        raise ValueError(f"--out: {'the results' if log is None else log.path} holds samples with batch-level costs "
                         "(written before per-row accounting); extending it would mix the two: use another --out")
    fresh_all: list[dict] = []
    for batch in length_batches([len(prompts[i]) for i in order], batch_size, sort_by_length):
        idx = [order[b] for b in batch]
        if all(problems[i].id in done for i in idx):
            continue
        ids, mask = left_pad([prompts[i] for i in idx], pad)  # (b, P) each
        ids, mask = ids.to(device), mask.to(device)
        out, seconds = timed_generate(model, ids, mask, strategy, batch_generator(device, seed, idx[0]), clock,
                                      callback=callback, compile=compile)  # (b, P + G)
        seconds /= len(idx)
        fresh = [{**r, **tail} for r in make_records(tokenizer, model, strategy, problems, idx, out, mask,
                                                     seconds, tags) if r["id"] not in done]
        if log is not None:
            log.append(fresh)
        done.update((r["id"], r) for r in fresh)
        fresh_all += fresh
        if progress is not None:
            progress({"new": len(fresh), "records": fresh_all})
    return fresh_all


def summary(records: Sequence[dict]) -> dict:
    """accuracy, its Wilson 95% CI, n and the records themselves."""
    k, n = sum(bool(r["correct"]) for r in records), len(records)
    return {"accuracy": k / max(n, 1), "ci": wilson_ci(k, n), "n": n, "records": list(records)}


def score(model, tokenizer, problems: Sequence[Problem], strategy: Sampler, **kwargs) -> dict:
    """:func:`summary` of :func:`evaluate` in memory (no log): held-out accuracy during training."""
    return summary(evaluate(model, tokenizer, problems, strategy, **kwargs))
