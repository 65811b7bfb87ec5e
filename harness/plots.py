"""The accuracy-vs-throughput plot of a GSM8K harness run (:mod:`harness.report`), read at a
glance: every point belongs to one legend entry (its cache mode, one colour each), the Pareto front
over all rows and the named rows carry labels that never overlap (:mod:`harness.plot_labels`),
every CI lies inside the axes, x ticks are plain numbers on a log scale, and the title names the
data, model(s), generation length and shots from the run's config."""

from __future__ import annotations

import json
import os
import math
from pathlib import Path
from typing import Sequence

from harness.plot_labels import marker_boxes, place_labels

DPI = 130
CACHE_COLORS = {"none": "tab:blue", "prefix": "tab:green", "dual": "tab:orange", "exact": "tab:purple",
                "delayed": "tab:brown", "adaptive": "tab:pink", "adaptive_nb": "tab:olive"}
OTHER_COLORS = ("tab:cyan", "tab:gray", "darkkhaki", "teal")
FRONT_COLOR = "tab:red"
ALL_LABELS_UP_TO = 16  # runs with more rows label only the overall front and the rows not named sw_*
DATA_WORDS = {"arith": "procedural GSM8K-format arithmetic", "gsm8k": "GSM8K test set"}


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points (throughput, accuracy) that no other point dominates (>= in both,
    > in one), sorted by throughput."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _span(values: Sequence, fmt=str) -> str:
    vals = sorted(set(values))
    return fmt(vals[0]) if len(vals) == 1 else f"{fmt(vals[0])}–{fmt(vals[-1])}" if all(
        isinstance(v, (int, float)) for v in vals) else "/".join(fmt(v) for v in vals)


