"""Factorial ablation of a harness table (``ablation.md`` / ``ablation.csv`` of :mod:`harness.report`):
main effects of cache x parallel decoding x stop_at_eos x block size on log throughput and on
accuracy, from an additive least-squares fit over the factor cells of the baseline / fastdllm rows."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dlm.io import round_floats
from harness.frontier import _fmt

FACTORS = ("cache", "parallel", "stop_at_eos", "block_length")


@dataclass(frozen=True)
class Effect:
    factor: str
    level: str
    reference: str
    log_speedup: float
    speedup: float
    accuracy_pp: float
    cells: int  # factor cells at this level


#: decimal places the ablation fit keeps (its coefficients are log speed-ups and accuracy points)
FIT_DECIMALS = 9


def factorial_effects(rows: Sequence, baseline: str) -> tuple[list[Effect], dict]:
    """Main effects of each factor level vs the reference level (the baseline row's level) on
    log throughput and on accuracy, from an additive least-squares fit over the non-bd3lm rows.
    Factors with one level are left out; returns ([], info) when the design is not identifiable."""
    usable = [r for r in rows if r.factors and r.factors.get("kind") != "bd3lm"
              and r.tokens_per_second > 0 and math.isfinite(r.tokens_per_second)]
    # rows with identical factor levels (e.g. baseline_semiar and abl_nocache_topk_noeos_semiar)
    # form one cell: the mean of their log throughputs / accuracies, so the design stays balanced
    groups: dict[tuple, list] = {}
    for r in usable:
        groups.setdefault(tuple(str(r.factors[f]) for f in FACTORS), []).append(r)
    cells = list(groups)  # level tuples
    info = {"cells": len(cells), "rows": len(usable), "r2": float("nan"), "factors": []}
    if len(cells) < 2:
        return [], info
    base_row = next((r for r in usable if r.strategy == baseline), usable[0])
    info["reference_row"] = base_row.strategy  # may differ from ``baseline`` (absent): said in the file
    base = tuple(str(base_row.factors[f]) for f in FACTORS)
    columns, labels = [np.ones(len(cells))], []
    for k, f in enumerate(FACTORS):
        levels = sorted({c[k] for c in cells}, key=lambda v: (v != base[k], v))
        if len(levels) < 2:
            continue
        info["factors"].append(f)
        for lv in levels[1:]:
            columns.append(np.array([float(c[k] == lv) for c in cells]))
            labels.append((f, lv, levels[0], sum(c[k] == lv for c in cells)))
    X = np.stack(columns, axis=1)  # (cells, 1 + dummies)
    if np.linalg.matrix_rank(X) < X.shape[1]:
        info["note"] = "design not identifiable (confounded factors)"
        return [], info
    y = np.array([np.mean([math.log(r.tokens_per_second) for r in groups[c]]) for c in cells])
    acc = np.array([np.mean([100 * r.accuracy for r in groups[c]]) for c in cells])
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    gamma, *_ = np.linalg.lstsq(X, acc, rcond=None)
    resid = y - X @ beta
    ss = float(((y - y.mean()) ** 2).sum())
    # rounded at the source to FIT_DECIMALS places: lstsq's last bits differ between CPUs / BLAS
    # builds (an effect that is 0 comes out as +-1e-14), and the tables print these numbers
    beta, gamma = (np.round(v, FIT_DECIMALS) + 0.0 for v in (beta, gamma))
    info["r2"] = round_floats(round(1 - float((resid ** 2).sum()) / ss, FIT_DECIMALS) + 0.0 if ss > 0 else 1.0)
    effects = [Effect(f, lv, ref, *round_floats([float(b), math.exp(b), float(g)]), n)
               for (f, lv, ref, n), b, g in zip(labels, beta[1:], gamma[1:])]
    return effects, info



def _reference_words(info: dict, baseline: str) -> str:
    ref = info.get("reference_row", baseline)
    return f"the {baseline} row's" if ref == baseline else f"no {baseline} row: the {ref} row's instead"


def render_ablation(effects: Sequence[Effect], info: dict, meta: dict) -> tuple[str, str]:
    lines = ["# Factorial ablation: where the speed-up comes from", "",
             (f"git {' '.join(meta['run_git_shas'])}; additive least-squares fit of log(tokens/s) and of "
             f"accuracy over {info['cells']} factor cells ({info.get('rows', 0)} baseline/fastdllm rows; "
             f"factors: {', '.join(info['factors']) or '-'}; "
             f"R^2 of log throughput {_fmt(info['r2'], '.3f')}). Main effect = coefficient of the level vs "
             f"the reference level ({_reference_words(info, meta['baseline'])}); x speed-up = exp(log speed-up)."), ""]
    if not effects:
        lines.append(f"No identifiable factorial design in these rows. {info.get('note', '')}".rstrip())
    else:
        lines += ["| factor | level | vs | log speed-up | x speed-up | accuracy change (pp) | cells at level |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {e.factor} | {e.level} | {e.reference} | {e.log_speedup:+.3f} | {e.speedup:.2f}x | "
                  f"{round(e.accuracy_pp, 1) + 0.0:+.1f} | {e.cells} |" for e in effects]  # + 0.0: no -0.0
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["factor", "level", "reference", "log_speedup", "speedup", "accuracy_pp", "cells"])
    for e in effects:
        w.writerow([e.factor, e.level, e.reference, *(round(v, 6) + 0.0 for v in (e.log_speedup, e.speedup,
                                                                                     e.accuracy_pp)), e.cells])
    return "\n".join(lines) + "\n", buf.getvalue()
