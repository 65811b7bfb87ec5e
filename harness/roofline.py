"""The roofline cost model the benchmarks report against (Williams et al. 2009): a call's time
floor is

    floor = max(FLOPs / P, bytes / W),

with P the matmul peak and W the memory bandwidth *measured on the machine the benchmark runs on*
(:func:`machine`), FLOPs counted by the loop (:func:`dlm.stats.forward_flops` per forward) and
bytes the weights read once per forward plus the K/V each forward reads. ``measured / floor``
(or its inverse) says how far a strategy is from what the hardware allows; a FLOP ratio alone
misses that a narrow window at batch 1 is bound by streaming the weights.

The floor charges every matmul at the n x n GEMM's peak. :func:`matmul_seconds` measures what the
BLAS actually takes for one forward's matmuls at that forward's shape (a 32-row window's GEMMs do
not reach the peak), so ``matmuls / measured`` splits the gap to the floor into the BLAS's share
(matmuls at narrow shapes) and the loop's (everything else).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(fn, device: torch.device, reps: int = 5) -> float:
    """The best of ``reps`` timed calls of ``fn`` after one warm-up."""
    fn()
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def machine(device: torch.device, dtype: torch.dtype, n: int = 1024, mib: int = 256) -> dict:
    """Measured matmul peak (FLOP/s, an n x n GEMM in ``dtype``) and copy bandwidth (bytes/s read
    + written, a ``mib`` MiB float32 copy): the best of 5 timed runs after one warm-up."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    x = torch.empty(mib * 2**20 // 4, device=device, dtype=torch.float32)
    y = torch.empty_like(x)
    return {"peak_flops": 2 * n**3 / best_seconds(lambda: a @ b, device),
            "bandwidth": 2 * x.numel() * 4 / best_seconds(lambda: y.copy_(x), device)}


def matmul_call(model, rows: int, head_rows: int):
    """A function running one forward's matmuls alone at its shape: every ``nn.Linear`` of the
    blocks, in model order, on ``rows`` random input rows (batch x window columns), then the LM
    head on ``head_rows`` rows (none for 0), with the model's own weights."""
    weights = [m.weight for m in model.layers.modules() if isinstance(m, torch.nn.Linear)]
    head = model.head_weight()
    dev, dtype = head.device, head.dtype
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], device=dev, dtype=dtype) for w in weights}
    h = torch.randn(head_rows, head.shape[1], device=dev, dtype=dtype)

    @torch.no_grad()
    def forward_matmuls() -> None:
        for w in weights:
            F.linear(inputs[w.shape[1]], w)
        if head_rows:
            F.linear(h, head)

    return forward_matmuls


def matmul_seconds(model, rows: int, head_rows: int, reps: int = 3) -> float:
    """Time of one forward's matmuls alone at its shape (:func:`matmul_call`), best of ``reps``.
    Attention, norms, RoPE and the sampler are left out: ``matmul_seconds / measured`` is the
    share of a forward the BLAS sets at this shape."""
    return best_seconds(matmul_call(model, rows, head_rows), model.head_weight().device, reps)


def forward_bytes(model, batch: int, keys: int) -> int:
    """Bytes one forward must move at least: every weight once, and the K/V of ``keys`` columns
    per row and layer."""
    cfg = model.config
    elem = next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters()) * elem
    return weights + batch * keys * 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * elem


def floor_seconds(flops: float, n_bytes: float, hw: dict) -> float:
    """max(FLOPs / peak, bytes / bandwidth)."""
    return max(flops / hw["peak_flops"], n_bytes / hw["bandwidth"])


def call_floor(model, stats, batch: int, hw: dict) -> float:
    """Floor of one sampler call, summed over its forwards by kind (``stats.forward_kinds``:
    ``(queries, keys, head columns) -> [n, seconds, FLOPs per row]``)."""
    return sum(n * floor_seconds(batch * flops, forward_bytes(model, batch, keys), hw)
               for (_q, keys, _h), (n, _s, flops) in stats.forward_kinds.items())


def kinds(model, stats, batch: int, hw: dict, matmuls: bool = False) -> list[dict]:
    """Per forward kind: count, measured seconds per forward, floor per forward, floor / measured;
    with ``matmuls`` also the forward's matmuls timed alone (:func:`matmul_seconds`) and their
    share of the measured time."""
    out = []
    for (q, keys, head), (n, sec, flops) in sorted(stats.forward_kinds.items(), key=lambda kv: (-kv[0][0], -kv[0][2])):
        floor = floor_seconds(batch * flops, forward_bytes(model, batch, keys), hw)
        row = {"queries": q, "keys": keys, "head": head, "forwards": n, "seconds_each": sec / n, "floor_each": floor,
               "floor_over_measured": floor * n / sec if sec else None}
        if matmuls:
            mm = matmul_seconds(model, batch * q, batch * head)
            row.update(matmul_each=mm, matmul_over_measured=mm * n / sec if sec else None)
        out.append(row)
    return out


def matmuls_of_call(model, stats, batch: int):
    """A function running one sampler call's matmuls alone: each forward kind of
    ``stats.forward_kinds`` (its count of times) at its shape (:func:`matmul_call`, ``batch`` rows
    per window column). Its time is the call's matmul floor: what the BLAS takes at the call's
    shapes, without attention, norms, RoPE and the loop."""
    counts: dict[tuple[int, int], int] = {}
    for (q, _keys, head), (n, _s, _f) in stats.forward_kinds.items():
        counts[(q, head)] = counts.get((q, head), 0) + n
    calls = [(n, matmul_call(model, batch * q, batch * head)) for (q, head), n in sorted(counts.items())]

    def run() -> None:
        for n, fn in calls:
            for _ in range(n):
                fn()

    return run
