"""Timing ratios on a shared machine: every function of a comparison timed in the same run, in
interleaved rounds (the order rotated each round, so a burst of load falls on all of them), and
each ratio reported as the median of its per-round ratios with a bootstrap confidence interval.

On the CPU with one torch thread the clock is the thread's CPU time (:func:`clock_name`): all the
work runs on the calling thread, and the time other jobs hold the core is not counted."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from harness.roofline import sync
from harness.timing import clock_name, load_average, median_ci

__all__ = ["clock_name", "fmt", "interleaved", "load_average", "median_ci", "ratio"]


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, device: torch.device,
                warmup: bool = True) -> dict[str, list[float]]:
    """name -> ``repeats`` times (:func:`clock_name`'s clock): one warm-up call of each (unless the
    caller has just made one: ``warmup=False``), then ``repeats`` rounds timing every function
    once, the order rotated by one each round."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    clock = getattr(time, clock_name(device))
    names = list(fns)
    for name in names if warmup else ():
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


def ratio(times: dict[str, list[float]], num: str, den: str) -> dict:
    """``num`` / ``den`` per round: median and 95% bootstrap interval."""
    med, lo, hi = median_ci([a / b for a, b in zip(times[num], times[den])])
    return {"median": med, "ci": [lo, hi], "rounds": len(times[num])}


def fmt(r: dict) -> str:
    """``0.62 [0.58, 0.66]``."""
    return f"{r['median']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"
