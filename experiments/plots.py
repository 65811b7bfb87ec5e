"""The accuracy-vs-throughput plot of a GSM8K harness run (:mod:`experiments.report`): every CI inside
the axes, plain-number log ticks, labels placed so that they do not overlap."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points (throughput, accuracy) that no other point dominates (>= in both,
    > in one), sorted by throughput."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


OFFSETS = [(6, 4), (6, -11), (-6, 4), (-6, -11), (0, 10), (0, -16), (10, 16), (10, -22), (-10, 16), (-10, -22),
           (14, 26), (14, -32), (-14, 26), (-14, -32)]  # points; negative x: text right-aligned


def place_labels(ax, xy: Sequence[tuple[float, float]], labels: Sequence[str], styles: Sequence[dict]) -> list:
    """Annotate each point with its label at the first offset of ``OFFSETS`` whose box overlaps
    no label placed before it and stays inside the axes (the last offset when none is free).
    Points are labelled from the top down. Returns the text objects, in the order of ``labels``."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    axes_box = ax.get_window_extent(renderer)
    placed, texts = [], [None] * len(labels)
    for i in sorted(range(len(labels)), key=lambda k: -xy[k][1]):
        for dx, dy in OFFSETS:
            t = ax.annotate(labels[i], xy[i], textcoords="offset points", xytext=(dx, dy),
                            ha="left" if dx >= 0 else "right", **styles[i])
            box = t.get_window_extent(renderer)
            inside = axes_box.x0 <= box.x0 and box.x1 <= axes_box.x1 and axes_box.y0 <= box.y0 and box.y1 <= axes_box.y1
            if inside and not any(box.overlaps(b) for b in placed):
                break
            if (dx, dy) != OFFSETS[-1]:
                t.remove()
        placed.append(t.get_window_extent(renderer))
        texts[i] = t
    return texts


def plot_pareto(rows: Sequence, path: Path, meta: dict) -> None:
    """Accuracy vs throughput: the axes hold every point with its whole CI, x ticks are plain
    numbers on a log scale, labels do not overlap (:func:`place_labels`). A cache policy with
    several points (a sweep) gets its own front as a dashed curve; with more than 16 rows only the
    front across all and the rows outside the sweep (not ``sw_*``) are labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    pts = [(r.tokens_per_second, 100 * r.accuracy) for r in rows]
    front = set(pareto_front(pts))
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for i, r in enumerate(rows):
        x, y = pts[i]
        yerr = [[y - 100 * r.ci_low], [100 * r.ci_high - y]]
        on = i in front
        ax.errorbar([x], [y], yerr=yerr, fmt="o", ms=7 if on else 5, capsize=3,
                    color="tab:red" if on else "tab:gray", alpha=1.0 if on else (0.6 if len(rows) <= 16 else 0.25))
    groups: dict = {}  # one curve per cache policy when it has several points (a sweep): its own front
    for i, r in enumerate(rows):
        groups.setdefault((r.factors or {}).get("cache"), []).append(i)
    for c, (cache, idx) in enumerate(sorted((k, v) for k, v in groups.items() if k is not None and len(v) > 1)):
        curve = [idx[j] for j in pareto_front([pts[i] for i in idx])]
        ax.plot([pts[i][0] for i in idx], [pts[i][1] for i in idx], ".", color=f"C{c % 10}", ms=4, alpha=0.7)
        ax.plot([pts[i][0] for i in curve], [pts[i][1] for i in curve], "--", color=f"C{c % 10}", lw=1.2,
                label=f"cache {cache}: its front ({len(idx)} points)")
    order = sorted(front, key=lambda i: pts[i][0])
    ax.plot([pts[i][0] for i in order], [pts[i][1] for i in order], "-", color="tab:red", lw=1.5,
            label="Pareto front")
    low, high = min(100 * r.ci_low for r in rows), max(100 * r.ci_high for r in rows)
    pad = max(3.0, 0.08 * (high - low))
    ax.set_ylim(max(-2.0, low - pad), min(102.0, high + pad))
    xs = [x for x, _ in pts]
    ax.set_xscale("log")
    ax.set_xlim(min(xs) / 1.8, max(xs) * 2.5)  # room for the labels on both sides
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("throughput (tokens until EOS / s, log scale)")
    ax.set_ylabel("accuracy % (95% bootstrap CI)")
    ax.set_title("GSM8K: accuracy vs throughput")
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    styles = [dict(fontsize=8, fontweight="bold", color="black") if i in front
              else dict(fontsize=7, color="dimgray") for i in range(len(rows))]
    named = [i for i, r in enumerate(rows) if len(rows) <= 16 or i in front or not r.strategy.startswith("sw_")]
    place_labels(ax, [pts[i] for i in named], [rows[i].strategy for i in named], [styles[i] for i in named])
    fig.text(0.01, 0.005, f"git {' '.join(meta['run_git_shas'])}", fontsize=6, color="gray")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    described = json.dumps({k: meta[k] for k in ("run_git_shas", "config_hashes")})
    fig.savefig(tmp, dpi=130, metadata={"Description": described})
    plt.close(fig)
    tmp.replace(path)
