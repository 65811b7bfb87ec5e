"""Timing ratios on a shared machine: every function of a comparison timed in the same run, in
interleaved rounds (the order rotated each round, so a burst of load falls on all of them), and
each ratio reported as the median of its per-round ratios with a bootstrap confidence interval.

On the CPU with one torch thread the clock is the thread's CPU time (:func:`clock_name`): all the
work runs on the calling thread, and the time other jobs hold the core is not counted."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence

import torch

from harness.roofline import sync


def clock_name(device: torch.device) -> str:
    """``thread_time`` (CPU time of this thread) on the CPU with one torch thread, else ``perf_counter``."""
    return "thread_time" if device.type == "cpu" and torch.get_num_threads() == 1 else "perf_counter"


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, device: torch.device) -> dict[str, list[float]]:
    """name -> ``repeats`` times (:func:`clock_name`'s clock): one warm-up call of each, then
    ``repeats`` rounds timing every function once, the order rotated by one each round."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    clock = getattr(time, clock_name(device))
    names = list(fns)
    for name in names:
        fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            sync(device)
            t0 = clock()
            fns[name]()
            sync(device)
            times[name].append(clock() - t0)
    return times


def median_ci(values: Sequence[float], level: float = 0.95, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high): the median of ``values`` and a percentile-bootstrap interval of it."""
    xs = sorted(values)
    med = _median(xs)
    rng = random.Random(seed)
    boots = sorted(_median(sorted(rng.choices(xs, k=len(xs)))) for _ in range(n_boot))
    lo = boots[int((1 - level) / 2 * n_boot)]
    hi = boots[min(n_boot - 1, int((1 + level) / 2 * n_boot))]
    return med, lo, hi


def _median(xs: Sequence[float]) -> float:
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def ratio(times: dict[str, list[float]], num: str, den: str) -> dict:
    """``num`` / ``den`` per round: median and 95% bootstrap interval."""
    med, lo, hi = median_ci([a / b for a, b in zip(times[num], times[den])])
    return {"median": med, "ci": [lo, hi], "rounds": len(times[num])}


def fmt(r: dict) -> str:
    """``0.62 [0.58, 0.66]``."""
    return f"{r['median']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (empty where unavailable)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []
