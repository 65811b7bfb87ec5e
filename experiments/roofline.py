"""The roofline cost model the benchmarks report against (Williams et al. 2009): a call's time
floor is

    floor = max(FLOPs / P, bytes / W),

with P the matmul peak and W the memory bandwidth *measured on the machine the benchmark runs on*
(:func:`machine`), FLOPs counted by the loop (:func:`dlm.stats.forward_flops` per forward) and
bytes the weights read once per forward plus the K/V each forward reads. ``measured / floor``
(or its inverse) says how far a strategy is from what the hardware allows; a FLOP ratio alone
misses that a narrow window at batch 1 is bound by streaming the weights.
"""

from __future__ import annotations

import time

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine(device: torch.device, dtype: torch.dtype, n: int = 1024, mib: int = 256) -> dict:
    """Measured matmul peak (FLOP/s, an n x n GEMM in ``dtype``) and copy bandwidth (bytes/s read
    + written, a ``mib`` MiB float32 copy): the best of 5 timed runs after one warm-up."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    x = torch.empty(mib * 2**20 // 4, device=device, dtype=torch.float32)
    y = torch.empty_like(x)

    def best(fn, reps=5) -> float:
        fn()
        times = []
        for _ in range(reps):
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times.append(time.perf_counter() - t0)
        return min(times)

    return {"peak_flops": 2 * n**3 / best(lambda: a @ b), "bandwidth": 2 * x.numel() * 4 / best(lambda: y.copy_(x))}


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


def kinds(model, stats, batch: int, hw: dict) -> list[dict]:
    """Per forward kind: count, measured seconds per forward, floor per forward, floor / measured."""
    out = []
    for (q, keys, head), (n, sec, flops) in sorted(stats.forward_kinds.items(), key=lambda kv: (-kv[0][0], -kv[0][2])):
        floor = floor_seconds(batch * flops, forward_bytes(model, batch, keys), hw)
        out.append({"queries": q, "keys": keys, "head": head, "forwards": n, "seconds_each": sec / n, "floor_each": floor,
                    "floor_over_measured": floor * n / sec if sec else None})
    return out