def describe_run(rows: Sequence, meta: dict) -> tuple[str, str]:
    """(data words, details) for the title, from ``meta['run_config']`` (each row's recorded
    config: data, model, num_fewshot, gen_length) and the rows' n; ("", details) when the run
    recorded no config."""
    cfgs = [(meta.get("run_config") or {}).get(r.strategy, {}).get("config") or {} for r in rows]
    data = sorted({str(c["data"]) for c in cfgs if c.get("data") is not None})
    words = ", ".join(DATA_WORDS.get(d, f"problems of {'/'.join(Path(d).parts[-2:])}") for d in data)
    models: dict[str, list[str]] = {}
    for r, c in zip(rows, cfgs):
        if c.get("model"):
            models.setdefault(Path(str(c["model"])).name, []).append(r.strategy)
    ranked = sorted(models.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    parts = [" + ".join([m for m, _ in ranked[:1]] + [f"{m} ({names[0] if len(names) == 1 else f'{len(names)} rows'})"
                                                      for m, names in ranked[1:]])] if ranked else []
    gens = [c["strategy"]["gen_length"] for c in cfgs if (c.get("strategy") or {}).get("gen_length")]
    shots = [c["num_fewshot"] for c in cfgs if c.get("num_fewshot") is not None]
    if gens:
        parts.append(f"gen {_span(gens)}")
    if shots:
        parts.append(f"{_span(shots)}-shot")
    parts.append(f"n = {_span([r.n for r in rows])} per row")
    return words, " · ".join(parts)


def cache_groups(rows: Sequence) -> dict[str, list[int]]:
    """cache mode -> row indices, in first-seen order (rows with no factors: "not recorded")."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(str((r.factors or {}).get("cache", "not recorded")), []).append(i)
    return groups


def _short(sha: str) -> str:
    """A git SHA cut to 10 hex digits, its ``-dirty`` suffix kept (the PNG's metadata keeps it whole)."""
    head, _, tail = sha.partition("-")
    return head[:10] + (f"-{tail}" if tail else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _color(cache: str, k: int) -> str:
    return CACHE_COLORS.get(cache, OTHER_COLORS[k % len(OTHER_COLORS)])


def _draw_groups(ax, rows: Sequence, pts: list, groups: dict, crowded: bool) -> dict:
    """Per cache mode: CIs, markers and (with 2+ rows on it) the dashed front of its own rows."""
    handles = {}
    for k, (cache, idx) in enumerate(groups.items()):
        color = _color(cache, k)
        xs, ys = [pts[i][0] for i in idx], [pts[i][1] for i in idx]
        err = [[pts[i][1] - 100 * rows[i].ci_low for i in idx], [100 * rows[i].ci_high - pts[i][1] for i in idx]]
        ax.errorbar(xs, ys, yerr=err, fmt="none", ecolor=color, elinewidth=1.0, capsize=2.5,
                    alpha=0.3 if crowded else 0.55, zorder=1)
        marks, = ax.plot(xs, ys, "o", ls="none", ms=5.5, color=color, mec="white", mew=0.6, zorder=3)
        own = [idx[j] for j in pareto_front([pts[i] for i in idx])]
        line = None
        if len(own) > 1:
            line, = ax.plot([pts[i][0] for i in own], [pts[i][1] for i in own], "--", color=color, lw=1.2, zorder=2)
        handles[cache] = (marks, line, len(own))
    return handles


def _style_axes(ax, rows: Sequence, pts: list) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    low, high = min(100 * r.ci_low for r in rows), max(100 * r.ci_high for r in rows)
    pad = max(3.0, 0.08 * (high - low))
    ax.set_ylim(max(-2.0, low - pad), min(102.0, high + pad))
    xs = [x for x, _ in pts]
    ax.set_xscale("log")
    ax.set_xlim(min(xs) / 2.2, max(xs) * 3.0)  # room for the labels on both sides
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("throughput (tokens until EOS / s, log scale)")
    ax.set_ylabel("accuracy % (95% bootstrap CI)")
    ax.grid(True, which="both", alpha=0.25)


def _legend(fig, groups: dict, handles: dict, front: list, y: float):
    """One entry per cache mode (its markers and dashed own front, counted per mode) and one for
    the front over all rows, below the axes; returns (legend, its texts)."""
    from matplotlib.lines import Line2D

    artists, texts = [], []
    for cache, (marks, line, n_own) in handles.items():
        artists.append((marks, line) if line is not None else marks)
        texts.append(f"cache {cache}: {_plural(len(groups[cache]), 'row')}"
                     + (f"; dashed: its own front ({_plural(n_own, 'row')})" if line is not None else ""))
    artists.append((Line2D([], [], color=FRONT_COLOR, lw=1.5),
                    Line2D([], [], ls="none", marker="o", ms=10, mfc="none", mec=FRONT_COLOR, mew=1.6)))
    texts.append(f"Pareto front over all rows ({_plural(len(front), 'row')}, bold labels)")
    legend = fig.legend(artists, texts, loc="lower center", ncol=2, fontsize=8, frameon=False,
                        bbox_to_anchor=(0.5, y), handlelength=3.0, columnspacing=2.0)
    return legend, texts


def _label(ax, rows: Sequence, pts: list, front: list, crowded: bool) -> dict:
    """Row index -> its label (None: no free place) for the front and, in a crowded run, the rows
    not named ``sw_*`` (every row otherwise); the front first, then from the top down."""
    named = [i for i, r in enumerate(rows) if not crowded or i in front or not r.strategy.startswith("sw_")]
    order = sorted(range(len(named)), key=lambda k: (named[k] not in front, -pts[named[k]][1], named[k]))
    box = dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.7)
    styles = [dict(fontsize=8, fontweight="bold" if i in front else "normal", color="black" if i in front else "0.2",
                   zorder=5, parse_math=False, bbox=box) for i in named]
    bars = []
    for r, (x, _) in zip(rows, pts):
        (x0, y0), (x1, y1) = ax.transData.transform([(x, 100 * r.ci_low), (x, 100 * r.ci_high)])
        bars.append((x0 - 2.5, y0, x1 + 2.5, y1))
    got = place_labels(ax, [pts[i] for i in named], [rows[i].strategy for i in named], styles, order=order,
                       obstacles=marker_boxes(ax, pts, 4.5), soft=bars)
    return dict(zip(named, got))


def draw_pareto(rows: Sequence, meta: dict) -> dict:
    """The figure and what it draws: ``{"fig", "ax", "groups" (cache -> row indices), "handles"
    (cache -> (marker line, dashed own-front line or None, rows on its own front)), "front" (row
    indices), "labels" (row index -> Text, None when no free place), "legend", "legend_texts"}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(r.tokens_per_second, 100 * r.accuracy) for r in rows]
    front = pareto_front(pts)
    groups = cache_groups(rows)
    crowded = len(rows) > ALL_LABELS_UP_TO
    bottom_in = 0.62 + 0.2 * math.ceil((len(groups) + 1) / 2) + 0.22  # x label, legend rows, footer
    width_in, axes_h_in, top_in = 9.0, 4.7, 0.62
    height_in = top_in + axes_h_in + bottom_in
    fig = plt.figure(figsize=(width_in, height_in), dpi=DPI)
    ax = fig.add_axes((0.8 / width_in, bottom_in / height_in, (width_in - 1.05) / width_in, axes_h_in / height_in))
    handles = _draw_groups(ax, rows, pts, groups, crowded)
    fx, fy = [pts[i][0] for i in front], [pts[i][1] for i in front]
    ax.plot(fx, fy, "-", color=FRONT_COLOR, lw=1.5, zorder=2.5)
    ax.plot(fx, fy, "o", ls="none", ms=10, mfc="none", mec=FRONT_COLOR, mew=1.6, zorder=4)
    _style_axes(ax, rows, pts)
    words, details = describe_run(rows, meta)
    fig.text(0.5, 1 - 0.2 / height_in, f"Accuracy vs throughput: {words or 'data not recorded'}", ha="center",
             va="center", fontsize=12)
    fig.text(0.5, 1 - 0.45 / height_in, details, ha="center", va="center", fontsize=9, color="0.25")
    legend, legend_texts = _legend(fig, groups, handles, front, 0.22 / height_in)
    labels = _label(ax, rows, pts, front, crowded)
    notes = [f"git {' '.join(_short(s) for s in meta['run_git_shas'])}"]
    sweep = len(rows) - len(labels)
    if sweep:
        notes.append(f"{sweep} sweep rows (sw_*) off the front are unlabelled: each is named in table.md")
    unlabelled = [rows[i].strategy for i, t in labels.items() if t is None]
    if unlabelled:
        notes.append(f"no room to label: {', '.join(unlabelled)}")
    fig.text(0.01, 0.06 / height_in, " · ".join(notes), fontsize=6.5, color="0.4", va="bottom")
    return {"fig": fig, "ax": ax, "groups": groups, "handles": handles, "front": front, "labels": labels,
            "legend": legend, "legend_texts": legend_texts}


def plot_pareto(rows: Sequence, path: Path, meta: dict) -> None:
    """Write :func:`draw_pareto`'s figure to ``path`` (atomically; fixed dpi, the run's git SHAs
    and config hashes as the PNG's only Description, no timestamp)."""
    import matplotlib.pyplot as plt

    drawn = draw_pareto(rows, meta)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.png")  # a killed run's: dlm.io.leftover_temps
    described = json.dumps({k: meta[k] for k in ("run_git_shas", "config_hashes")})
    drawn["fig"].savefig(tmp, dpi=DPI, metadata={"Description": described})
    plt.close(drawn["fig"])
    tmp.replace(path)
