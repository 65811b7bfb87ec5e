"""Where a forward's time goes: each forward kind of the samplers timed whole against its matmuls
alone (same shapes, same weights), the rest being everything that is not a matmul (RoPE, norms,
attention over the cache, copies, masks), as ratios measured in one run: interleaved rounds,
median and 95% bootstrap interval.

    python -m experiments.bench.breakdown --shape embedded mid --batches 1 8 --threads 1 --out /tmp/breakdown

Forward kinds, each the call its policy makes (prompt P, answer G, block L = 32; the window at
the first answer block, ``lo = P``), on a cache filled by one committing forward over every column:

- ``full``: the uncached forward over all ``T = P + G`` columns, the LM head on the block (LLaDA's
  baseline, :class:`dlm.llada.FullSequence`);
- ``prefix``: columns ``[lo, T)`` over the cache, the head on the block (Fast-dLLM's prefix cache);
- ``dual``: the block ``[lo, lo + L)`` over all ``T`` cached keys (Fast-dLLM's dual cache);
- ``exact``: a BD3-LM block of 16 over the keys up to its end, block-causal mask
  (:mod:`bd3lm.policy`'s cached step);
- ``ar``: one column over the ``P + G / 2`` keys before it, causal mask (:mod:`dlm.ar_decode`'s step).

``embedded`` runs the committed checkpoints (``llada-arith`` for full/prefix/dual,
``bd3lm-arith-16`` for exact, ``dream-ar`` for ar), ``mid`` random weights (d 512, 8 layers, vocab
32000); prompts are random ids. ``whole / matmuls`` = 1 means nothing but matmuls.

What the rest is made of, measured beside it: ``attention``, the forward's attention calls alone
(SDPA at its query, key and mask shapes, once per layer: attention over the cache is part of the
rest, though its core is two batched matmuls), with ``whole / (matmuls + attention)``;
``aten ops``, the operators one forward dispatches
(views included), and ``narrow``, the same forward kind on the same architecture at the narrowest
width (d_model = 2 x heads, MLP 8, random weights): every op and Python call of the forward with
almost no arithmetic per column. What is left at that width is the ops' dispatch and the work that
does not scale with the width (attention's softmax over queries x keys per head). Where
``narrow`` is close to ``rest``, faster kernels cannot shrink the rest: only fewer ops (fusion,
compilation) can.

``--compile`` adds the forward compiled (``torch.compile`` of the model's body, as
:mod:`dlm.compiled` does) with static shapes (one graph per window: what bucketed windows would
give) and with dynamic shapes (one graph for all), each timed in the same rounds: compiled
speed-up = eager / compiled, the first call's seconds (the compile), whether the compiled forward's
argmax equals the eager one's at every column, and the page faults per call of both (a compiled
forward that copies the cache buffer faults in fresh pages on every call: :meth:`KVCache.layer_kv`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dlm.attention import attend, block_causal_mask, block_ids, causal_mask
from dlm.cache import KVCache
from dlm.io import stable_json
from dlm.model import Transformer
from dlm.stats import forward_flops
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

KINDS = ("full", "prefix", "dual", "exact", "ar")
MODEL_OF = {"full": "baseline", "prefix": "baseline", "dual": "dual_threshold", "exact": "bd3lm", "ar": "ar"}
BLOCK, BD3_BLOCK = 32, 16


@dataclasses.dataclass(frozen=True)
class Forward:
    """One forward kind at its shape: ``run(body=None)`` runs it once (``body``: a stand-in for
    the model's, e.g. compiled; :meth:`dlm.model.Transformer.forward`)."""
    run: Callable
    queries: int
    head: int  # LM-head columns
    keys: int
    mask: Optional[torch.Tensor]
    flops: int  # per row, :func:`dlm.stats.forward_flops`


def forward_of(kind: str, model, B: int, P: int, G: int) -> Forward:
    """The forward of ``kind`` on random ids with a cache filled over all ``P + G`` columns."""
    cfg = model.config
    T, lo = P + G, P
    g = torch.Generator().manual_seed(0)
    dev = model.embed.weight.device
    x = torch.randint(4, cfg.vocab_size - 2, (B, T), generator=g).to(dev)
    pos = torch.arange(T, device=dev).expand(B, T)
    cos, sin = model.rope_tables(pos, model.embed.weight.dtype)
    cache = KVCache.for_model(model, B, T)
    with torch.no_grad():
        model(x, cache=cache, commit=True, logits_slice=slice(0, 0), rope=(cos, sin))

    def call(start, stop, mask, head, cached=True):
        rope = (cos[:, :, start:stop], sin[:, :, start:stop])
        kw = {"cache": cache, "start": start} if cached else {}

        @torch.no_grad()
        def run(body=None):
            return model(x[:, start:stop], attn_mask=mask, logits_slice=head, rope=rope, body=body, **kw)

        q, n_head = stop - start, len(range(stop - start)[head])
        keys = cache.key_len(start, q) if cached else q  # (the dual window reads every cached column)
        flops = forward_flops(cfg.num_params(include_embeddings=False), cfg.n_layers, cfg.d_model, q, keys,
                              cfg.vocab_size, n_head)
        return Forward(run, q, n_head, keys, mask, flops)

    if kind == "full":
        return call(0, T, None, slice(lo, lo + BLOCK), cached=False)
    if kind == "prefix":
        return call(lo, T, None, slice(0, BLOCK))
    if kind == "dual":
        return call(lo, lo + BLOCK, None, slice(0, BLOCK))
    if kind == "exact":
        hi = lo + BD3_BLOCK
        ids = block_ids(hi, BD3_BLOCK, P, device=dev)
        cache.truncate(lo)
        return call(lo, hi, block_causal_mask(ids[lo:hi], ids[:hi]), slice(0, BD3_BLOCK))
    if kind == "ar":
        c = P + G // 2
        cache.truncate(c)
        return call(c, c + 1, causal_mask(torch.arange(c, c + 1, device=dev), c + 1), slice(0, 1))
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def attention_call(model: Transformer, f: Forward, B: int):
    """A function running one forward's attention alone: :func:`dlm.attention.attend` (SDPA) on
    random (B, Hq, queries, D) queries over (B, Hkv, keys, D) keys and values with the forward's
    mask, once per layer."""
    cfg, w = model.config, model.embed.weight
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, n, cfg.head_dim, generator=g).to(w.device, w.dtype)
               for h, n in ((cfg.n_heads, f.queries), (cfg.n_kv_heads, f.keys), (cfg.n_kv_heads, f.keys)))

    @torch.no_grad()
    def run() -> None:
        for _ in range(cfg.n_layers):
            attend(q, k, v, f.mask)

    return run


