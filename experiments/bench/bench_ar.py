"""Lean AR decoding (dlm.ar_decode) against its matmuls alone and the ar cache policy through the
one loop, as ratios measured in one run: interleaved rounds, median and 95% bootstrap interval.

    python -m experiments.bench.bench_ar --shape embedded --batches 1 8 --threads 1 --out /tmp/ar
    python -m experiments.bench.bench_ar --shape mid --batches 1 --gen-length 64 --threads 1

Timed per round at every batch size B: ``lean`` (:func:`dlm.ar_decode.ar_decode`, full length),
``loop`` (``generate`` with ``policy="ar"``: the same forwards and tokens through
:func:`dlm.sample.denoise`), ``matmuls`` (the call's matmuls alone at their shapes with the
model's weights: the prefill's, then ``G - 1`` one-column steps', :func:`harness.roofline.matmul_call`)
and ``lean_check1`` (lean with an all-done host read after every step; its EOS set to [MASK],
which is never proposed, so it runs the full length too). Reported: matmuls / lean (the share
of its matmul floor the lean decoder reaches; 1 = nothing but matmuls), matmuls / loop,
loop / lean, and lean_check1 / lean (the cost of a host read per step). ``embedded`` runs the
committed ``dream-ar`` checkpoint on arithmetic prompts, ``mid`` random weights (d 512, 8
layers, vocab 32000) on random 200-token prompts.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import torch

from dlm.ar_decode import ar_decode
from dlm.io import stable_json
from dlm.spec import Sampler, generate
from experiments.bench.bench_load import models_for
from experiments.bench.ratios import clock_name, fmt, interleaved, load_average, ratio
from harness.cli import (
    add_run_args,
    at_least,
    device_of,
    dtype_of,
    markdown_table,
    parser,
    run_main,
    set_threads,
)
from harness.results import atomic_write_text, git_sha
from harness.roofline import matmul_call

RATIOS = (("matmuls", "lean"), ("matmuls", "loop"), ("loop", "lean"), ("lean_check1", "lean"))


def call_matmuls(model, batch: int, prefill: int, gen: int):
    """The matmuls of one AR call alone: the prefill's (``prefill`` columns, one head row per
    sequence), then ``gen - 1`` one-column steps'."""
    first, step = matmul_call(model, batch * prefill, batch), matmul_call(model, batch, batch)

    def run() -> None:
        first()
        for _ in range(gen - 1):
            step()

    return run


def never_stopping(model):
    """``model`` (weights shared) with its EOS set to [MASK], which is never proposed: a stopping
    decode then runs the full length, reading the all-done flag as often as asked."""
    twin = copy.copy(model)
    twin.config = dataclasses.replace(model.config, eos_token_id=model.config.mask_token_id)
    return twin


def contenders(model, twin, ids, mask, sampler: Sampler) -> dict:
    """name -> a call to time (:data:`RATIOS`' names)."""
    gen = sampler.gen_length
    prefill = ids.shape[1] + int(model.config.shift_logits)
    return {"lean": lambda: ar_decode(model, ids, mask, gen),
            "loop": lambda: generate(model, ids, mask, sampler),
            "matmuls": call_matmuls(model, ids.shape[0], prefill, gen),
            "lean_check1": lambda: ar_decode(twin, ids, mask, gen, stop_at_eos=True, check_every=1)}


def bench(shape: str, batches, gen: int, repeats: int, device, dtype) -> dict:
    from tasks.evaluate import left_pad

    models, tok, pool = models_for(shape, device, dtype)
    model = models["ar"]
    pad = tok.pad_token_id if tok is not None else 0
    sampler = Sampler.of("ar", policy="ar", gen_length=gen, block_length=1)
    twin = never_stopping(model)
    rows = []
    for B in batches:
        ids, mask = left_pad([pool[i % len(pool)] for i in range(B)], pad)
        ids, mask = ids.to(device), mask.to(device)
        lean = ar_decode(model, ids, mask, gen)
        loop = generate(model, ids, mask, sampler)
        if not torch.equal(lean.sequences, loop.sequences):
            raise RuntimeError(f"lean AR tokens differ from the ar policy's at batch {B}")
        load = load_average()
        times = interleaved(contenders(model, twin, ids, mask, sampler), repeats, device)
        row = {"batch": B, "prompt_len": ids.shape[1], "load_before": load, "load_after": load_average(),
               "seconds": {k: sorted(v)[len(v) // 2] for k, v in times.items()}, "times": times,
               "ratios": {f"{a}/{b}": ratio(times, a, b) for a, b in RATIOS}}
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("batch", "seconds", "load_before")}
                         | {k: fmt(v) for k, v in row["ratios"].items()}), flush=True)
    return {"shape": shape, "gen_length": gen, "repeats": repeats, "device": str(device), "dtype": str(dtype),
            "threads": torch.get_num_threads(), "clock": clock_name(device), "rows": rows, "git_sha": git_sha()}


def report(res: dict, out: Path) -> None:
    name = f"ar_{res['shape']}_g{res['gen_length']}"
    table = [[r["batch"], r["prompt_len"], f"{r['seconds']['lean']:.3f}", f"{r['seconds']['loop']:.3f}",
              f"{r['seconds']['matmuls']:.3f}", *(fmt(r["ratios"][f"{a}/{b}"]) for a, b in RATIOS),
              " ".join(map(str, r["load_before"]))] for r in res["rows"]]
    md = [f"# Lean AR decoding against its matmuls: {res['shape']} shape, gen {res['gen_length']}", "",
          (f"{res['device']} {res['dtype']}, {res['threads']} thread(s), {res['repeats']} interleaved rounds ({res['clock']}); git "
           f"{res['git_sha']}. Seconds: medians; ratios: median of the per-round ratios [95% bootstrap interval]."),
          "",
          *markdown_table(["batch", "prompt", "lean s", "loop s", "matmuls s", *(f"{a} / {b}" for a, b in RATIOS),
                           "load avg"], table)]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{name}.md", "\n".join(md) + "\n")
    atomic_write_text(out / f"{name}.json", stable_json(res, indent=1))


def main(argv=None) -> dict:
    p = parser("experiments.bench.bench_ar", __doc__, paragraphs=2)
    add_run_args(p, model=None, model_help="unused (the shape picks the model)", dtype="float32", seed=False)
    count = at_least(1)
    p.add_argument("--shape", default="embedded", choices=["embedded", "mid", "tiny"], metavar="SHAPE",
                   help="embedded (dream-ar), mid or tiny (random weights; default embedded)")
    p.add_argument("--batches", type=count, nargs="+", default=[1, 8], metavar="B", help="batch sizes (default 1 8)")
    p.add_argument("--gen-length", type=count, default=256, metavar="G", help="answer tokens (default 256)")
    p.add_argument("--repeats", type=count, default=7, metavar="N", help="interleaved rounds (default 7)")
    p.add_argument("--out", default=None, metavar="DIR", help="write <out>/ar_<shape>_g<G>.md and .json")
    a = p.parse_args(argv)
    set_threads(a.threads)
    device = device_of(a.device)
    res = bench(a.shape, sorted(set(a.batches)), a.gen_length, a.repeats, device, dtype_of(a.dtype, device))
    if a.out:
        report(res, Path(a.out))
    return res


if __name__ == "__main__":
    run_main(main)
