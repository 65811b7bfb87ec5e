"""The Pareto front of a results table and the fastest row not significantly less accurate than
its reference (:mod:`harness.report` puts both under every table)."""

from __future__ import annotations

import math
from typing import Optional, Sequence

from harness.plots import pareto_front


def _fmt(x: float, spec: str) -> str:
    return format(x, spec) if math.isfinite(x) else "-"


def _front(rows: Sequence, base, alpha: float) -> dict:
    front = sorted(pareto_front([(r.tokens_per_second, r.accuracy) for r in rows]),
                   key=lambda i: rows[i].tokens_per_second)
    kept = [r for r in rows if base is not None and (r is base or r.accuracy >= base.accuracy
                                                    or not r.mcnemar_p <= alpha)]
    best = max(kept, key=lambda r: r.tokens_per_second, default=None)
    return {"front": [rows[i].strategy for i in front], "fastest_not_worse": best.strategy if best else None}


def frontier(rows: Sequence, reference: Optional[str], alpha: float = 0.05) -> dict:
    """The Pareto front (no row both faster and more accurate) in throughput order, and the fastest
    row whose accuracy is not significantly below the reference row's (exact McNemar p > ``alpha``,
    or at least as accurate); when BD3-LM rows (another model) are present, ``same_model``: the
    same over the other rows, the reference's model alone."""
    base = next((r for r in rows if r.strategy == reference), None)
    out = {**_front(rows, base, alpha), "alpha": alpha}
    same = [r for r in rows if (r.factors or {}).get("kind") != "bd3lm"]
    if len(same) < len(rows):
        out["same_model"] = _front(same, base, alpha)
    return out


def _render(info: dict, by: dict, reference: str, alpha: float, title: str) -> list:
    lines = ["", f"## {title}", "",
             "| strategy | accuracy % | tokens/s | speed-up | McNemar p |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {100 * by[n].accuracy:.1f} | {by[n].tokens_per_second:.1f} | {_fmt(by[n].speedup, '.2f')}x | "
              f"{_fmt(by[n].mcnemar_p, '.2g')} |" for n in info["front"]]
    if info["fastest_not_worse"]:
        r = by[info["fastest_not_worse"]]
        lines += ["", f"Fastest row not significantly less accurate than {reference} (exact McNemar "
                      f"p > {alpha}, or as accurate): **{r.strategy}**, {100 * r.accuracy:.1f}%, "
                      f"{_fmt(r.speedup, '.2f')}x."]
    return lines


def render_frontier(rows: Sequence, meta: dict) -> str:
    info, by, ref = meta["frontier"], {r.strategy: r for r in rows}, meta["speedup_reference"]
    lines = _render(info, by, ref, info["alpha"], "Pareto frontier (accuracy vs tokens/s)")
    if "same_model" in info:
        lines += _render(info["same_model"], by, ref, info["alpha"],
                         "Pareto frontier of the reference's model alone (without BD3-LM's model)")
    return "\n".join(lines) + "\n"