def narrow(model: Transformer) -> Transformer:
    """``model``'s architecture (layers, heads, layout, vocabulary) at d_model = 2 x heads and
    MLP 8, random weights: the same ops per forward with almost no arithmetic."""
    cfg = dataclasses.replace(model.config, d_model=2 * model.config.n_heads, mlp_hidden=8)
    weight = model.embed.weight
    with torch.device(weight.device):
        small = Transformer(cfg)
    small.reset_parameters(generator=torch.Generator(weight.device).manual_seed(0))
    return small.to(weight.dtype).eval()


class OpCount(TorchDispatchMode):
    """Counts the aten operators dispatched inside it (``n``), views included."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def aten_ops(fn) -> int:
    """How many aten operators one call of ``fn`` dispatches."""
    with OpCount() as count:
        fn()
    return count.n


def repeated(fn, n: int):
    def run() -> None:
        for _ in range(n):
            fn()

    return run


#: compile modes: static shapes (a graph per window), dynamic shapes (one graph)
COMPILE_MODES = ("static", "dynamic")


def page_faults(fn, calls: int = 3) -> Optional[float]:
    """Minor page faults of this thread per call of ``fn`` (None where the OS has no per-thread
    count): a call that faults in fresh pages allocates buffers it did not reuse."""
    import resource

    who = getattr(resource, "RUSAGE_THREAD", None)
    if who is None:
        return None
    before = resource.getrusage(who).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(who).ru_minflt - before) / calls


def compiled_arm(model: Transformer, run, mode: str) -> tuple:
    """(``run`` through a fresh ``torch.compile`` of ``model``'s body in ``mode``
    (:data:`COMPILE_MODES`); a record of its first call's seconds, whether its argmax equals the
    eager forward's at every column, and the page faults per call of eager and compiled)."""
    import time

    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {mode!r}")
    torch._dynamo.reset()
    comp = torch.compile(model.body, dynamic=mode == "dynamic")

    def fn():
        return run(body=comp)

    eager = run()
    t0 = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t0
    return fn, {"first_call_s": first, "argmax_equal": bool(torch.equal(out.argmax(-1), eager.argmax(-1))),
                "page_faults_per_call": {"eager": page_faults(run), "compiled": page_faults(fn)}}


def breakdown(shape: str, batches, prompt: int, gen: int, repeats: int, device, dtype, kinds=KINDS,
              target_s: float = 0.05, compile_modes=()) -> dict:
    """Rows (kind, batch): whole, matmul, attention and narrow-width seconds per forward (medians),
    whole / matmuls, rest / whole, attention / rest, whole / (matmuls + attention) and narrow / rest
    with 95% intervals, the forward's aten op count, its FLOPs and whole seconds per FLOP.
    Each timed call repeats the forward to last ~``target_s``."""
    import time

    models, _tok, _pool = models_for(shape, device, dtype)
    narrows = {id(m): narrow(m) for m in models.values()}
    rows = []
    for kind in kinds:
        model = models[MODEL_OF[kind]]
        for B in batches:
            f = forward_of(kind, model, B, prompt, gen)
            run, thin = f.run, forward_of(kind, narrows[id(model)], B, prompt, gen).run
            mm, att = matmul_call(model, B * f.queries, B * f.head), attention_call(model, f, B)
            ops = aten_ops(run)
            run()
            t0 = time.perf_counter()
            run()
            n = max(1, min(200, round(target_s / max(time.perf_counter() - t0, 1e-6))))
            load = load_average()
            arms = {"whole": repeated(run, n), "matmuls": repeated(mm, n), "attention": repeated(att, n),
                    "narrow": repeated(thin, n)}
            compiled = {}
            for mode in compile_modes:
                fn, compiled[mode] = compiled_arm(model, run, mode)
                arms[mode] = repeated(fn, n)
            times = {k: [t / n for t in v] for k, v in interleaved(arms, repeats, device).items()}
            rest = {"rest": [w - m for w, m in zip(times["whole"], times["matmuls"])],
                    "gemms": [m + a for m, a in zip(times["matmuls"], times["attention"])], **times}
            med = {k: sorted(v)[repeats // 2] for k, v in times.items()}
            row = {"kind": kind, "batch": B, "queries": f.queries, "head": f.head, "keys": f.keys,
                   "forwards_per_call": n, "load": load, "aten_ops": ops, "flops": B * f.flops,
                   "ns_per_flop": 1e9 * med["whole"] / (B * f.flops), "whole_s": med["whole"],
                   "matmuls_s": med["matmuls"], "attention_s": med["attention"], "narrow_s": med["narrow"],
                   "whole_over_matmuls": ratio(times, "whole", "matmuls"), "rest_over_whole": ratio(rest, "rest", "whole"),
                   "attention_over_rest": ratio(rest, "attention", "rest"),
                   "whole_over_gemms": ratio(rest, "whole", "gemms"),
                   "narrow_over_rest": ratio(rest, "narrow", "rest"), "times": times,
                   "compiled": {m: {"speedup": ratio(times, "whole", m), **c} for m, c in compiled.items()}}
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("kind", "batch", "queries", "whole_s", "matmuls_s", "load")}
                             | {"whole/matmuls": fmt(row["whole_over_matmuls"]),
                                "rest/whole": fmt(row["rest_over_whole"]),
                                "narrow/rest": fmt(row["narrow_over_rest"])}), flush=True)
    return {"shape": shape, "prompt_len": prompt, "gen_length": gen, "repeats": repeats, "device": str(device),
            "dtype": str(dtype), "threads": torch.get_num_threads(), "clock": clock_name(device), "rows": rows, "git_sha": git_sha()}


