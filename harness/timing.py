"""Interleaved timing: a row's speed-up over the baseline as a median ratio with a 95% bootstrap CI.

The problems are cut into batches once (as :func:`harness.evaluate.evaluate` does); for each repeat,
for each batch, the baseline and every row decode that same batch back to back (the order rotated
by one per repeat, so a drift in the machine's speed does not favour a position), each call timed
with ``clock`` between synchronisations (:func:`harness.evaluate.timed_generate`). One *cell*
(repeat, batch, strategy) records its seconds, the tokens up to and including each row's first EOS
(as the harness's throughput counts them), a digest of the generated tokens and the machine's
state. A folder holds one line-up of strategies (a resumed run completes it; another is refused).
Every repeat of a batch must give the same tokens, and the same as a per-sample record of
the strategy given for that batch's layout (same rows, same padded width): timing never changes
tokens. Speed-up of a (repeat, batch) = baseline seconds per token / row seconds per token; a row
reports the median over its (repeat, batch) pairs with a percentile bootstrap CI of the median
(the pairs resampled with replacement).
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dlm.io import round_floats
from dlm.spec import Sampler
from harness.evaluate import batch_generator, make_records, timed_generate
from harness.results import JsonlLog, encode_question, git_sha
from tasks import Problem
from tasks.evaluate import left_pad, length_batches

#: what a row whose CI lies above its FLOP ideal is flagged with
ABOVE_IDEAL = "above its FLOP ideal: timing not trustworthy"


@dataclass(frozen=True)
class Entrant:
    """One strategy to time: its sampler bound to its model, and the per-sample records to match."""

    strategy: Sampler
    model: torch.nn.Module
    tokenizer: object
    chat_template: bool
    config_hash: str
    recorded: dict = field(default_factory=dict)  # id -> per-sample record of this strategy ({}: none)
    source: str = "-"  # where ``recorded`` comes from, for messages

    @property
    def name(self) -> str:
        return self.strategy.name


# ------------------------------------------------------------------------------------ machine
def clock_name(device: torch.device) -> str:
    """``thread_time`` (CPU time of this thread) on the CPU with one torch thread, else
    ``perf_counter``: all the work then runs on the calling thread, and the time other jobs hold
    the core is not counted."""
    return "thread_time" if device.type == "cpu" and torch.get_num_threads() == 1 else "perf_counter"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else :func:`platform.processor`)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages ([] where the system gives none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine(device: torch.device) -> dict:
    """What a cell's time depends on besides the code: CPU model, torch threads, device."""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"cpu": cpu_model(), "threads": torch.get_num_threads(), "device": str(device), "gpu": gpu}


# ------------------------------------------------------------------------------------ schedule
def order(names: Sequence[str], repeat: int) -> list[str]:
    """The strategies' order within every batch of ``repeat``: ``names`` rotated left by ``repeat``."""
    k = repeat % len(names)
    return list(names[k:]) + list(names[:k])


def schedule(names: Sequence[str], batches: int, repeats: int) -> list[tuple[int, int, str]]:
    """(repeat, batch, strategy) of every call, in the order they run."""
    return [(r, b, s) for r in range(repeats) for b in range(batches) for s in order(names, r)]


def cell_id(repeat: int, batch: int, name: str) -> str:
    return f"r{repeat}/b{batch}/{name}"


def batches_of(entrant: Entrant, problems: Sequence[Problem], shots, batch_size: int, sort: bool) -> list[list[int]]:
    """The batches (indices into ``problems``) the harness would run ``entrant``'s prompts in."""
    lengths = [len(encode_question(entrant.tokenizer, p.question, shots, entrant.chat_template)) for p in problems]
    return length_batches(lengths, batch_size, sort)


def check_cells(cells: Sequence[dict], entrants: Sequence[Entrant], batches: Sequence[Sequence[int]], path) -> None:
    """The cells already written must be of this line-up, these strategies' configs and these
    batches (before any compute): a strategy added later would not alternate with the baseline."""
    hashes = {e.name: e.config_hash for e in entrants}
    for c in cells:
        if c.get("lineup") != list(hashes):
            raise ValueError(f"--out: {path} holds cell {c['id']} of a run timing {c.get('lineup')}, this run times "
                             f"{list(hashes)}: each set of strategies is timed in its own --out")
        name, b = c.get("strategy"), c.get("batch")
        if name in hashes and c.get("config_hash") != hashes[name]:
            raise ValueError(f"--out: {path} holds cell {c['id']} of config {c.get('config_hash')}, this run is "
                             f"config {hashes[name]} of {name}: delete that file or use another --out")
        if name in hashes and (not isinstance(b, int) or not 0 <= b < len(batches) or c.get("indices") != batches[b]):
            raise ValueError(f"--out: {path} holds cell {c['id']} over problems {c.get('indices')}, this run's batch "
                             f"{b} is {batches[b] if isinstance(b, int) and 0 <= b < len(batches) else 'absent'} "
                             "(another --limit, --batch-size or --sort-prompts): delete that file or use another --out")


