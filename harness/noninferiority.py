"""Non-inferiority of a table row against its reference row: the paired 95% CI of the accuracy
change and a verdict against a margin declared before the run (``--margin``, recorded per strategy
in the run's ``config.json``; :mod:`harness.report` puts both in every table).

Interval: Newcombe's hybrid score interval for a difference of paired proportions (Newcombe 1998,
Stat. Med. 17:2635-2650, method 10), over the problems both rows ran: the Wilson intervals of the two
accuracies combined with the correlation of the paired outcomes (phi, its numerator reduced by n / 2
as in that paper). Closed form: a verdict does not move with a bootstrap's seed or resample count, and
the interval keeps its width when no problem is discordant (a percentile bootstrap collapses to [0, 0]).

Verdicts, for the CI [lo, hi] of (row - reference) in points and margin M points (the wording of the
CONSORT extension for non-inferiority trials, Piaggio et al. 2012, JAMA 308:2594):

- ``non-inferior``: lo > -M (the row loses less than M points, at 95%);
- ``non-inferior (worse)``: lo > -M and hi < 0 (worse, but by less than M);
- ``inferior``: hi < -M (the whole CI lies below -M);
- ``inconclusive``: otherwise (the CI holds -M; a bound equal to -M counts as holding it);
- ``no margin declared``: the run declared none for the row (or one against another reference).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from harness.records import run_config
from tasks.evaluate import wilson_ci

#: the normal quantile of a two-sided 95% interval
Z95 = statistics.NormalDist().inv_cdf(0.975)
NO_MARGIN = "no margin declared"


def newcombe_paired(a: int, b: int, c: int, d: int, z: float = Z95) -> tuple[float, float, float]:
    """(difference, low, high) of the paired proportions ``p_row - p_ref`` (fractions) from the
    paired 2x2 counts: ``a`` both right, ``b`` the reference only, ``c`` the row only, ``d`` neither."""
    counts = (a, b, c, d)
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in counts) or sum(counts) == 0:
        raise ValueError(f"paired counts must be integers >= 0 with a positive sum, got {counts}")
    n = a + b + c + d
    p_row, p_ref = (a + c) / n, (a + b) / n
    l1, u1 = wilson_ci(a + c, n, z)
    l2, u2 = wilson_ci(a + b, n, z)
    margins = (a + c) * (b + d) * (a + b) * (c + d)
    cross = a * d - b * c
    phi = 0.0 if margins == 0 else (cross - n / 2 if cross > n / 2 else min(cross, 0)) / math.sqrt(margins)
    low = (p_row - p_ref) - math.sqrt(max((p_row - l1) ** 2 + (u2 - p_ref) ** 2
                                          - 2 * phi * (p_row - l1) * (u2 - p_ref), 0.0))
    high = (p_row - p_ref) + math.sqrt(max((p_ref - l2) ** 2 + (u1 - p_row) ** 2
                                           - 2 * phi * (p_ref - l2) * (u1 - p_row), 0.0))
    return p_row - p_ref, low, high


def paired_change(reference: Sequence[dict], row: Sequence[dict]) -> dict:
    """The accuracy change of ``row`` over ``reference`` on their shared problem ids, in points,
    with its Newcombe 95% CI: ``{"change_pp", "change_low_pp", "change_high_pp"}`` (nan: none shared)."""
    right = {r["id"]: bool(r["correct"]) for r in reference}
    pairs = [(right[r["id"]], bool(r["correct"])) for r in row if r["id"] in right]
    if not pairs:
        return {"change_pp": math.nan, "change_low_pp": math.nan, "change_high_pp": math.nan}
    a, b, c = (sum(x and y for x, y in pairs), sum(x and not y for x, y in pairs),
               sum(y and not x for x, y in pairs))
    diff, low, high = newcombe_paired(a, b, c, len(pairs) - a - b - c)
    return {"change_pp": 100 * diff, "change_low_pp": 100 * low, "change_high_pp": 100 * high}


def verdict(low_pp: float, high_pp: float, margin_pp: float | None) -> str:
    """The verdict of a CI [low, high] (points) against the margin (points, > 0; None: none declared)."""
    if margin_pp is None or not math.isfinite(margin_pp):
        return NO_MARGIN
    if not (math.isfinite(low_pp) and math.isfinite(high_pp)):
        return "inconclusive"
    if high_pp < -margin_pp:
        return "inferior"
    if low_pp > -margin_pp:
        return "non-inferior (worse)" if high_pp < 0 else "non-inferior"
    return "inconclusive"


def check_margin(value: float) -> float:
    """``--margin``: points in (0, 100)."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 < value < 100):
        raise ValueError(f"--margin must be a number of accuracy points in (0, 100), got {value!r}")
    return float(value)


def declared(entry: dict, reference: str) -> float | None:
    """The margin (points) a ``config.json`` strategy entry declared against ``reference`` (None: none,
    or one against another row); ValueError when the entry's margin is malformed."""
    m = entry.get("margin")
    if m is None:
        return None
    points = m.get("points") if isinstance(m, dict) else None
    if not isinstance(m, dict) or not isinstance(m.get("reference"), str) or isinstance(points, bool) \
            or not isinstance(points, (int, float)) or not 0 < points < 100:
        raise ValueError(f"expected {{\"points\": P in (0, 100), \"reference\": STRATEGY}}, got {m!r:.80}")
    return float(points) if m["reference"] == reference else None


def declaration(points: float | None, reference: str, name: str) -> dict | None:
    """What ``name``'s ``config.json`` entry records of a run's ``--margin`` against ``reference``
    (None: none declared, or ``name`` is the reference)."""
    return None if points is None or name == reference else {"points": points, "reference": reference}


def check_declared(folder, name: str, margin: dict | None, has_samples: bool) -> None:
    """Refuse a run that would change the margin of a strategy whose samples exist: a margin is fixed
    before a row's first sample (``margin``: ``{"points", "reference"}`` or None)."""
    if not has_samples:
        return
    entry = run_config(folder).get("strategies", {}).get(name)
    before = entry.get("margin") if isinstance(entry, dict) else None
    if before != margin:
        path = Path(folder) / "config.json"
        was = (f"{before.get('points')} points against {before.get('reference')}" if isinstance(before, dict)
               else "none" if before is None else repr(before))
        now = "none" if margin is None else f"{margin['points']} points against {margin['reference']}"
        raise ValueError(f"--margin: {path} declares {was} for {name}, whose samples exist; this run declares "
                         f"{now}. A margin is fixed before a row's first sample: pass the declared one, or "
                         "run into a new --out")


# ------------------------------------------------------------------------------ the table's part
#: the table.csv columns (fields of harness.report.Row)
FIELDS = ("change_pp", "change_low_pp", "change_high_pp", "margin_pp", "verdict")
INTERVAL = "Newcombe's hybrid score interval for paired proportions, 1998, method 10"


def margins(folder, names, reference: str) -> dict[str, float]:
    """strategy -> the margin (points) its ``config.json`` entry declared against ``reference``."""
    entries, out = run_config(folder).get("strategies", {}), {}
    for name in names:
        try:
            m = declared(entries.get(name) or {}, reference)
        except ValueError as e:
            raise ValueError(f"{Path(folder) / 'config.json'}: strategies.{name}.margin: {e}") from None
        if m is not None:
            out[name] = m
    return out


def header(reference: str) -> str:
    return f"change vs {reference}, points [paired 95% CI] | non-inferiority at margin | "


def cells(row, reference: bool) -> str:
    """The two markdown cells of ``row`` (a harness.report.Row); ``reference``: it is the reference row."""
    if reference:
        return "- | - | "
    change = f"{row.change_pp:+.1f} [{row.change_low_pp:+.1f}, {row.change_high_pp:+.1f}]"
    margin = f" at -{row.margin_pp:g}" if math.isfinite(row.margin_pp) else ""
    return f"{change} | {row.verdict}{margin} | "


def words(reference: str) -> str:
    return (f"Change vs {reference}: the row's accuracy minus {reference}'s, in points, on the problems both ran, "
            f"with a paired 95% CI ({INTERVAL}); non-inferiority against the margin M declared before "
            "the run (--margin, the row's entry in config.json): non-inferior when the CI's lower bound is above "
            "-M (worse, too, when its upper bound is below 0), inferior when its upper bound is below -M, "
            "inconclusive otherwise.")