def table(res: dict) -> list[str]:
    """The markdown breakdown table of :func:`breakdown`'s result (with the compiled columns when
    it timed them)."""
    modes = list(res["rows"][0]["compiled"]) if res["rows"] else []
    body = [[r["kind"], r["batch"], f"{r['queries']} x {r['head']}", f"{1e3 * r['whole_s']:.2f}",
             f"{1e3 * r['matmuls_s']:.2f}", f"{1e3 * (r['whole_s'] - r['matmuls_s']):.2f}",
             fmt(r["whole_over_matmuls"]), fmt(r["rest_over_whole"]), f"{1e3 * r['attention_s']:.2f}",
             fmt(r["attention_over_rest"]), fmt(r["whole_over_gemms"]), r["aten_ops"], f"{1e3 * r['narrow_s']:.2f}",
             fmt(r["narrow_over_rest"]), f"{1e3 * r['ns_per_flop']:.2f}",
             *[fmt(r["compiled"][m]["speedup"]) + ("" if r["compiled"][m]["argmax_equal"] else " (argmax differs)")
               for m in modes],
             " ".join(map(str, r["load"]))]
            for r in res["rows"]]
    return markdown_table(["forward", "batch", "queries x head", "whole ms", "matmuls ms", "rest ms",
                           "whole / matmuls", "rest / whole", "attention ms", "attention / rest",
                           "whole / (matmuls + attention)", "aten ops", "narrow ms", "narrow / rest", "ps / FLOP",
                           *[f"eager / compiled {m}" for m in modes], "load avg"], body)


