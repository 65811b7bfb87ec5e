"""Point labels that never overlap: a deterministic greedy placer for matplotlib axes.

Each label considers candidate offsets around its point (:func:`candidate_offsets`) whose text box
stays inside the axes and overlaps no label (nor leader line) placed before it, and takes the
cheapest: cost = the offset's distance in points + ``MARKER_COST`` per covered marker
(``obstacles``) + ``SOFT_COST`` per covered error bar (``soft``) + ``AMBIGUOUS_COST`` when,
without a leader line, another marker lies about as near the box as its own point; ties go to the
nearest. Offsets of at least :data:`LEADER_MIN` points get a thin leader line to the point. A
label with no free candidate is skipped (``None``), never drawn over another: the caller says
which. All geometry is in display pixels of the figure as laid out when the placer runs, so lay
the figure out first and save it at the figure's own dpi."""

from __future__ import annotations

import math
from typing import Optional, Sequence

RADII = (6, 12, 20, 30, 44, 62, 84, 110)  # points from the point to the nearest edge of the label
ANGLES = (0, 180, 30, 150, -30, -150, 60, 120, -60, -120, 90, -90, 15, 165, -15, -165, 45, 135, -45, -135,
          75, 105, -75, -105)  # degrees, in order of preference at each radius
LEADER_MIN = 16  # offsets at least this far (points) get a leader line
PAD = 2.0  # pixels kept free around every label box
MARKER_COST, SOFT_COST = 40.0, 6.0  # points of offset a covered marker / error bar is worth
AMBIGUOUS_COST, AMBIGUOUS_MARGIN = 30.0, 8.0  # a label without a leader line about as near another marker


def candidate_offsets() -> list[tuple[float, float, str, str]]:
    """(dx, dy, ha, va) in points, nearest first: 8 directions close to the point, 24 further out.
    The text is aligned so that its edge (or corner) facing the point sits at the offset."""
    out = []
    for r in RADII:
        for a in (ANGLES[:12] if r < 20 else ANGLES):
            c, s = math.cos(math.radians(a)), math.sin(math.radians(a))
            ha = "left" if c > 0.3 else "right" if c < -0.3 else "center"
            va = "bottom" if s > 0.3 else "top" if s < -0.3 else "center"
            out.append((round(r * c, 3), round(r * s, 3), ha, va))
    return out


def box_at(x: float, y: float, w: float, h: float, ha: str, va: str) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) of a w x h text box anchored at display point (x, y) with alignment ha/va."""
    x0 = x - {"left": 0.0, "right": w, "center": w / 2}[ha]
    y0 = y - {"bottom": 0.0, "top": h, "center": h / 2}[va]
    return x0, y0, x0 + w, y0 + h


def boxes_overlap(a, b, pad: float = 0.0) -> bool:
    return a[0] < b[2] + pad and b[0] < a[2] + pad and a[1] < b[3] + pad and b[1] < a[3] + pad


def segment_hits_box(p, q, box) -> bool:
    """Whether the segment p-q meets the box (x0, y0, x1, y1) (Liang-Barsky clipping)."""
    (x, y), (dx, dy) = p, (q[0] - p[0], q[1] - p[1])
    lo, hi = 0.0, 1.0
    for d, a, b in ((dx, box[0] - x, box[2] - x), (dy, box[1] - y, box[3] - y)):
        if d == 0:
            if a > 0 or b < 0:
                return False
            continue
        t0, t1 = sorted((a / d, b / d))
        lo, hi = max(lo, t0), min(hi, t1)
        if lo > hi:
            return False
    return True


def _distance(box, p) -> float:
    return math.hypot(max(box[0] - p[0], 0.0, p[0] - box[2]), max(box[1] - p[1], 0.0, p[1] - box[3]))


def _nearer_other(box, own, others) -> bool:
    """Whether some other marker centre lies about as near the label box as its own point (within
    ``AMBIGUOUS_MARGIN`` pixels) or nearer."""
    d = _distance(box, own) + AMBIGUOUS_MARGIN
    return any(_distance(box, c) < d for c in others)


def marker_boxes(ax, xy: Sequence[tuple[float, float]], radius_px: float) -> list[tuple]:
    """Square display boxes of half-width ``radius_px`` around data points ``xy``."""
    out = []
    for x, y in xy:
        px, py = ax.transData.transform((x, y))
        out.append((px - radius_px, py - radius_px, px + radius_px, py + radius_px))
    return out


def place_labels(ax, xy: Sequence[tuple[float, float]], labels: Sequence[str], styles: Sequence[dict],
                 order: Optional[Sequence[int]] = None, obstacles: Sequence[tuple] = (),
                 soft: Sequence[tuple] = (), leader_color: str = "0.45") -> list:
    """Label point ``xy[i]`` (data coordinates) with ``labels[i]`` in ``styles[i]`` (Text kwargs).

    ``order``: the placing priority (default: from the top down); ``obstacles`` / ``soft``:
    display boxes (x0, y0, x1, y1) a label should avoid, markers first, then error bars. Returns
    the Text objects in the order of ``labels``, ``None`` for a label that found no free place."""
    from matplotlib.transforms import offset_copy

    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    a = ax.get_window_extent(renderer)
    frame = (a.x0 + PAD, a.y0 + PAD, a.x1 - PAD, a.y1 - PAD)
    scale = fig.dpi / 72.0
    cands = candidate_offsets()
    placed: list[tuple] = []
    leaders: list[tuple] = []
    texts: list = [None] * len(labels)
    centers = [((b[0] + b[2]) / 2, (b[1] + b[3]) / 2) for b in obstacles]
    for i in (order if order is not None else sorted(range(len(labels)), key=lambda k: (-xy[k][1], k))):
        probe = ax.text(0, 0, labels[i], **styles[i])
        ext = probe.get_window_extent(renderer)
        probe.remove()
        px, py = ax.transData.transform(xy[i])
        free = []
        for dx, dy, ha, va in cands:
            tx, ty = px + dx * scale, py + dy * scale
            box = box_at(tx, ty, ext.width, ext.height, ha, va)
            if not (frame[0] <= box[0] and box[2] <= frame[2] and frame[1] <= box[1] and box[3] <= frame[3]):
                continue
            if any(boxes_overlap(box, b, PAD) for b in placed) or any(segment_hits_box(p, q, box)
                                                                      for p, q in leaders):
                continue
            leader = ((px, py), (tx, ty)) if math.hypot(dx, dy) >= LEADER_MIN else None
            if leader and any(segment_hits_box(*leader, b) for b in placed):
                continue
            free.append((dx, dy, ha, va, box, leader))
        if not free:
            continue
        others = [c for c in centers if math.hypot(c[0] - px, c[1] - py) > 1.0]
        dx, dy, ha, va, box, leader = min(free, key=lambda c: (
            math.hypot(c[0], c[1]) + MARKER_COST * sum(boxes_overlap(c[4], b) for b in obstacles)
            + SOFT_COST * sum(boxes_overlap(c[4], b) for b in soft)
            + (AMBIGUOUS_COST if c[5] is None and _nearer_other(c[4], (px, py), others) else 0.0)))
        tr = offset_copy(ax.transData, fig=fig, x=dx, y=dy, units="points")
        texts[i] = ax.text(*xy[i], labels[i], transform=tr, ha=ha, va=va, **styles[i])
        placed.append(box)
        if leader:
            leaders.append(leader)
            ax.annotate("", xy=xy[i], xytext=(dx, dy), textcoords="offset points", annotation_clip=False,
                        arrowprops=dict(arrowstyle="-", color=leader_color, lw=0.6, shrinkA=0, shrinkB=3))
    return texts


def overlapping_pairs(texts: Sequence, renderer) -> list[tuple[int, int]]:
    """Pairs (i, j), j < i, of drawn texts whose rendered boxes intersect (None entries skipped)."""
    boxes = [(k, t.get_window_extent(renderer)) for k, t in enumerate(texts) if t is not None]
    return [(i, j) for n, (i, a) in enumerate(boxes) for j, b in boxes[:n] if a.overlaps(b)]