def _digest(tokens: torch.Tensor) -> str:
    return hashlib.sha1(tokens.cpu().numpy().astype(np.int64).tobytes()).hexdigest()[:16]


def _check_recorded(e: Entrant, records: Sequence[dict], width: int) -> int:
    """How many of this call's samples were compared with ``e.recorded`` (same batch layout); a
    differing sample is a ValueError naming the file and the problem."""
    checked = 0
    for r in records:
        old = e.recorded.get(r["id"])
        if old is None or old.get("batch_rows") != r["batch_rows"] or old.get("batch_width") != width:
            continue
        for key in ("prediction", "tokens_until_eos"):
            if old.get(key) != r[key]:
                raise ValueError(f"{e.source}: sample {r['id']} holds {key} {old.get(key)!r:.80}, the timed call gave "
                                 f"{r[key]!r:.80}: timing changed the tokens")
        checked += 1
    return checked


@torch.no_grad()
def run_cells(entrants: Sequence[Entrant], problems: Sequence[Problem], log: JsonlLog, *, shots=(),
              batches: Sequence[Sequence[int]], repeats: int, seed: int = 0,
              clock: Callable[[], float] = time.perf_counter, compile: bool = False,
              progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Time every (repeat, batch, strategy) not yet in ``log`` in :func:`schedule` order, appending
    each cell as it completes; returns every cell of the log. ``entrants[0]`` is the baseline."""
    by_name = {e.name: e for e in entrants}
    check_cells(log.records, entrants, batches, log.path)
    digests = {(c["batch"], c["strategy"]): c["outputs"] for c in log.records}
    sha = git_sha()
    for r, b, name in schedule(list(by_name), len(batches), repeats):
        if cell_id(r, b, name) in log.done:
            continue
        e, idx = by_name[name], list(batches[b])
        device = next(e.model.parameters()).device
        pad = e.tokenizer.pad_token_id if e.tokenizer.pad_token_id is not None else e.tokenizer.eos_token_id
        ids, mask = left_pad([encode_question(e.tokenizer, problems[i].question, shots, e.chat_template)
                              for i in idx], pad)
        ids, mask = ids.to(device), mask.to(device)
        before, where = load_average(), machine(device)
        out, seconds = timed_generate(e.model, ids, mask, e.strategy, batch_generator(device, seed, idx[0]), clock,
                                      compile=compile)
        after = load_average()
        records = make_records(e.tokenizer, e.model, e.strategy, problems, idx, out, mask, seconds / len(idx), {})
        digest = _digest(out.sequences[:, mask.shape[1]:])
        if digests.setdefault((b, name), digest) != digest:
            raise ValueError(f"{log.path}: batch {b} of {name} gave other tokens in repeat {r} than before "
                             f"(digest {digest}, recorded {digests[(b, name)]}): timing changed the tokens")
        cell = {"id": cell_id(r, b, name), "repeat": r, "batch": b, "position": order(list(by_name), r).index(name),
                "strategy": name, "lineup": list(by_name), "config_hash": e.config_hash, "indices": idx, "rows": len(idx),
                "batch_width": int(mask.shape[1]), "seconds": seconds,
                "tokens": sum(x["tokens_until_eos"] for x in records), "outputs": digest,
                "checked": _check_recorded(e, records, int(mask.shape[1])), **where,
                "load_before": before, "load_after": after, "git_sha": sha}
        log.append([cell])
        if progress is not None:
            progress(cell)
    return list(log.records)


# ------------------------------------------------------------------------------------ statistics
def median_ci(values: Sequence[float], n_resamples: int = 2000, seed: int = 0,
              level: float = 0.95) -> tuple[float, float, float]:
    """(median, CI low, CI high): the percentile bootstrap CI of the median of ``values``."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {x.shape}")
    rng = np.random.default_rng(seed)
    medians = np.median(x[rng.integers(0, x.size, size=(n_resamples, x.size))], axis=1)  # (n_resamples,)
    a = (1 - level) / 2
    return float(np.median(x)), float(np.quantile(medians, a)), float(np.quantile(medians, 1 - a))


def ratios(cells: Sequence[dict], baseline: str, row: str) -> list[float]:
    """Baseline seconds per token / ``row`` seconds per token of every (repeat, batch) both ran, in order."""
    at = {(c["repeat"], c["batch"], c["strategy"]): c for c in cells}
    out = []
    for (r, b, name), c in sorted(at.items()):
        base = at.get((r, b, baseline))
        if name == row and base is not None:
            out.append((base["seconds"] / base["tokens"]) / (c["seconds"] / c["tokens"]))
    return out


def _rate(cells: Sequence[dict], name: str) -> float:
    """Median tokens per second of ``name``'s cells."""
    return float(np.median([c["tokens"] / c["seconds"] for c in cells if c["strategy"] == name]))


@dataclass(frozen=True)
class TimingRow:
    strategy: str
    speedup: float  # median over (repeat, batch) cells of the baseline's seconds/token over this row's
    ci_low: float
    ci_high: float
    cells: int
    repeats: int
    tokens_per_second: float  # median over this row's cells
    baseline_tokens_per_second: float
    flop_ideal: float = float("nan")  # from the per-sample records (nan: none)
    flag: str = ""