def main(argv=None) -> list[dict]:
    p = parser("experiments.bench.breakdown", __doc__, paragraphs=2)
    add_run_args(p, model=None, model_help="unused (the shape picks the models)", dtype="float32", seed=False)
    count = at_least(1)
    p.add_argument("--shape", nargs="+", default=["embedded", "mid"], choices=["embedded", "mid", "tiny"],
                   metavar="SHAPE", help="embedded (checkpoints), mid, tiny (random; default embedded mid)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS), metavar="KIND",
                   help=f"of {' '.join(KINDS)} (default all)")
    p.add_argument("--batches", type=count, nargs="+", default=[1, 8], metavar="B", help="batch sizes (default 1 8)")
    p.add_argument("--prompt-len", type=count, default=200, metavar="P", help="prompt columns (default 200)")
    p.add_argument("--gen-length", type=count, default=256, metavar="G",
                   help="answer columns, a multiple of 32 (default 256)")
    p.add_argument("--repeats", type=count, default=7, metavar="N", help="interleaved rounds (default 7)")
    p.add_argument("--compile", action="store_true",
                   help="also time the forward compiled with static and with dynamic shapes")
    p.add_argument("--out", default=None, metavar="DIR", help="write <out>/breakdown_<shape>.md and .json")
    a = p.parse_args(argv)
    if a.gen_length % BLOCK:
        raise ValueError(f"--gen-length must be a multiple of {BLOCK}, got {a.gen_length}")
    set_threads(a.threads)
    device = device_of(a.device)
    out = []
    for shape in a.shape:
        res = breakdown(shape, sorted(set(a.batches)), a.prompt_len, a.gen_length, a.repeats, device,
                        dtype_of(a.dtype, device), a.kinds, compile_modes=COMPILE_MODES if a.compile else ())
        out.append(res)
        if a.out:
            md = [f"# Forward time against its matmuls: {shape} shape, prompt {a.prompt_len}, gen {a.gen_length}", "",
                  (f"{res['device']} {res['dtype']}, {res['threads']} thread(s), {res['repeats']} interleaved rounds ({res['clock']}); "
                   f"git {res['git_sha']}. Times per forward: medians; ratios: median of the per-round ratios [95% "
                   "bootstrap interval]; rest = whole - matmuls; attention = the forward's SDPA calls alone at their "
                   "shapes and masks; narrow = the same forward at d_model = 2 x heads, "
                   "MLP 8 (its ops, almost no arithmetic); ps / FLOP = whole / the forward's FLOPs "
                   "(dlm.stats.forward_flops: what the FLOP ideals charge alike)."
                   + (" eager / compiled: the body under torch.compile with static shapes (a graph per window) and "
                      "with dynamic shapes (one graph), timed in the same rounds; argmax equal to eager's unless "
                      "marked." if a.compile else "")), "", *table(res)]
            Path(a.out).mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(a.out) / f"breakdown_{shape}.md", "\n".join(md) + "\n")
            atomic_write_text(Path(a.out) / f"breakdown_{shape}.json", stable_json(res, indent=1))
    return out


if __name__ == "__main__":
    run_main(main)