def timing_rows(cells: Sequence[dict], baseline: str, flop_ideal: dict | None = None, n_resamples: int = 2000,
                seed: int = 0) -> list[TimingRow]:
    """One row per strategy other than ``baseline`` that shares a (repeat, batch) with it."""
    rows = []
    for name in dict.fromkeys(c["strategy"] for c in cells):
        values = ratios(cells, baseline, name)
        if name == baseline or not values:
            continue
        mid, lo, hi = median_ci(values, n_resamples, seed)
        ideal = (flop_ideal or {}).get(name, float("nan"))
        repeats = len({c["repeat"] for c in cells if c["strategy"] == name})
        rows.append(TimingRow(**round_floats({
            "strategy": name, "speedup": mid, "ci_low": lo, "ci_high": hi, "cells": len(values), "repeats": repeats,
            "tokens_per_second": _rate(cells, name), "baseline_tokens_per_second": _rate(cells, baseline),
            "flop_ideal": ideal, "flag": ABOVE_IDEAL if lo > ideal else ""})))  # nan ideal: never flagged
    return rows


def conditions(cells: Sequence[dict]) -> dict:
    """The machine and load the cells ran under, in schedule order: every CPU / threads / device
    seen, the load average before the first cell and after the last, and its range over the cells."""
    first = min(cells, key=lambda c: (c["repeat"], c["batch"], c["position"]))
    last = max(cells, key=lambda c: (c["repeat"], c["batch"], c["position"]))
    ones = [c["load_before"][0] for c in cells if c["load_before"]] + [c["load_after"][0] for c in cells
                                                                       if c["load_after"]]
    seen = {k: sorted({str(c.get(k)) for c in cells}) for k in ("cpu", "threads", "device", "gpu", "git_sha")}
    return {**seen, "load_start": first["load_before"], "load_end": last["load_after"],
            "load_1m_range": [min(ones), max(ones)] if ones else [],
            "repeats": len({c["repeat"] for c in cells}), "batches": len({c["batch"] for c in cells}),
            "rows_per_batch": sorted({c["rows"] for c in cells})}


# ------------------------------------------------------------------------------------ tables
def flop_ideals(recorded: dict[str, dict], baseline: str, ids: Sequence[str]) -> dict[str, float]:
    """strategy -> FLOP ideal (:func:`harness.report.table_rows`' ``flop_ideal``) over the problems
    ``ids``, for every strategy whose per-sample records (id -> record) cover them all, as the baseline's do."""
    from harness.report import table_rows

    runs = {name: [recs[i] for i in ids] for name, recs in recorded.items() if all(i in recs for i in ids)}
    if baseline not in runs:
        return {}
    return {r.strategy: r.flop_ideal for r in table_rows(runs, baseline, n_resamples=1)}


def _x(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:.2f}x"


def render(rows: Sequence[TimingRow], meta: dict) -> str:
    """``timing.md``: the conditions, then one line per row."""
    c = meta["conditions"]
    load = "/".join(map(str, c["load_start"])) or "-", "/".join(map(str, c["load_end"])) or "-"
    method = (f"git {' '.join(c['git_sha'])}; model `{meta['model']}`; {meta['problems']} problems of {meta['data']} "
              f"({meta['first_id']} to {meta['last_id']}, {meta['num_fewshot']}-shot), batch size {meta['batch_size']} "
              f"({c['batches']} batches), {c['repeats']} repeats, clock `{meta['clock']}`. In each (repeat, batch) "
              "cell the baseline and every row decode the "
              "same batch back to back, the order rotated by one per repeat; speed-up = the baseline's seconds per "
              "token / the row's (tokens up to and including each sample's first EOS), the median over cells with a "
              f"95% percentile bootstrap CI ({meta['bootstrap']['resamples']} resamples of the cells, seed "
              f"{meta['bootstrap']['seed']}). FLOP ideal: the baseline's FLOPs per token over the row's, from the "
              "per-sample records of the same problems (- : none); a row whose CI lies above it is flagged.")
    gpu = "" if c["gpu"] == ["None"] else f" ({' / '.join(c['gpu'])})"
    where = (f"Machine: CPU {' / '.join(c['cpu'])}; torch threads {' / '.join(c['threads'])}; device "
             f"{' / '.join(c['device'])}{gpu}; load average (1/5/15 min) {load[0]} before the first cell, {load[1]} "
             f"after the last (1 min: {' to '.join(map(str, c['load_1m_range'])) or '-'} over the cells).")
    lines = [f"# Interleaved timing: speed-up over `{meta['baseline']}`", "", method, "", where, "",
             "| strategy | speed-up [95% CI] | cells | repeats | tokens/s | baseline tokens/s | FLOP ideal | note |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r.strategy} | {r.speedup:.2f}x [{r.ci_low:.2f}, {r.ci_high:.2f}] | {r.cells} | "
                     f"{r.repeats} | {r.tokens_per_second:.1f} | {r.baseline_tokens_per_second:.1f} | "
                     f"{_x(r.flop_ideal)} | {r.flag} |")
    return "\n".join(lines) + "\n"
